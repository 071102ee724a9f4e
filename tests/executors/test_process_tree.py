"""An attempt ends with its whole process tree: ranks that left the launcher's session die with the attempt.

torchrun starts every rank with start_new_session=True, so a signal to the launcher's process
group misses them. These tests run real torchrun jobs (2 ranks, gloo) and cheaper `setsid`
children, end them every way an attempt ends, and check /proc for the ranks' pids.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from trackway.executors.base import JobPhase
from trackway.executors.local_shim import read_json
from trackway.executors.process_tree import job_survivors

from .conftest import is_alive, log_text, python, wait_ended, wait_for, wait_terminal

PY = Path(sys.executable).name[:15]  # the command name /proc gives the children (comm: 15 bytes at most)

# A DDP rank on gloo that writes its pid (and its session) to PID_DIR/rank<N>.pid, then loops;
# with IGNORE_TERM set it ignores SIGTERM, so only SIGKILL ends it.
RANK = """
import os, signal, sys, time
import torch.distributed as dist
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.init_process_group("gloo")
path = os.path.join(os.environ["PID_DIR"], f"rank{dist.get_rank()}.pid")
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getsid(0)}")
os.replace(path + ".tmp", path)
while True:
    time.sleep(0.2)
"""

# A launcher that starts `count` children in sessions of their own (as torchrun does), each
# ignoring SIGTERM and writing its pid to PID_DIR/child<N>.pid, then sleeps or exits.
SETSID_LAUNCHER = """
import os, subprocess, sys, time
child = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "p = sys.argv[1]; open(p + '.tmp', 'w').write(str(os.getpid())); os.replace(p + '.tmp', p); "
         "time.sleep(120)")
count, then = int(sys.argv[1]), sys.argv[2]
for n in range(count):
    path = os.path.join(os.environ["PID_DIR"], f"child{n}.pid")
    subprocess.Popen([sys.executable, "-c", child, path], start_new_session=True)
    while not os.path.exists(path):
        time.sleep(0.01)
print("children started", flush=True)
if then == "sleep":
    time.sleep(120)
"""


@pytest.fixture
def pid_dir(tmp_path: Path):
    """Where the job's processes write their pids; whatever is still alive at the end is killed (a failed test)."""
    directory = tmp_path / "pids"
    directory.mkdir()
    yield directory
    for path in directory.glob("*.pid"):
        pid = int(path.read_text().split()[0])
        if is_alive(pid):
            os.kill(pid, signal.SIGKILL)


def read_pids(pid_dir: Path, prefix: str, count: int) -> list[int]:
    def all_there():
        paths = sorted(pid_dir.glob(f"{prefix}*.pid"))
        return len(paths) == count and [int(path.read_text().split()[0]) for path in paths]

    return wait_for(all_there, f"{count} {prefix} pid files in {pid_dir}", timeout=120)


def torchrun_request(make_request, tmp_path: Path, pid_dir: Path, ignore_term: bool, **kwargs):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    env = {"PID_DIR": str(pid_dir), "OMP_NUM_THREADS": "1"}
    if ignore_term:
        env["IGNORE_TERM"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    return make_request(command, env=env, **kwargs)


def gone_at_once(pids: list[int]) -> list[int]:
    """The pids still alive now: asked right when the end is reported, no waiting."""
    return [pid for pid in pids if is_alive(pid)]


def test_torchrun_launcher_killed_by_sigkill_leaves_no_rank(executor, make_request, tmp_path, pid_dir):
    """The issue's case: the launcher SIGKILLed, its two ranks in sessions of their own."""
    sub = executor.submit(torchrun_request(make_request, tmp_path, pid_dir, ignore_term=True, grace_s=1))
    ranks = read_pids(pid_dir, "rank", 2)
    assert all(os.getsid(pid) != sub.pid for pid in ranks)  # what made them survive before

    os.kill(sub.pid, signal.SIGKILL)
    status = wait_ended(executor, sub.handle, timeout=60)

    assert gone_at_once(ranks) == []
    assert (status.exit_code, status.signal) == (None, signal.SIGKILL)
    evidence = " ".join(status.evidence)
    assert "the command exited with 2 processes of it still running" in evidence, status.evidence
    assert all(f"pid {pid} (" in evidence for pid in ranks), status.evidence
    assert "still running 1 s after SIGTERM: sent SIGKILL" in evidence, status.evidence


def test_cancel_of_a_torchrun_job_whose_ranks_ignore_sigterm_leaves_no_rank(executor, make_request, tmp_path,
                                                                            pid_dir):
    sub = executor.submit(torchrun_request(make_request, tmp_path, pid_dir, ignore_term=True, grace_s=1))
    ranks = read_pids(pid_dir, "rank", 2)

    executor.cancel(sub.handle)
    status = wait_ended(executor, sub.handle, timeout=60)

    assert gone_at_once(ranks) == []
    assert status.cancelled
    sigterm, sigkill = status.evidence[:2]
    assert sigterm.startswith(f"cancel requested: sent SIGTERM to process group {sub.pid} and to 2 processes outside"
                              " it (pid "), status.evidence
    assert sigkill.endswith("sent SIGKILL") and all(f"pid {pid} (" in sigkill for pid in ranks), status.evidence
    assert f"pid {sub.pid} (" in sigkill  # the launcher, named with its ranks


def test_launcher_that_exits_0_leaving_a_child_behind_ends_without_hanging(executor, make_request, pid_dir):
    request = make_request(python(SETSID_LAUNCHER, 1, "exit"), env={"PID_DIR": str(pid_dir)}, grace_s=1)

    sub = executor.submit(request)
    status = wait_ended(executor, sub.handle)

    (child,) = read_pids(pid_dir, "child", 1)
    assert gone_at_once([child]) == []
    assert (status.exit_code, status.signal) == (0, None)
    assert status.evidence == (
        f"the command exited with 1 process of it still running (pid {child} ({PY})): sent SIGTERM,"
        " SIGKILL after 1 s grace",
        f"pid {child} ({PY}) still running 1 s after SIGTERM: sent SIGKILL",
    )
    assert f"trackway: pid {child}" in log_text(request.log_path)


def test_time_limit_ends_children_in_sessions_of_their_own(executor, make_request, pid_dir):
    request = make_request(python(SETSID_LAUNCHER, 2, "sleep"), env={"PID_DIR": str(pid_dir)}, time_limit_s=2,
                           grace_s=1)

    sub = executor.submit(request)
    children = read_pids(pid_dir, "child", 2)
    status = wait_ended(executor, sub.handle)

    assert gone_at_once(children) == []
    assert status.timed_out
    assert status.evidence[0].startswith("time limit 2 s reached: sent SIGTERM to process group"), status.evidence
    assert all(f"pid {pid} ({PY})" in status.evidence[0] for pid in children), status.evidence


def test_shim_killed_then_the_launcher_exits_its_children_are_stopped_before_the_end(executor, make_request,
                                                                                     pid_dir):
    """The shim SIGKILLed (nothing left to supervise the tree): poll finds the survivors and stops them first."""
    go = pid_dir / "go"
    launcher = SETSID_LAUNCHER.replace('if then == "sleep":\n    time.sleep(120)',
                                       "while not os.path.exists(os.path.join(os.environ['PID_DIR'], 'go')):\n"
                                       "    time.sleep(0.02)")
    request = make_request(python(launcher, 2, "wait"), env={"PID_DIR": str(pid_dir)}, grace_s=1)
    sub = executor.submit(request)
    children = read_pids(pid_dir, "child", 2)
    shim_pid = int(sub.handle.job_id)

    os.kill(shim_pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(shim_pid), "the shim to die")
    go.touch()
    wait_for(lambda: not is_alive(sub.pid), "the launcher to exit")
    stopping = executor.poll(sub.handle)
    status = wait_terminal(executor, sub.handle)

    assert stopping.phase is JobPhase.RUNNING, stopping
    assert "stopping" in stopping.evidence[0], stopping.evidence
    assert gone_at_once(children) == []
    assert status.phase is JobPhase.VANISHED
    assert status.evidence[0] == f"executor shim pid {shim_pid} is gone and left no exit status"
    assert status.evidence[1].startswith(f"executor shim pid {shim_pid} gone: sent SIGTERM to 2 processes of the job")
    assert all(f"pid {pid} ({PY})" in status.evidence[2] for pid in children), status.evidence
    assert status.evidence[2].endswith("sent SIGKILL")
    assert job_survivors(read_json(sub.handle.state_dir / "job.json")) == []


def test_cancel_without_a_shim_stops_children_in_sessions_of_their_own(executor, make_request, pid_dir):
    request = make_request(python(SETSID_LAUNCHER, 1, "sleep"), env={"PID_DIR": str(pid_dir)}, grace_s=1)
    sub = executor.submit(request)
    (child,) = read_pids(pid_dir, "child", 1)
    os.kill(int(sub.handle.job_id), signal.SIGKILL)
    wait_for(lambda: executor.poll(sub.handle).evidence, "poll to notice the shim is gone")

    executor.cancel(sub.handle)
    status = wait_terminal(executor, sub.handle)

    assert status.phase is JobPhase.VANISHED and status.cancelled
    assert gone_at_once([child, sub.pid]) == []
    assert any(f"pid {child} ({PY})" in line and line.endswith("sent SIGKILL") for line in status.evidence), \
        status.evidence


def test_cancel_on_an_ssh_host_ends_children_in_sessions_of_their_own(tmp_path, loopback_host):
    """The host runs a copy of the same shim: what it stops, and names, is the same there."""
    from .test_ssh import launch, resource

    script = ("import os, subprocess, sys, time\n"
              "child = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(301)'\n"
              "subprocess.Popen([sys.executable, '-c', child], start_new_session=True)\n"
              "print('up', flush=True)\ntime.sleep(300)\n")
    executor, request = launch(tmp_path, resource(loopback_host), script)
    submission = executor.submit(request)

    def the_child():
        return loopback_host.running("time.sleep(301)")

    def started():
        executor.poll(submission.handle)  # pulls the host's output.log here
        return "up" in log_text(request.log_path) and the_child()

    wait_for(started, "the command and its child to start", timeout=60, interval=0.2)
    (child,) = the_child()

    executor.cancel(submission.handle)
    status = wait_ended(executor, submission.handle, timeout=60)

    assert status.cancelled
    assert the_child() == []
    assert any(f"pid {child.pid} ({PY})" in line for line in status.evidence), status.evidence


def test_a_notice_reaches_the_ranks_and_does_not_kill_a_launcher_without_a_handler(executor, make_request, pid_dir):
    """torchrun has no SIGUSR1 handler (the default action kills it); its ranks, with the SDK's, have one."""
    launcher = """
import os, subprocess, sys, time
rank = ("import os, signal, sys, time; "
        "signal.signal(signal.SIGUSR1, lambda *a: print('rank got SIGUSR1', flush=True)); "
        "p = sys.argv[1]; open(p + '.tmp', 'w').write(str(os.getpid())); os.replace(p + '.tmp', p); "
        "time.sleep(120)")
subprocess.Popen([sys.executable, "-c", rank, os.path.join(os.environ["PID_DIR"], "rank0.pid")],
                 start_new_session=True)
time.sleep(120)
"""
    request = make_request(python(launcher), env={"PID_DIR": str(pid_dir)}, grace_s=1)
    sub = executor.submit(request)
    (rank,) = read_pids(pid_dir, "rank", 1)

    os.kill(int(sub.handle.job_id), signal.SIGUSR1)
    wait_for(lambda: "rank got SIGUSR1" in log_text(request.log_path), "the notice to reach the rank")

    assert is_alive(sub.pid) and executor.poll(sub.handle).phase is JobPhase.RUNNING
    executor.cancel(sub.handle)
    status = wait_ended(executor, sub.handle)
    assert status.evidence[0] == ("executor shim received SIGUSR1 (a notice): sent it on to 1 process of the job"
                                  f" with a handler for it (pid {rank} ({PY}))")
    assert gone_at_once([rank]) == []
