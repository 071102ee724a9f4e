"""A preemption notice is never swallowed: what the SDK does after one, by what the script does next.

Each script runs as a real process joined to an attempt (TRACKWAY_* environment, no ledger needed)
and sends itself a real SIGTERM; the attempt's spool (note, events) is what the supervisor would read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trackway.spool import EVENTS_FILE, NOTE_FILE

PRELUDE = """
import os, signal, sys, time
import trackway

run = trackway.init({init})

def notice():
    os.kill(os.getpid(), signal.SIGTERM)

def steps(first, last):
    for step in range(first, last):
        run.log({"loss": 1.0 / (step + 1)}, step=step)

"""


@dataclass
class Ended:
    code: int
    seconds: float
    out: str
    err: str
    note: dict[str, Any] | None
    events: list[dict[str, Any]]

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]


def _attempt(tmp_path: Path, body: str, poll_s: float = 0.5, init: str = "", name: str = "train") -> Ended:
    script = tmp_path / f"{name}.py"
    script.write_text(PRELUDE.replace("{init}", init) + body)
    spool = tmp_path / name / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKWAY_")}
    env.update(
        TRACKWAY_RUN_ID="r1", TRACKWAY_ATTEMPT_ID="r1/1", TRACKWAY_SPOOL_DIR=str(spool),
        TRACKWAY_CHECKPOINT_DIR=str(tmp_path / name / "checkpoints"), TRACKWAY_NOTICE_POLL_S=str(poll_s),
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    note = json.loads((spool / NOTE_FILE).read_text()) if (spool / NOTE_FILE).exists() else None
    events = [json.loads(line) for line in (spool / EVENTS_FILE).read_text().splitlines()]
    return Ended(done.returncode, time.monotonic() - started, done.stdout, done.stderr, note, events)


@pytest.mark.parametrize(
    "trains_on",
    [
        "while True:\n    time.sleep(0.05)\n",  # a busy loop that neither logs nor polls
        "time.sleep(60)\n",  # one long blocking call: the re-delivered notice wakes it
    ],
)
def test_a_script_that_never_reads_should_stop_is_ended_preempted_after_the_poll_window(tmp_path, trains_on):
    ended = _attempt(tmp_path, "steps(0, 3)\nnotice()\n" + trains_on + "print('trained on')\n")
    assert ended.code == 75, ended.err
    assert ended.seconds < 10  # the window is 0.5 s; the executor's grace (30 s) is never reached
    assert ended.note["reason"] == "preempted" and ended.note["ended_by"] == "trackway"
    assert "did not read run.should_stop within 0.5 s" in ended.note["message"]
    assert "trained on" not in ended.out
    assert ended.kinds()[-2:] == ["preemption_notice", "termination_note"]


def test_a_script_that_logs_a_second_step_without_reading_it_is_ended_at_that_log(tmp_path):
    ended = _attempt(tmp_path, "steps(0, 3)\nnotice()\nsteps(3, 10)\nprint('trained on')\n", poll_s=60)
    assert ended.code == 75, ended.err
    assert ended.note["message"].startswith("preemption notice (SIGTERM) at step 4; the script logged step 4 without")
    assert "trained on" not in ended.out


def test_a_script_that_reads_should_stop_keeps_control_past_the_window(tmp_path):
    body = """
steps(0, 3)
notice()
run.log({"loss": 0.5}, step=3)  # the step under way when the notice came, logged twice
run.log({"lr": 0.1}, step=3)
assert run.should_stop
steps(4, 8)  # a slow final save: longer than the poll window, on steps the script chose to take
time.sleep(1.5)
print("saved", flush=True)
run.exit_preempted()
"""
    ended = _attempt(tmp_path, body)
    assert ended.code == 75, ended.err
    assert "saved" in ended.out
    assert ended.note["message"] == "preemption notice (SIGTERM) at step 7; resume from the start (no checkpoint yet)"
    assert "ended_by" not in ended.note


def test_a_script_that_swallows_the_exit_is_ended_anyway(tmp_path):
    body = """
steps(0, 3)
notice()
while True:
    try:
        time.sleep(60)
    except SystemExit:
        print("swallowed", flush=True)
"""
    ended = _attempt(tmp_path, body)
    assert ended.code == 75 and "swallowed" in ended.out
    assert ended.note["reason"] == "preempted" and ended.seconds < 10


def test_a_main_thread_that_cannot_take_the_notice_is_ended_from_the_watchdog(tmp_path):
    # Blocking SIGTERM in the main thread stands for native code that never returns to Python.
    body = "steps(0, 3)\nnotice()\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\ntime.sleep(60)\n"
    ended = _attempt(tmp_path, body)
    assert ended.code == 75 and ended.seconds < 10
    assert "nor stop when told, so trackway ended the attempt" in ended.note["message"]
    assert ended.kinds()[-1] == "termination_note"  # the spool was closed and flushed before os._exit


@pytest.mark.parametrize(
    ("after", "code", "fragment"),
    [
        ("run.finish()\nprint('after finish')\n", 75, "run.finish() came after it, with the work cut short"),
        ("pass\n", 0, "the script exited without run.finish()"),
        ("{}['missing']\n", 1, "then the script raised KeyError: 'missing'"),
    ],
)
def test_a_notice_not_followed_by_exit_preempted_still_ends_preempted(tmp_path, after, code, fragment):
    # A framework's SIGTERM handling stops the loop early; the script then finishes, exits or trips.
    ended = _attempt(tmp_path, "steps(0, 3)\nnotice()\nassert run.should_stop\n" + after)
    assert ended.code == code, ended.err
    assert ended.note["reason"] == "preempted" and fragment in ended.note["message"]
    assert "after finish" not in ended.out


def test_a_notice_after_finish_ends_nothing_and_records_nothing(tmp_path):
    body = """
steps(0, 3)
trackways = signal.getsignal(signal.SIGTERM)
told = []

def framework_handler(signum, frame):  # a framework's handler that chains the one it replaced (Lightning's does)
    told.append(signum)
    trackways(signum, frame)

signal.signal(signal.SIGTERM, framework_handler)
run.finish()
notice()
time.sleep(0.2)
assert not run.should_stop
print("still here", told, flush=True)
"""
    ended = _attempt(tmp_path, body)
    assert ended.code == 0, ended.err
    assert "still here [15]" in ended.out
    assert ended.note is None and "preemption_notice" not in ended.kinds()
    assert ended.kinds()[-1] == "finished"


def test_the_config_given_to_init_is_told_to_the_spool_json_safe(tmp_path):
    plain = _attempt(tmp_path, "run.finish()\n", name="plain")
    assert "init_config" not in plain.kinds()  # no config given: nothing for the ingester to merge
    config = "config={'lr': 0.1, 'layers': (2, 3), 'out': __import__('pathlib').Path('/x'), 'opt': {'fn': print}}"
    ended = _attempt(tmp_path, "run.finish()\n", init=config, name="configured")
    [said] = [e["config"] for e in ended.events if e["kind"] == "init_config"]
    assert said == {"lr": 0.1, "layers": [2, 3], "out": "PosixPath('/x')", "opt": {"fn": "<built-in function print>"}}


def test_a_notice_before_any_step_says_so_not_step_none(tmp_path):
    body = """
notice()
assert run.should_stop
run.exit_preempted()
"""
    ended = _attempt(tmp_path, body)
    assert ended.code == 75, ended.err
    assert ended.note["message"] == ("preemption notice (SIGTERM) before any step was logged; resume from the start "
                                     "(no checkpoint yet)")
