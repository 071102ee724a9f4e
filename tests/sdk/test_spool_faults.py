"""The spool on a full disk: no point lost without a record, whether space comes back or not.

Each test fills a real 1 MiB tmpfs that holds the attempt's spool, runs a real training script
with the SDK in a subprocess, and ingests what it left into a real ledger on each backend.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from spool_attempt import attempt_with_spool
from waiting import wait_for

from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.schema import attempt_events, metric_points, metric_series
from trackway.spool import decode_metric_line
from trackway.reports.explain import incidents

SCRIPT = str(Path(__file__).parent / "scripts" / "spool_full_script.py")
KEYS = 2  # the script logs loss and acc


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 1 MiB tmpfs mounted for this test (root only), unmounted after it."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs at {mount}: {done.stderr.strip() or 'mount failed'}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int = 0) -> Path:
    """Fill the file system at `mount` until ENOSPC, then free about `leave` bytes; the filler's path."""
    reserve = mount / "reserve"
    if leave:
        reserve.write_bytes(b"\0" * leave)
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    reserve.unlink(missing_ok=True)
    return filler


def _start(attempt, tmp_path: Path, before: int, after: int, go: Path | None = None, **env: str):
    """The training script as the attempt's process, its stderr going to a file off the small disk."""
    stderr = tmp_path / "stderr.txt"
    environment = {
        **os.environ,
        "TRACKWAY_RUN_ID": attempt["run_id"],
        "TRACKWAY_ATTEMPT_ID": attempt["attempt_id"],
        "TRACKWAY_ATTEMPT_NUMBER": "1",
        "TRACKWAY_SPOOL_DIR": str(Path(attempt["state_dir"]) / "spool"),
        "TRACKWAY_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "TRACKWAY_HEARTBEAT_S": "3600",
        **env,
    }
    args = [sys.executable, SCRIPT, str(before), str(after), *([str(go)] if go else [])]
    with open(stderr, "wb") as err:
        process = subprocess.Popen(args, env=environment, stdout=subprocess.PIPE, stderr=err, text=True)
    return process, stderr


def _wait_for(path: Path, text: str, timeout: float = 20) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        content = path.read_text()
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{path} never said {text!r}: {path.read_text()!r}")


def _whole_lines(path: Path) -> tuple[bytes] | None:
    """(`path`'s bytes,) (b"" if absent) when they end with a whole line; None while a line is cut off."""
    held = path.read_bytes() if path.exists() else b""
    return (held,) if held == b"" or held.endswith(b"\n") else None


def _points(ledger) -> dict[str, list[int]]:
    with ledger.read() as conn:
        rows = conn.execute(
            select(metric_series.c.key, metric_points.c.step)
            .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
            .order_by(metric_points.c.step)
        ).all()
    points: dict[str, list[int]] = {}
    for key, step in rows:
        points.setdefault(key, []).append(step)
    return points


def _events(ledger, attempt_id: str) -> list[dict]:
    with ledger.read() as conn:
        payloads = conn.execute(
            select(attempt_events.c.payload).where(attempt_events.c.attempt_id == attempt_id)
            .order_by(attempt_events.c.rank, attempt_events.c.seq)
        ).scalars()
        return [json.loads(p) for p in payloads]


def test_points_logged_while_the_disk_is_full_arrive_once_space_returns(small_fs, ledger, tmp_path):
    attempt = attempt_with_spool(ledger, small_fs / "attempt", run_id="rfull")
    filler = _fill(small_fs, leave=8192)  # room for a little, so an append is cut off half-way
    go = tmp_path / "go"
    process, stderr = _start(attempt, tmp_path, before=3000, after=1000, go=go)
    assert process.stdout.readline().strip() == "logged"
    _wait_for(stderr, "cannot write the spool file")
    metrics = small_fs / "attempt" / "spool" / "metrics-r0.jsonl"
    # What could not be written whole was taken back. The writer keeps retrying meanwhile, and a
    # read that lands inside one retry sees its append before the take-back: read until one lands
    # outside (a torn line that stayed fails here, after the hang guard).
    (held,) = wait_for(lambda: _whole_lines(metrics), "the spool file to hold whole lines only")
    for line in held.splitlines():
        decode_metric_line(line)  # no torn line left in the middle either: each one reads back
    filler.unlink()
    go.touch()
    assert process.wait(timeout=30) == 0

    report = ingest_attempt(ledger, attempt)
    assert report.quarantined == 0
    assert _points(ledger) == {"loss": list(range(4000)), "acc": list(range(4000))}
    events = _events(ledger, attempt["attempt_id"])
    failed = [e for e in events if e["kind"] == "spool_write_failed"]
    assert len(failed) == 2 and "finished" in [e["kind"] for e in events]
    first, recovered = failed
    assert first["error"].startswith("ENOSPC") and "disk full" in first["error"]
    assert first["file"] in ("metrics-r0.jsonl", "events.jsonl") and first["free_bytes"] < 64 * 1024
    assert "recovered" not in first and recovered["recovered"] is True and recovered["points_pending"] > 0
    lines = [line for line in _wait_for(stderr, "writable again").splitlines() if line.startswith("trackway:")]
    assert len(lines) == 2, lines  # one line when it fails, one when it recovers: not one per flush
    assert str(small_fs / "attempt" / "spool") in lines[0] and "ENOSPC" in lines[0] and "bytes free" in lines[0]
    with ledger.read() as conn:
        assert any("could not be written" in line for line in incidents(conn, attempt["attempt_id"]))


def test_a_spool_that_never_comes_back_goes_to_the_fallback(small_fs, ledger, tmp_path, monkeypatch):
    fallback = tmp_path / "fallback"
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", str(fallback))  # the ingester here reads it too
    attempt = attempt_with_spool(ledger, small_fs / "attempt", run_id="rfull")
    _fill(small_fs)
    process, stderr = _start(attempt, tmp_path, before=2000, after=0)
    assert process.wait(timeout=30) == 0
    assert "where the ingester reads them" in stderr.read_text()

    ingest_attempt(ledger, attempt)
    assert _points(ledger) == {"loss": list(range(2000)), "acc": list(range(2000))}
    events = _events(ledger, attempt["attempt_id"])
    kinds = [e["kind"] for e in events]
    assert {"started", "finished"} <= set(kinds) and kinds.count("spool_write_failed") == 2
    last = [e for e in events if e["kind"] == "spool_write_failed"][-1]
    assert last["recovered"] is False and last["fallback"].startswith(str(fallback))
    assert last["points_in_fallback"] == 2000 * KEYS
    (directory,) = (fallback / "trackway-spool-fallback").iterdir()
    assert directory.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in directory.iterdir())


def test_holding_more_than_the_bound_spills_to_the_fallback_mid_run(small_fs, ledger, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", str(tmp_path / "fallback"))
    attempt = attempt_with_spool(ledger, small_fs / "attempt", run_id="rfull")
    filler = _fill(small_fs)
    go = tmp_path / "go"
    process, stderr = _start(attempt, tmp_path, before=3000, after=1000, go=go, TRACKWAY_SPOOL_PENDING_BYTES="16384")
    assert process.stdout.readline().strip() == "logged"
    _wait_for(stderr, "held lines now go to")
    filler.unlink()
    go.touch()
    assert process.wait(timeout=30) == 0

    ingest_attempt(ledger, attempt)
    assert _points(ledger) == {"loss": list(range(4000)), "acc": list(range(4000))}
    recovered = [e for e in _events(ledger, attempt["attempt_id"]) if e.get("recovered")]
    assert len(recovered) == 1 and recovered[0]["points_in_fallback"] > 0


def test_points_nothing_could_take_are_reported_lost_with_their_count(small_fs, ledger, tmp_path):
    attempt = attempt_with_spool(ledger, small_fs / "attempt", run_id="rfull")
    _fill(small_fs)
    # The fallback is on the same full disk: nothing can be written anywhere.
    process, stderr = _start(attempt, tmp_path, before=500, after=0,
                             TRACKWAY_SPOOL_FALLBACK=str(small_fs / "fallback"))
    process.wait(timeout=30)
    told = stderr.read_text()
    assert f"trackway: {500 * KEYS} metric points were lost" in told
    assert "ENOSPC" in told
    # A run whose curves have holes does not end as a clean completion.
    assert process.returncode != 0
    assert "SpoolPointsLost" in told


def test_spool_files_are_readable_by_their_owner_only(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rfull")
    process, _ = _start(attempt, tmp_path, before=10, after=0)
    assert process.wait(timeout=30) == 0
    spool = tmp_path / "attempt" / "spool"
    files = {p.name: p.stat().st_mode & 0o777 for p in spool.iterdir()}
    assert files == {"metrics-r0.jsonl": 0o600, "events.jsonl": 0o600, "heartbeat.json": 0o600}
