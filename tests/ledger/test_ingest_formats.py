"""Both metrics line formats ingest alike; a spool cut by SIGKILL ingests exactly the points that were flushed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.schema import metric_points, metric_series, spool_cursors
from trackway.sdk.writer import SpoolWriter
from trackway.spool import decode_metric_line, encode_metric_rows, read_complete_lines

from spool_attempt import attempt_with_spool

SCRIPT = Path(__file__).resolve().parents[1] / "sdk" / "scripts" / "log_forever.py"

# What the SDK wrote before format 2 (JSON numbers); such spools are still on disk and must still ingest.
FORMAT_1 = [
    b'{"keys": ["loss", "lr"], "steps": [0, 1, 2], "times": [1000.0, 1001.0, 1002.0], '
    b'"values": [[1.0, 0.5, 0.25], [0.1, 0.1, 0.1]]}\n',
    b'{"keys": ["loss"], "steps": [3], "times": [1003], "values": [[NaN]]}\n',
]


def _points(ledger, run_id: str) -> dict[tuple[str, int], float | None]:
    with ledger.read() as conn:
        rows = conn.execute(
            select(metric_series.c.key, metric_points.c.step, metric_points.c.value)
            .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
            .where(metric_series.c.run_id == run_id)
        ).all()
    return {(key, step): value for key, step, value in rows}


def _expected(lines: list[bytes]) -> dict[tuple[str, int], float]:
    """The points complete lines hold, decoded on their own; a later line's value for a step wins."""
    points = {}
    for line in lines:
        keys, steps, _, values = decode_metric_line(line)
        for key, column in zip(keys, values):
            points.update({(key, step): value for step, value in zip(steps, column)})
    return points


def test_format_1_lines_written_by_an_earlier_sdk_still_ingest_beside_format_2(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rformat")
    metrics = tmp_path / "attempt" / "spool" / "metrics-r0.jsonl"
    format_2 = encode_metric_rows([(4, 1004.0, {"loss": 0.2, "lr": 0.05}), (5, 1005.0, {"loss": 0.1, "lr": 0.05})])
    assert all(line.startswith(b'{"v":2,') for line in format_2)
    metrics.write_bytes(b"".join(FORMAT_1 + format_2))
    report = ingest_attempt(ledger, attempt)
    assert report.quarantined == 0 and report.points == 6 + 1 + 4
    points = _points(ledger, "rformat")
    assert points[("loss", 1)] == 0.5 and points[("lr", 5)] == 0.05 and points[("loss", 5)] == 0.1
    assert ("loss", 3) in points and sorted(step for key, step in points if key == "loss") == list(range(6))


def test_a_step_logged_twice_keeps_its_last_value(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rformat")
    lines = encode_metric_rows([(step, 1000.0 + step, {"loss": 1.0}) for step in range(10)])
    lines += encode_metric_rows([(5, 1020.0, {"loss": 2.0}), (3, 1021.0, {"loss": 3.0})])
    (tmp_path / "attempt" / "spool" / "metrics-r0.jsonl").write_bytes(b"".join(lines))
    ingest_attempt(ledger, attempt)
    points = _points(ledger, "rformat")
    assert [points[("loss", step)] for step in range(10)] == [1.0, 1.0, 1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("line", [
    b'{"v": 3, "keys": ["loss"]}',
    b'{"v": 2, "keys": ["loss"], "n": 2, "steps": "AAAAAAAAAAA=", "times": "", "values": [""]}',
    b'{"v": 2, "keys": ["loss"], "n": 1, "steps": "not base64!", "times": "AAAAAAAA8D8=", "values": ["AAAAAAAA8D8="]}',
    b'{"v": 2, "keys": ["loss", "lr"], "n": 1, "steps": "AQAAAAAAAAA=", "times": "AAAAAAAA8D8=", '
    b'"values": ["AAAAAAAA8D8="]}',
    b'{"v": 2, "keys": ["loss"], "n": 1, "steps": "AQAAAAAAAAA=", "times": "AAAAAAAA+H8=", "values": ["AAAAAAAA8D8="]}',
])
def test_a_malformed_format_2_line_is_refused_with_the_field_named(line):
    with pytest.raises(ValueError, match=r"field '(v|steps|times|values)'"):
        decode_metric_line(line)


def _start(attempt: dict, tmp_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "TRACKWAY_RUN_ID": attempt["run_id"], "TRACKWAY_ATTEMPT_ID": attempt["attempt_id"],
        "TRACKWAY_ATTEMPT_NUMBER": "1", "TRACKWAY_SPOOL_DIR": str(Path(attempt["state_dir"]) / "spool"),
        "TRACKWAY_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "TRACKWAY_HEARTBEAT_S": "3600",
    }
    return subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_spool_cut_by_sigkill_ingests_exactly_what_was_flushed(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rformat")
    metrics = Path(attempt["state_dir"]) / "spool" / "metrics-r0.jsonl"
    process = _start(attempt, tmp_path)
    deadline = time.time() + 60
    while not metrics.exists() or metrics.stat().st_size < 300_000:  # several flushes, many slices
        assert process.poll() is None, process.stderr.read()
        assert time.time() < deadline, "the script never flushed enough"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # mid-run: a slice may be half-appended
    assert process.wait(timeout=30) == -signal.SIGKILL

    lines, end = read_complete_lines(metrics, 0)
    flushed = _expected([line + b"\n" for line in lines])
    steps = sorted(step for key, step in flushed if key == "loss")
    assert steps == list(range(len(steps))) and len(flushed) == 2 * len(steps)  # no hole, nothing half-written

    # A kill in the middle of a write leaves half a line; make sure this spool has one.
    with open(metrics, "ab") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])
    report = ingest_attempt(ledger, attempt)
    assert report.quarantined == 0 and report.points == len(flushed)
    assert _points(ledger, "rformat") == flushed
    with ledger.read() as conn:
        (offset,) = conn.execute(select(spool_cursors.c.byte_offset)
                                 .where(spool_cursors.c.file == "metrics-r0.jsonl")).scalars()
    assert offset == end  # the torn tail is not read, and will not be skipped

    # The attempt's next process (a restarted rank) ends the torn line before appending its own.
    writer = SpoolWriter(metrics.parent)
    writer.queue.extend((step, 2000.0 + step, {"loss": -1.0}) for step in range(len(steps), len(steps) + 10))
    writer.close()
    again = ingest_attempt(ledger, attempt)
    assert again.quarantined == 1 and again.points == 10  # the torn half alone; nothing read twice
    assert len(_points(ledger, "rformat")) == len(flushed) + 10
    quarantined = json.loads((metrics.parent / "quarantine.jsonl").read_text().splitlines()[-1])
    assert quarantined["offset"] == end
