"""The spool writer: `run.log` appends to an in-memory queue; one background thread writes it to the spool.

The training thread pays for one `deque.append` per call. Every `flush_interval_s` the writer
drains the queue into one columnar line per set of keys, and refreshes the heartbeat file.
Nothing here touches the ledger, so a locked, slow or absent ledger cannot slow training.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from trackway.spool import (
    EVENTS_FILE,
    HEARTBEAT_FILE,
    append_lines,
    as_float,
    encode_metric_rows,
    metrics_file,
    write_json_atomic,
)

FLUSH_INTERVAL_S = 0.25
HEARTBEAT_INTERVAL_S = 5.0


class SpoolWriter:
    """Owns the attempt's spool files for one process (one rank)."""

    def __init__(
        self,
        spool_dir: Path,
        rank: int = 0,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        finite_keys: tuple[str, ...] = (),
    ):
        self.spool_dir = spool_dir
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.metrics_path = metrics_file(spool_dir, rank)
        self.events_path = spool_dir / EVENTS_FILE
        self.heartbeat_path = spool_dir / HEARTBEAT_FILE
        self.flush_interval_s = flush_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.queue: deque[tuple[int, float, dict[str, Any]]] = deque()
        self.last_step: int | None = None
        self.last_progress_t: float | None = None  # wall time of the newest logged step: stall detection reads it
        self.finite_keys = finite_keys
        # (key, value, step) of the first non-finite value of a `finite_keys` metric that was not a
        # plain float (those the training thread checks itself); `Run.log` raises it on its next call.
        self.non_finite: tuple[str, float, int] | None = None
        self._events_lock = threading.Lock()
        self._seq = self._next_event_seq()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._last_heartbeat = 0.0
        self._thread = threading.Thread(target=self._loop, name="trackway-spool", daemon=True)
        self._thread.start()

    def _next_event_seq(self) -> int:
        # A process that joins an attempt after another (a restarted rank) continues the numbering.
        try:
            with open(self.events_path, "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def event(self, kind: str, fsync: bool = True, **payload: Any) -> None:
        """Append one event line now (events are rare and matter: they are written synchronously)."""
        with self._events_lock:
            record = {"seq": self._seq, "t": time.time(), "kind": kind, "rank": self.rank, **payload}
            self._seq += 1
            append_lines(self.events_path, [json.dumps(record, default=str).encode() + b"\n"], fsync=fsync)

    def flush(self) -> None:
        """Write everything queued so far (callable from any thread)."""
        rows = []
        queue = self.queue
        while True:
            try:
                rows.append(queue.popleft())
            except IndexError:
                break
        if rows:
            self._check_finite(rows)
            append_lines(self.metrics_path, encode_metric_rows(rows))
            if self.last_step is None or rows[-1][0] != self.last_step:
                self.last_progress_t = rows[-1][1]
            self.last_step = rows[-1][0]

    def _check_finite(self, rows) -> None:
        if self.non_finite is not None or not self.finite_keys:
            return
        for step, _, metrics in rows:
            for key in self.finite_keys:
                value = metrics.get(key)
                if value is not None and value.__class__ is not float:
                    number = as_float(value)
                    if number is not None and not math.isfinite(number):
                        self.non_finite = (key, number, step)
                        return

    def heartbeat(self) -> None:
        self._last_heartbeat = time.monotonic()
        write_json_atomic(
            self.heartbeat_path,
            {
                "t": time.time(),
                "step": self.last_step,
                "progress_t": self.last_progress_t,
                "pid": os.getpid(),
                "rss_bytes": _rss_bytes(),
            },
            fsync=False,
        )

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()
            if time.monotonic() - self._last_heartbeat >= self.heartbeat_interval_s:
                self.heartbeat()

    def close(self) -> None:
        """Stop the thread and write what is left, durably."""
        self._stopped.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self.flush()
        self.heartbeat()
        for path in (self.metrics_path, self.events_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _rss_bytes() -> int | None:
    """This process's resident memory, for the supervisor's memory-growth watcher (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
