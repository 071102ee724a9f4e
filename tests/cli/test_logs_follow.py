"""`trackway logs -f` follows a run across its attempts; `logs --all -f` tails every running attempt.

Real processes throughout: detached attempts, a `trackway supervise` subprocess that resumes the
run, and `trackway logs` as a subprocess reading what they write. Scripts wait for a file the test
creates, so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trackway.cli.logs_cmd import separator

PY = sys.executable
# A generous bound on waiting for output; reaching it fails the test, it is not a timing assertion.
PATIENCE_S = 60

# Attempt 1 commits step 5, says so, waits for the test's go-file and leaves preempted; the
# supervisor resumes it, and attempt 2 says where it resumed from.
SPOT = """
import os, sys, time
from pathlib import Path
import trackway

run = trackway.init()
if int(os.environ["TRACKWAY_ATTEMPT_NUMBER"]) == 1:
    with run.checkpoints.writing(5) as directory:
        (directory / "step.txt").write_text("5")
    print("attempt one is working", flush=True)
    while not Path(sys.argv[1]).exists():
        time.sleep(0.02)
    run.exit_preempted()
print(f"attempt two resumed from {run.checkpoints.latest().name}", flush=True)
run.finish()
"""

# Says hello, waits for the go-file, says bye.
CHATTY = """
import sys, time
from pathlib import Path

print(f"{sys.argv[1]} says hello", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.02)
print(f"{sys.argv[1]} says bye", flush=True)
"""


class Output:
    """What a subprocess has written to stdout so far, read without blocking past a deadline."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.data = b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(process.stdout, selectors.EVENT_READ)

    def until(self, *needles: str) -> str:
        """Read until every needle has appeared (fails after PATIENCE_S)."""
        deadline = time.monotonic() + PATIENCE_S
        while not all(n.encode() in self.data for n in needles):
            left = deadline - time.monotonic()
            assert left > 0, f"never printed {needles}; printed:\n{self.data.decode(errors='replace')}"
            if self.selector.select(timeout=min(left, 1.0)):
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    assert False, f"exited before printing {needles}:\n{self.data.decode(errors='replace')}"
                self.data += chunk
        return self.data.decode()

    def rest(self) -> str:
        """Everything up to the process's exit."""
        out, _ = self.process.communicate(timeout=PATIENCE_S)
        self.data += out
        return self.data.decode()


def _trackway(*args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    # The `cli` fixture has put TRACKWAY_DB and TRACKWAY_HOME into the environment.
    return subprocess.Popen([PY, "-m", "trackway", *args], stdout=stdout, stderr=subprocess.PIPE,
                            env=dict(os.environ), cwd=os.getcwd())


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def background(request):
    """`background(process)` ends the process at teardown if the test left it running."""
    started: list[subprocess.Popen] = []
    yield started.append
    for process in started:
        _stop(process)


def test_logs_follow_goes_on_with_the_resumed_attempt_and_stops_when_the_run_completes(cli, tmp_path, background):
    script, go = tmp_path / "spot.py", tmp_path / "go"
    script.write_text(SPOT)
    assert cli("submit", "--detach", "--name", "spot", "--", PY, str(script), str(go)).code == 0
    follower = _trackway("logs", "spot", "-f")
    background(follower)
    background(_trackway("supervise", "--interval", "0.1", stdout=subprocess.DEVNULL))
    output = Output(follower)
    output.until("attempt one is working")
    go.touch()  # attempt 1 leaves preempted; the supervisor resumes the run from step 5
    text = output.rest()
    assert follower.returncode == 0, follower.stderr.read().decode()
    lines = text.splitlines()
    banner = "── attempt 2 (resumed from step-00000005; attempt 1 ended preempted) ──"
    assert banner in lines, text
    at = lines.index(banner)
    assert any(line.endswith("out attempt one is working") for line in lines[:at]), text
    assert any(line.endswith("out attempt two resumed from step-00000005") for line in lines[at + 1:]), text
    (run,) = cli("runs", "--json").json()
    assert run["state"] == "completed" and run["attempt_count"] == 2


def test_logs_all_follow_prefixes_every_running_attempt_and_picks_up_new_ones(cli, tmp_path, background):
    script, go = tmp_path / "chatty.py", tmp_path / "go"
    script.write_text(CHATTY)
    assert cli("submit", "--detach", "--name", "alpha", "--", PY, str(script), "alpha", str(go)).code == 0
    follower = _trackway("logs", "--all", "-f")
    background(follower)
    output = Output(follower)
    output.until("alpha says hello")
    # Started after the follower: it is picked up as it starts.
    assert cli("submit", "--detach", "--name", "beta", "--", PY, str(script), "beta", str(go)).code == 0
    output.until("beta says hello")
    go.touch()
    text = output.until("alpha says bye", "beta says bye")
    follower.send_signal(signal.SIGINT)  # it tails until interrupted
    assert follower.wait(timeout=PATIENCE_S) == 130
    lines = [line for line in text.splitlines() if line]
    assert all(line.startswith(("alpha/1 | ", "beta/1 | ")) for line in lines), text
    for name in ("alpha", "beta"):
        assert any(line.startswith(f"{name}/1 | ") and line.endswith(f"out {name} says hello") for line in lines)
        assert any(line.startswith(f"{name}/1 | ") and line.endswith(f"out {name} says bye") for line in lines)


def test_the_separator_says_who_started_an_attempt_when_a_person_did():
    first = {"attempt_number": 1, "termination_reason": "oom"}
    by_hand = {"attempt_number": 2, "resumed_from_checkpoint": None,
               "started_by": "trackway resume --set batch_size=8 (ana@gpu3)"}
    assert separator(first, by_hand) == (
        "── attempt 2 (from the start: no committed checkpoint; attempt 1 ended oom; "
        "started by trackway resume --set batch_size=8 (ana@gpu3)) ──"
    )
    by_policy = {"attempt_number": 2, "resumed_from_checkpoint": "step-00000040",
                 "started_by": "supervisor: preempted: resume (1 of 10)"}
    assert separator({"attempt_number": 1, "termination_reason": "preempted"}, by_policy) == (
        "── attempt 2 (resumed from step-00000040; attempt 1 ended preempted) ──"
    )
