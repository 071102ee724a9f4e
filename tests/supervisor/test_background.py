"""The background supervisor: started by the commands that leave work behind, one per ledger, gone when idle.

Nothing in these tests drives the ledger but the background supervisor: progress is read with
plain SQL (every `trackway` listing would tick a supervisor of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from waiting import wait_for

from trackway.errors import InputError
from trackway.ledger import open_ledger
from trackway.ledger.schema import attempts, evaluations, runs
from trackway.settings import load_settings
from trackway.supervisor import background

PY = sys.executable
TESTS = Path(__file__).resolve().parent.parent
NEUTRAL = str(TESTS / "cli" / "scripts" / "neutral.py")
EVALUATOR = TESTS / "evals" / "scripts" / "evaluator.py"


# -- helpers ----------------------------------------------------------------------------------------


def background_children(db_url: str) -> list[int]:
    """Pids of live background supervisors started for `db_url` (read from /proc: what a user's `ps` sees)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if background.CHILD_FLAG.encode() in cmdline and f"TRACKWAY_DB={db_url}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def kill_children(db_url: str) -> None:
    for pid in background_children(db_url):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def trackway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m trackway ARGS` as a person types it, in the test's working directory."""
    return subprocess.run([PY, "-m", "trackway", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def bg(home: Path, ledger_url: str, monkeypatch: pytest.MonkeyPatch):
    """The ledger's URL, with commands starting a background supervisor that idles out after 1 s; killed after."""
    monkeypatch.setenv("TRACKWAY_DB", ledger_url)
    monkeypatch.setenv(background.IDLE_ENV, "1")
    monkeypatch.delenv(background.AUTOSTART_ENV, raising=False)
    yield ledger_url
    kill_children(ledger_url)


def write_spec(directory: Path) -> Path:
    """An eval spec (one seed) around the stand-in evaluator, with its task set."""
    directory.mkdir()
    (directory / "evaluator.py").write_text(EVALUATOR.read_text())
    tasks = [{"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    (directory / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec = directory / "toy.toml"
    spec.write_text(
        f'name = "toy"\ncommand = {json.dumps([PY, "evaluator.py"])}\ntask_set = "tasks.jsonl"\n'
        'seeds = [0]\nmetrics = ["pass@1"]\n\n[decoding]\nsamples = 2\n'
    )
    return spec


def read(url: str, query):
    ledger = open_ledger(url)
    try:
        with ledger.read() as conn:
            return list(conn.execute(query).mappings())
    finally:
        ledger.dispose()


# -- the story ------------------------------------------------------------------------------


def test_submit_detach_with_eval_ends_with_every_evaluation_completed_and_the_supervisor_gone(bg, tmp_path):
    spec = write_spec(tmp_path / "evals")
    submitted = trackway("submit", "--detach", "--name", "train", "--eval", str(spec), "--", PY, NEUTRAL, "30")
    assert submitted.returncode == 0, submitted.stderr
    assert "started a background supervisor" in submitted.stderr
    # Nothing else runs a supervisor: the background one must train, evaluate, and then leave.
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    rows = read(bg, select(evaluations.c.checkpoint_step, evaluations.c.state).order_by(evaluations.c.checkpoint_step))
    assert [(r["checkpoint_step"], r["state"]) for r in rows] == [(10, "completed"), (20, "completed")]
    assert [r["state"] for r in read(bg, select(runs.c.state))] == ["completed"] * 3
    log = background.place_of(load_settings()).log.read_text()
    assert "nothing in flight for 1 s; exiting" in log
    assert log.count("ended: completed") == 3  # the training attempt and one seed per checkpoint
    status = trackway("supervise", "--status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["running"] is False


def test_evaluations_left_by_a_foreground_submit_are_finished_after_it_returns(bg, tmp_path):
    spec = write_spec(tmp_path / "evals")
    submitted = trackway("submit", "--name", "train", "--eval", str(spec), "--", PY, NEUTRAL, "30")
    assert submitted.returncode == 0, submitted.stderr
    # The command returned when training completed; its evaluations are not its to wait for.
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    rows = read(bg, select(evaluations.c.checkpoint_step, evaluations.c.state).order_by(evaluations.c.checkpoint_step))
    assert [(r["checkpoint_step"], r["state"]) for r in rows] == [(10, "completed"), (20, "completed")]


def test_resume_detach_is_followed_to_its_end_by_the_background_supervisor(bg):
    failed = trackway("submit", "--name", "flaky", "--", PY, NEUTRAL, "20", "--fail-at", "5")
    assert failed.returncode == 1 and "code_error" in failed.stderr
    assert background_children(bg) == []  # a foreground run that ended leaves nothing behind
    resumed = trackway("resume", "flaky", "--detach")
    assert resumed.returncode == 0, resumed.stderr
    assert "started a background supervisor" in resumed.stderr
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    ended = read(bg, select(attempts.c.attempt_number, attempts.c.termination_reason).order_by(attempts.c.attempt_number))
    assert [(a["attempt_number"], a["termination_reason"]) for a in ended] == [(1, "code_error"), (2, "completed")]
    assert [r["state"] for r in read(bg, select(runs.c.state))] == ["completed"]


def test_a_preempted_detached_run_is_resumed_without_anyone_watching(bg):
    submitted = trackway("submit", "--detach", "--name", "pre", "--", PY, NEUTRAL, "20", "--preempt-at", "5")
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    ended = read(bg, select(attempts.c.attempt_number, attempts.c.termination_reason).order_by(attempts.c.attempt_number))
    assert [(a["attempt_number"], a["termination_reason"]) for a in ended] == [(1, "preempted"), (2, "completed")]
    assert [r["state"] for r in read(bg, select(runs.c.state))] == ["completed"]


def test_it_does_not_leave_while_an_attempt_is_still_running(bg):
    # Idle exit is 1 s; the attempt runs 3 s: leaving early would leave the run `running` forever.
    submitted = trackway("submit", "--detach", "--", PY, "-c", "import time; time.sleep(3)")
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    (run,) = read(bg, select(runs.c.state))
    assert run["state"] == "completed"


# -- one per ledger ---------------------------------------------------------------------------------


def test_a_second_ensure_finds_the_first_instead_of_starting_another(bg, monkeypatch):
    # Idle for longer than a loaded machine takes to start `trackway submit` below: it must find this one alive.
    monkeypatch.setenv(background.IDLE_ENV, "60")
    settings = load_settings()
    with open_ledger(settings.db_url).read():
        pass
    first = background.ensure_running(settings)
    second = background.ensure_running(settings)
    assert first.started and not second.started
    assert second.pid == first.pid
    assert background_children(bg) == [first.pid]
    # And through the command a person types: it says the one already running.
    again = trackway("submit", "--detach", "--", PY, "-c", "pass")
    assert again.returncode == 0, again.stderr
    assert f"a background supervisor is already running (pid {first.pid})" in again.stderr
    assert background_children(bg) == [first.pid]


def test_children_started_together_leave_exactly_one_holding_the_ledger(bg):
    # Started by hand, without a lock handed over, each child races for the lock itself.
    children = [
        subprocess.Popen([PY, "-m", "trackway", "supervise", background.CHILD_FLAG, "--idle-exit", "30"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    try:
        losers = wait_for(lambda: [c for c in children if c.poll() is not None] or None, "a child to give up")
        wait_for(lambda: len([c for c in children if c.poll() is None]) == 1, "all but one child to give up")
        for loser in losers:
            assert "another background supervisor holds this ledger's lock; exiting" in loser.stdout.read()
        (winner,) = [c for c in children if c.poll() is None]
        assert background.running(load_settings()).pid == winner.pid
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdout.close()


def test_two_homes_on_one_sqlite_file_share_one_supervisor(home, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv(background.IDLE_ENV, "30")
    open_ledger(url).dispose()
    try:
        first = background.ensure_running(load_settings(home=str(tmp_path / "a"), db=url))
        second = background.ensure_running(load_settings(home=str(tmp_path / "b"), db=url))
        assert first.started and not second.started and second.pid == first.pid
    finally:
        kill_children(url)


def test_the_child_is_detached_from_the_terminal_that_started_it(bg):
    submitted = trackway("submit", "--detach", "--", PY, "-c", "pass")
    assert submitted.returncode == 0, submitted.stderr
    (pid,) = background_children(bg)
    assert os.getsid(pid) == pid != os.getsid(0)  # its own session: a closing terminal's hang-up never reaches it
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(background.place_of(load_settings()).log)
    # And a hang-up sent to it anyway (what a closing terminal sends its session) is ignored.
    wait_for(lambda: _ignores(pid, signal.SIGHUP), "the child to set up its signal handling")
    os.kill(pid, signal.SIGHUP)
    holder = background.running(load_settings())
    assert holder is not None and holder.pid == pid


def _ignores(pid: int, sig: int) -> bool:
    """Whether `pid` ignores `sig` (the kernel drops it at once), as /proc/PID/status says."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    return False


def test_a_bad_idle_setting_is_refused_with_its_name(bg, monkeypatch):
    monkeypatch.setenv(background.IDLE_ENV, "soon")
    with pytest.raises(InputError, match=f"{background.IDLE_ENV} 'soon': expected a number of seconds"):
        background.idle_exit_seconds(load_settings())
    submitted = trackway("submit", "--detach", "--", PY, "-c", "pass")
    # The run was recorded and started; only the background supervisor was not.
    assert submitted.returncode == 0
    assert f"warning: {background.IDLE_ENV} 'soon'" in submitted.stderr
    assert background_children(bg) == []


def test_commands_start_none_when_it_is_turned_off(bg, monkeypatch):
    monkeypatch.setenv(background.AUTOSTART_ENV, "0")
    submitted = trackway("submit", "--detach", "--", PY, "-c", "pass")
    assert submitted.returncode == 0, submitted.stderr
    assert "TRACKWAY_BACKGROUND_SUPERVISOR is off" in submitted.stderr
    assert background_children(bg) == []


# -- it follows trackway.toml -----------------------------------------------------------------------


def test_an_edit_of_stop_on_takes_effect_in_a_running_background_supervisor(bg, tmp_path):
    # The story: after an edit of `stop_on`, a run was still stopped by the old rule.
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["loss_rising"]\n')
    cue = tmp_path / "go"
    script = str(Path(__file__).parent / "scripts" / "rises_on_cue.py")
    submitted = trackway("submit", "--detach", "--name", "climb", "--", PY, script, str(cue))
    assert submitted.returncode == 0, submitted.stderr
    log = background.place_of(load_settings()).log
    wait_for(lambda: log.exists() and "supervising" in log.read_text(), "the background supervisor to start")
    Path("trackway.toml").write_text('[supervisor]\nstop_on = []\n')
    wait_for(lambda: log.exists() and "now in effect: stop_on: ['loss_rising'] → []" in log.read_text(),
             "the background supervisor to take the edit")
    cue.touch()
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    (attempt,) = read(bg, select(attempts.c.attempt_id, attempts.c.termination_reason))
    assert attempt["termination_reason"] == "completed"  # noticed, not stopped: the rule in effect says so
    explained = trackway("explain", "climb", "--json")
    assert any("loss rising" in line for line in json.loads(explained.stdout)["watchers"])


def test_a_bad_edit_keeps_the_running_settings_and_says_why(bg, tmp_path):
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["loss_rising"]\n')
    cue = tmp_path / "go"
    script = str(Path(__file__).parent / "scripts" / "rises_on_cue.py")
    submitted = trackway("submit", "--detach", "--name", "climb", "--", PY, script, str(cue))
    assert submitted.returncode == 0, submitted.stderr
    log = background.place_of(load_settings()).log
    wait_for(lambda: log.exists() and "supervising" in log.read_text(), "the background supervisor to start")
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["vibes"]\n')
    wait_for(lambda: log.exists() and "changed but was not applied" in log.read_text(),
             "the background supervisor to refuse the edit")
    assert "stop_on: expected a list of" in log.read_text()
    cue.touch()
    wait_for(lambda: not background_children(bg), "the background supervisor to exit on its own")
    (attempt,) = read(bg, select(attempts.c.termination_reason))
    assert attempt["termination_reason"] == "watcher_stop"  # the rule that was running still holds
