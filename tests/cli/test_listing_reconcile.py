"""A listing records the ends nobody followed only when someone must: never over a background supervisor's head,
and without loading a supervisor at all when nothing is in flight."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

from trackway.settings import load_settings
from trackway.supervisor import background

PY = sys.executable


def _state(cli, name: str) -> str:
    return next(r["state"] for r in cli("runs", "--json").json() if r["name"] == name)


def test_a_listing_leaves_ends_to_the_background_supervisor_that_holds_the_ledger(cli):
    result = cli("submit", "--detach", "--name", "quick", "--", PY, "-c", "pass")
    assert result.code == 0, result.err
    time.sleep(1.0)  # the attempt has ended; nobody recorded it yet
    lock = background.place_of(load_settings()).lock
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a background supervisor holds for its whole life
        assert _state(cli, "quick") == "running", "a listing ticked though a background supervisor owns the ledger"
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    deadline = time.monotonic() + 30
    while _state(cli, "quick") != "completed":  # with none holding it, the listing records the end itself
        assert time.monotonic() < deadline, "the listing never recorded the end"
        time.sleep(0.2)


def _loaded_by(ledger_url: str, argv: list[str], modules: list[str]) -> tuple[str, list[str]]:
    """What `trackway ARGV` printed in a fresh interpreter, and which of `modules` it imported."""
    probe = (
        "import json, sys; from trackway.cli.errors import run_app; from trackway.cli.main import app\n"
        f"code = run_app(app, {argv!r})\n"
        f"print(json.dumps([name for name in {modules!r} if name in sys.modules]), file=sys.stderr)"
    )
    done = subprocess.run([PY, "-c", probe], capture_output=True, text=True, env={**os.environ, "TRACKWAY_DB": ledger_url})
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])


def test_with_nothing_in_flight_a_listing_loads_no_supervisor(cli, ledger_url):
    assert cli("submit", "--name", "done", "--", PY, "-c", "pass").code == 0
    out, loaded = _loaded_by(ledger_url, ["runs", "--json"], ["trackway.supervisor.loop"])
    assert '"name": "done"' in out and loaded == []


def test_show_prints_a_placement_without_loading_what_chooses_one_or_starts_a_supervisor(cli, ledger_url):
    assert cli("submit", "--name", "done", "--", PY, "-c", "pass").code == 0
    out, loaded = _loaded_by(ledger_url, ["show", "done"], [
        "trackway.supervisor.loop", "trackway.supervisor.background", "trackway.resources.selection"])
    assert "chose local: it fits" in out
    assert loaded == [], f"show loaded more than it prints: {loaded}"
