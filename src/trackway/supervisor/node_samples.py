"""The shim's node samples into the ledger: each attempt's process-tree memory, CPU time and GPUs as metric series.

The shim appends one line every 10 s to `spool/node-samples.jsonl` (executors/node_sampler.py).
The supervisor stores what is new as series of the run, rank 0, at the step the attempt had
reached (a sample before the attempt's first step has nothing to attach to and is skipped):

    node/rss_bytes, node/cpu_seconds, node/gpu_util/gpuN, node/gpu_memory_bytes/gpuN

so that `metrics`, the dashboard and the experiment gate (steps per CPU-second, GPU use) read
them like any metric. Several samples at one step keep the newest. The cursor is named after the
file's inode: a file the shim moved aside is read from the start of its successor.
"""

from __future__ import annotations

import json
import os

from sqlalchemy import RowMapping

from trackway.executors.node_sampler import SAMPLES_FILE
from trackway.ledger import Ledger
from trackway.ledger.attempt_lock import lock_attempt
from trackway.ledger.ingest import _ingest_metric_lines, _offsets, _save_offset, spool_dir_of
from trackway.supervisor.log_metrics import _attempt_last_step

MAX_READ = 1 << 20


def sample_metrics(sample: dict) -> dict[str, float]:
    """The series one sample adds to, by key."""
    values: dict[str, float] = {}
    for key in ("rss_bytes", "cpu_seconds"):
        if isinstance(sample.get(key), (int, float)) and not isinstance(sample.get(key), bool):
            values[f"node/{key}"] = float(sample[key])
    for gpu in sample.get("gpus") or ():
        index = gpu.get("index")
        if not isinstance(index, int):
            continue
        if isinstance(gpu.get("util"), (int, float)):
            values[f"node/gpu_util/gpu{index}"] = float(gpu["util"])
        if isinstance(gpu.get("memory_bytes"), (int, float)):
            values[f"node/gpu_memory_bytes/gpu{index}"] = float(gpu["memory_bytes"])
    return values


def ingest_node_samples(ledger: Ledger, attempt: RowMapping, known: dict[str, tuple[str, int]]) -> int:
    """Store the samples added since the last call; `known` (attempt id → (cursor, size read)) spares a quiet
    file the ledger read. Returns how many samples were stored."""
    path = spool_dir_of(attempt) / SAMPLES_FILE
    try:
        stat = os.stat(path)
    except OSError:
        return 0
    cursor = f"{SAMPLES_FILE}:{stat.st_ino}"
    if known.get(attempt["attempt_id"]) == (cursor, stat.st_size):
        return 0
    with ledger.read() as conn:
        no_step = _attempt_last_step(conn, attempt["attempt_id"]) is None
    if no_step:
        # Nothing to attach the samples to yet (or ever, for a script that logs no steps), and no write
        # transaction to take: a thousand step-less attempts took one every 10 s each. The file is read
        # from the stored cursor once a step is there, every sample then at that step, where the newest
        # wins, as it would have.
        known[attempt["attempt_id"]] = (cursor, stat.st_size)
        return 0
    stored = 0
    with ledger.write() as conn:
        lock_attempt(conn, attempt["attempt_id"])
        offset = _offsets(conn, attempt["attempt_id"]).get(cursor, 0)
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(MAX_READ)
        whole = chunk[:chunk.rfind(b"\n") + 1]  # a last line without its newline is still being written
        step = _attempt_last_step(conn, attempt["attempt_id"])
        batches = []
        for line in whole.splitlines():
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            values = sample_metrics(sample) if isinstance(sample, dict) else {}
            if step is None or not values or not isinstance(sample.get("t"), (int, float)):
                continue
            keys = sorted(values)
            batches.append((keys, [step], [float(sample["t"])], [[values[k]] for k in keys]))
        stored = len(batches)
        _ingest_metric_lines(conn, attempt, batches)
        _save_offset(conn, attempt["attempt_id"], cursor, offset + len(whole))
    known[attempt["attempt_id"]] = (cursor, offset + len(whole))
    return stored
