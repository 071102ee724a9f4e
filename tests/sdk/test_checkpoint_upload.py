"""With $TRACKWAY_CHECKPOINT_URL, a script's checkpoints go to the store too, and a new host resumes from there.

Real attempts of tests/checkpoints/scripts/sdk_resume.py against moto's S3 server: the spool says
what was uploaded (`checkpoint_uploaded`, after its `checkpoint_committed`) and where a resume read
its checkpoint (`checkpoint_restored` with `source`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trackway.sdk.context import AttemptContext
from trackway.spool import EVENTS_FILE

SCRIPT = Path(__file__).parents[1] / "checkpoints" / "scripts" / "sdk_resume.py"


def _attempt(tmp_path: Path, host: str, number: int, url: str, aws: dict[str, str], *args: str):
    spool = tmp_path / host / f"attempt-{number}" / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKWAY_")}
    env.update(aws)
    env.update(
        TRACKWAY_RUN_ID="r1", TRACKWAY_ATTEMPT_ID=f"r1/{number}", TRACKWAY_ATTEMPT_NUMBER=str(number),
        TRACKWAY_SPOOL_DIR=str(spool), TRACKWAY_CHECKPOINT_DIR=str(tmp_path / host / "checkpoints"),
        TRACKWAY_CHECKPOINT_URL=url,
    )
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, [json.loads(line) for line in (spool / EVENTS_FILE).read_text().splitlines()]


@pytest.mark.slow  # the same upload and resume on a new host, supervised, in tests/supervisor/test_reclaimed_host.py
def test_checkpoints_are_uploaded_and_a_new_host_resumes_from_the_store(s3_server, tmp_path: Path) -> None:
    url = f"s3://{s3_server.bucket('sdk')}/runs/r1"
    out, events = _attempt(tmp_path, "host-a", 1, url, s3_server.env, "25")
    assert "restored None" in out
    told = [(e["kind"], e.get("name")) for e in events if e["kind"].startswith("checkpoint_")]
    for name in ("step-00000010", "step-00000020"):
        assert told.index(("checkpoint_committed", name)) < told.index(("checkpoint_uploaded", name))
    uploaded = [e for e in events if e["kind"] == "checkpoint_uploaded"]
    committed = {e["name"]: e for e in events if e["kind"] == "checkpoint_committed"}
    assert [(e["step"], e["name"], e["url"]) for e in uploaded] == [
        (10, "step-00000010", f"{url}/step-00000010"), (20, "step-00000020", f"{url}/step-00000020")]
    for event in uploaded:
        assert event["size_bytes"] == committed[event["name"]]["size_bytes"]
        assert event["uploaded_at"] >= committed[event["name"]]["committed_at"] and event["seconds"] >= 0

    # Host A is gone: attempt 2 runs on a host whose checkpoint directory is empty.
    out, events = _attempt(tmp_path, "host-b", 2, url, s3_server.env, "25", "--stop-at", "21")
    assert "restored step-00000020" in out
    (restored,) = [e for e in events if e["kind"] == "checkpoint_restored"]
    assert (restored["name"], restored["source"], restored["fallback_from"]) == (
        "step-00000020", f"{url}/step-00000020", [])


def test_the_attempt_context_reads_the_checkpoint_url() -> None:
    env = {"TRACKWAY_ATTEMPT_ID": "r1/1", "TRACKWAY_RUN_ID": "r1", "TRACKWAY_SPOOL_DIR": "/s",
           "TRACKWAY_CHECKPOINT_DIR": "/c"}
    assert AttemptContext.from_env(env).checkpoint_url is None
    assert AttemptContext.from_env({**env, "TRACKWAY_CHECKPOINT_URL": ""}).checkpoint_url is None
    given = AttemptContext.from_env({**env, "TRACKWAY_CHECKPOINT_URL": "s3://b/runs/r1"})
    assert given.checkpoint_url == "s3://b/runs/r1"
