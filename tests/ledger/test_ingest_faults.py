"""Ingesting a spool under faults: unreadable lines are quarantined, two ingesters at once store everything once."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import event, func, select

from trackway.ledger.ingest import ingest_attempt, ingester_event_key
from trackway.ledger.schema import attempt_events, metric_points, metric_series, spool_cursors
from trackway.spool import QUARANTINE_FILE, encode_metric_rows, record_lost_bytes
from trackway.reports.explain import explain, incidents
from trackway.reports.explain_layout import to_markdown

from spool_attempt import attempt_with_spool

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"


def _metric_line(steps: range) -> bytes:
    (line,) = encode_metric_rows((step, 1000.0 + step, {"loss": 1.0 / (step + 1)}) for step in steps)
    return line


def _event_line(seq: int, kind: str, **payload) -> bytes:
    return json.dumps({"seq": seq, "t": 1000.0 + seq, "kind": kind, "rank": 0, **payload}).encode() + b"\n"


def _append(path: Path, *lines: bytes) -> list[int]:
    """Append `lines`; the byte offset at which each starts."""
    offsets = []
    with open(path, "ab") as f:
        for line in lines:
            offsets.append(f.tell())
            f.write(line)
    return offsets


def _steps(ledger, run_id: str) -> list[int]:
    with ledger.read() as conn:
        return list(conn.execute(
            select(metric_points.c.step).join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
            .where(metric_series.c.run_id == run_id).order_by(metric_points.c.step)
        ).scalars())


def _events(ledger, attempt_id: str, kind: str | None = None) -> list[dict]:
    query = select(attempt_events.c.payload).where(attempt_events.c.attempt_id == attempt_id)
    if kind is not None:
        query = query.where(attempt_events.c.kind == kind)
    with ledger.read() as conn:
        return [json.loads(p) for p in conn.execute(query.order_by(attempt_events.c.rank, attempt_events.c.seq)).scalars()]


BAD_METRIC_LINES = [
    b'{"keys": [',  # torn, as a full disk leaves it
    b"\xff\xfe\x00garbage " + TOKEN.encode(),  # not UTF-8, and a secret in it
    b'{"keys": ["loss"], "steps": "many", "times": [], "values": [[]]}',  # JSON of the wrong shape
    b'{"keys": ["loss"], "steps": [1, 2], "times": [1.0], "values": [[0.5, 0.5]]}',  # columns that disagree
    b'[1, 2, 3]',
]


def test_a_garbage_line_mid_spool_is_quarantined_and_the_rest_ingested(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rfaults")
    spool = tmp_path / "attempt" / "spool"
    metrics = spool / "metrics-r0.jsonl"
    offsets = _append(metrics, _metric_line(range(0, 10)), *(line + b"\n" for line in BAD_METRIC_LINES),
                      _metric_line(range(10, 20)))
    events = spool / "events.jsonl"
    event_offsets = _append(events, _event_line(0, "started"), b"not json at all\n",
                            b'{"seq": "x", "t": 1.0, "kind": "started"}\n', b'{"seq": 5, "t": 1e300, "kind": "x"}\n',
                            _event_line(1, "checkpoint_committed", step=3),  # no name, no path
                            _event_line(2, "checkpoint_committed", step=3, name="c" * 65, path="/ckpt"),  # too long
                            _event_line(3, "note", message="pushed with postgresql://bob:hunter2@db/x"))

    report = ingest_attempt(ledger, attempt)  # returns: nothing raised

    assert _steps(ledger, "rfaults") == list(range(20))  # points before and after the bad lines
    assert report.quarantined == len(BAD_METRIC_LINES) + 5
    quarantined = _events(ledger, attempt["attempt_id"], "spool_line_quarantined")
    by_place = {(e["file"], e["offset"]): e for e in quarantined}
    assert set(by_place) == {("metrics-r0.jsonl", o) for o in offsets[1:-1]} | {
        ("events.jsonl", o) for o in event_offsets[1:6]}
    torn = by_place[("metrics-r0.jsonl", offsets[1])]
    assert torn["error"].startswith("not JSON") and "\n" not in torn["error"]
    assert torn["preview"] == '{"keys": ['
    secret = by_place[("metrics-r0.jsonl", offsets[2])]
    assert TOKEN not in secret["preview"] and "hf_***" in secret["preview"]
    assert secret["error"].startswith(("not JSON", "not UTF-8"))
    assert "'steps'" in by_place[("metrics-r0.jsonl", offsets[3])]["error"]
    assert "'name'" in by_place[("events.jsonl", event_offsets[4])]["error"]
    assert "at most 64 characters" in by_place[("events.jsonl", event_offsets[5])]["error"]
    # Nothing lost: every bad line is beside the spool, byte for byte, readable by its owner only.
    copies = [json.loads(line) for line in (spool / QUARANTINE_FILE).read_text().splitlines()]
    assert [base64.b64decode(c["line_base64"]) for c in copies[:len(BAD_METRIC_LINES)]] == BAD_METRIC_LINES
    assert (spool / QUARANTINE_FILE).stat().st_mode & 0o777 == 0o600
    # The good events are stored, and what a script said is redacted on its way into the ledger.
    kinds = [e["kind"] for e in _events(ledger, attempt["attempt_id"]) if e["kind"] != "spool_line_quarantined"]
    assert kinds == ["started", "note"]
    (note,) = _events(ledger, attempt["attempt_id"], "note")
    assert "hunter2" not in note["message"] and "bob:***@db" in note["message"]
    # `trackway explain` shows each quarantined line.
    with ledger.read() as conn:
        lines = incidents(conn, attempt["attempt_id"])
    assert sum("quarantined" in line for line in lines) == report.quarantined


def test_a_quarantined_line_is_recorded_once_however_often_it_is_read(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rfaults")
    metrics = tmp_path / "attempt" / "spool" / "metrics-r0.jsonl"
    _append(metrics, _metric_line(range(0, 5)), b'{"keys": [\n')
    ingest_attempt(ledger, attempt)
    # A crash after reading, before the offset was saved, makes the next ingest read the line again.
    with ledger.write() as conn:
        conn.execute(spool_cursors.delete())
    _append(metrics, _metric_line(range(5, 10)))
    second = ingest_attempt(ledger, attempt)
    third = ingest_attempt(ledger, attempt)
    assert second.quarantined == 1 and third.quarantined == 0
    assert len(_events(ledger, attempt["attempt_id"], "spool_line_quarantined")) == 1
    assert _steps(ledger, "rfaults") == list(range(10))


def test_bytes_that_never_arrived_are_recorded_once_and_explain_says_the_resume_is_not_known(ledger, tmp_path):
    # A Kubernetes pod's events came back through its log and one frame was lost: the `started` event naming
    # the checkpoint it resumed from was in it. The receipt must not say "from the start".
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rlost")
    spool = tmp_path / "attempt" / "spool"
    events = spool / "events.jsonl"
    _append(events, _event_line(0, "note", message="hello"))
    start = events.stat().st_size
    lost = _event_line(1, "started", resume_from="step-00000028") + _event_line(2, "note", message="half")
    assert record_lost_bytes(spool, "events.jsonl", start + len(lost), "a frame lost") == (start, start + len(lost))
    _append(events, _event_line(3, "note", message="after the gap"))
    for _ in range(2):
        report = ingest_attempt(ledger, attempt)
    assert report.quarantined == 0  # the blanks are no line at all
    assert [e["message"] for e in _events(ledger, attempt["attempt_id"], "note")] == ["hello", "after the gap"]
    (gap,) = _events(ledger, attempt["attempt_id"], "spool_bytes_lost")
    assert (gap["file"], gap["from"], gap["to"], gap["held"]) == ("events.jsonl", start, start + len(lost), "events")

    with ledger.read() as conn:
        facts = explain(conn, attempt["attempt_id"])
    said = to_markdown(facts)
    assert facts["checkpoints"]["resumed_from"] is None
    assert f"not known: this attempt's events never arrived from where it ran (events.jsonl bytes {start}-" in said
    assert "the start" not in said
    assert f"events.jsonl bytes {start}-{start + len(lost)} never arrived" in " ".join(facts["incidents"])


def test_one_bad_spool_does_not_stop_another_runs_ingest(ledger, tmp_path):
    bad = attempt_with_spool(ledger, tmp_path / "bad", run_id="rbad")
    good = attempt_with_spool(ledger, tmp_path / "good", run_id="rgood")
    _append(tmp_path / "bad" / "spool" / "metrics-r0.jsonl", b"\x00\x01\x02\n", _metric_line(range(3)))
    _append(tmp_path / "good" / "spool" / "metrics-r0.jsonl", _metric_line(range(4)))
    for attempt in (bad, good):
        ingest_attempt(ledger, attempt)
    assert _steps(ledger, "rbad") == [0, 1, 2] and _steps(ledger, "rgood") == [0, 1, 2, 3]


def test_ingester_event_keys_never_meet_the_sdks_or_the_supervisors():
    keys = {ingester_event_key(name, offset) for name in ("events.jsonl", "metrics-r0.jsonl", "metrics-r1.jsonl",
                                                          "fallback/0a1b2c3d/metrics-r0.jsonl")
            for offset in (0, 1, 2**31 - 1, 2**31, 5 * 2**31 + 7)}
    assert len(keys) == 20
    assert all(rank < -1 and -(2**31) <= rank and 0 <= seq < 2**31 for rank, seq in keys)


# -- two ingesters at once ----------------------------------------------------------------------

INGESTER = textwrap.dedent("""
    import os, sys
    from trackway.ledger import open_ledger
    from trackway.ledger.ingest import ingest_attempt, ingester_event_key
    from trackway.ledger.records import get_attempt

    url, attempt_id, stop, how = sys.argv[1:5]
    ledger = open_ledger(url, migrate=False)
    read_offsets = {} if how == "remembering" else None  # as the supervisor keeps them between ticks
    print("ready", flush=True)
    rounds = 0
    while True:
        last = os.path.exists(stop)  # one more round after the writer stopped, so nothing is left
        with ledger.read() as conn:
            attempt = get_attempt(conn, attempt_id)
        ingest_attempt(ledger, attempt, read_offsets)
        rounds += 1
        if last:
            break
    print(rounds)
""")


def test_two_processes_ingesting_one_attempt_store_everything_once(ledger, ledger_url, tmp_path):
    attempts = [attempt_with_spool(ledger, tmp_path / f"a{i}", run_id=f"rconc{i}") for i in range(2)]
    stop = tmp_path / "stop"
    ingesters = [
        subprocess.Popen([sys.executable, "-c", INGESTER, ledger_url, a["attempt_id"], str(stop), how],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for a in attempts for how in ("remembering", "asking")  # one keeps the offsets it read, one asks each time
    ]
    try:
        for p in ingesters:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        step = seq = 0
        # New files appear while the ingesters poll: each first offset of a file is a race.
        for rank in range(6):
            for _ in range(8):
                for a in attempts:
                    spool = Path(a["state_dir"]) / "spool"
                    _append(spool / f"metrics-r{rank}.jsonl", _metric_line(range(step, step + 25)))
                    _append(spool / "events.jsonl", _event_line(seq, "progress", step=step))
                step += 25
                seq += 1
                time.sleep(0.02)
    finally:
        stop.touch()
        results = [(p.wait(timeout=60), *p.communicate()) for p in ingesters]
    for code, out, err in results:
        assert code == 0, [line for line in err.splitlines() if "Error" in line][-1:]
        assert int(out) > 1
    for a in attempts:
        assert _steps(ledger, a["run_id"]) == list(range(step))
        assert [e["seq"] for e in _events(ledger, a["attempt_id"])] == list(range(seq))
        with ledger.read() as conn:
            cursors = dict(conn.execute(select(spool_cursors.c.file, spool_cursors.c.byte_offset)
                                        .where(spool_cursors.c.attempt_id == a["attempt_id"])).all())
            points = conn.execute(
                select(func.count()).select_from(metric_points)
                .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
                .where(metric_series.c.run_id == a["run_id"])
            ).scalar_one()
        spool = Path(a["state_dir"]) / "spool"
        assert cursors == {p.name: p.stat().st_size for p in spool.glob("*.jsonl")}
        assert points == step


def test_a_quiet_spool_costs_the_supervisor_no_ledger_query_once_its_offsets_are_known(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "quiet")
    spool = Path(attempt["state_dir"]) / "spool"
    _append(spool / "metrics-r0.jsonl", _metric_line(range(0, 10)))
    read_offsets: dict = {}
    assert ingest_attempt(ledger, attempt, read_offsets).points == 10
    statements = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - before_cursor_execute's statement
    event.listen(ledger.engine, "before_cursor_execute", listener)
    try:
        assert ingest_attempt(ledger, attempt, read_offsets).points == 0
        assert statements == []  # the spool's sizes, compared with what this process read: no query
        _append(spool / "metrics-r0.jsonl", _metric_line(range(10, 15)))
        assert ingest_attempt(ledger, attempt, read_offsets).points == 5
    finally:
        event.remove(ledger.engine, "before_cursor_execute", listener)
    assert statements  # new lines: read and written through the ledger
    assert _steps(ledger, attempt["run_id"]) == list(range(15))


def test_offsets_another_process_moved_on_are_never_read_twice(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "shared")
    spool = Path(attempt["state_dir"]) / "spool"
    _append(spool / "metrics-r0.jsonl", _metric_line(range(0, 10)))
    remembered: dict = {}
    ingest_attempt(ledger, attempt, remembered)
    _append(spool / "metrics-r0.jsonl", _metric_line(range(10, 20)))
    assert ingest_attempt(ledger, attempt).points == 10  # another ingester took these
    assert ingest_attempt(ledger, attempt, remembered).points == 0  # its old offsets say "news": the ledger says no
    assert remembered[attempt["attempt_id"]] == {"metrics-r0.jsonl": (spool / "metrics-r0.jsonl").stat().st_size}
    assert _steps(ledger, attempt["run_id"]) == list(range(20))
