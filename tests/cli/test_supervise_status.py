"""`trackway supervise --status` and `--stop`: is a background supervisor running for this ledger, and ending it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trackway.ledger import open_ledger
from trackway.settings import load_settings
from trackway.supervisor import background

PY = sys.executable


def trackway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "trackway", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def ledger_env(home: Path, ledger_url: str, monkeypatch: pytest.MonkeyPatch):
    """A migrated ledger named by TRACKWAY_DB; any background supervisor a test starts is killed after it."""
    monkeypatch.setenv("TRACKWAY_DB", ledger_url)
    monkeypatch.setenv(background.IDLE_ENV, "60")
    monkeypatch.delenv(background.AUTOSTART_ENV, raising=False)
    open_ledger(ledger_url).dispose()
    started: list[int] = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_status_when_none_runs_says_so_in_text_and_json(ledger_env, ledger_url):
    text = trackway("supervise", "--status")
    assert text.returncode == 0, text.stderr
    assert "no background supervisor is running for" in text.stdout
    assert "`trackway submit --detach`" in text.stderr
    status = json.loads(trackway("supervise", "--status", "--json").stdout)
    assert status["running"] is False and status["log"] is None


def test_status_names_the_pid_since_and_log_and_stop_ends_it(ledger_env):
    holder = background.ensure_running(load_settings())
    ledger_env.append(holder.pid)
    text = trackway("supervise", "--status")
    assert text.returncode == 0, text.stderr
    assert "background supervisor running for" in text.stdout
    assert f"pid    {holder.pid} on " in text.stdout
    assert " UTC (" in text.stdout and "exits after 60 s with nothing in flight" in text.stdout
    assert f"log    {holder.log}" in text.stdout
    status = json.loads(trackway("supervise", "--status", "--json").stdout)
    assert status["running"] is True and status["pid"] == holder.pid and status["log"] == str(holder.log)
    assert status["since"].endswith("Z") and status["idle_exit_seconds"] == 60

    stopped = trackway("supervise", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped the background supervisor (pid {holder.pid})" in stopped.stdout
    assert json.loads(trackway("supervise", "--status", "--json").stdout)["running"] is False
    # It finished its pass and said why it left, in its own log.
    assert f"pid {holder.pid}: asked to stop; exiting" in holder.log.read_text()
    # Stopping again is not an error: there is nothing to stop.
    again = trackway("supervise", "--stop")
    assert again.returncode == 0 and "no background supervisor is running" in again.stdout


def test_stop_will_not_signal_a_process_that_is_not_a_background_supervisor(ledger_env, tmp_path):
    # A stranger holds the lock file (pid reuse, or a lock file copied by hand): --stop must not kill it.
    place = background.place_of(load_settings())
    place.lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [PY, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                   "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'{\"pid\": %d}' % os.getpid()); "
                   "print('locked', flush=True); time.sleep(60)", str(place.lock)],
        stdout=subprocess.PIPE, text=True,
    )
    ledger_env.append(holder.pid)
    assert holder.stdout.readline().strip() == "locked"
    refused = trackway("supervise", "--stop")
    assert refused.returncode == 1
    assert f"held by pid {holder.pid}, which is not a trackway background supervisor" in refused.stderr
    assert holder.poll() is None
    holder.kill()
    holder.wait()
    holder.stdout.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--status", "--stop"], "--status and --stop: expected one of them, not both"),
        (["--once", "--status"], "--once and --status: expected one of them, not both"),
        (["--json"], "--json: expected together with --status"),
    ],
)
def test_mixed_modes_are_refused_naming_the_options(ledger_env, args, message):
    refused = trackway("supervise", *args)
    assert refused.returncode == 2
    assert message in refused.stderr
