"""The local executor's host shim: one per home, killed or shut down mid-run, leaving when idle; real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from trackway.executors.base import JobHandle, JobPhase
from trackway.executors.local import LocalExecutor
from trackway.executors.local_shim import read_json

from .conftest import is_alive, log_text, python, wait_ended, wait_for, wait_terminal

WAITS_FOR_GO = "import os, sys, time\nprint('ready', flush=True)\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"


def host_pid(home: Path) -> int:
    """The home's host shim, as its lock file names it."""
    return int((home / "local" / "host.lock").read_text())


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def test_attempts_of_a_killed_host_run_on_and_end_with_no_made_up_exit_status(executor, make_request, tmp_path):
    go = tmp_path / "go"
    requests = [make_request(python(WAITS_FOR_GO, go)) for _ in range(3)]
    subs = [executor.submit(request) for request in requests]
    for request in requests:
        wait_for(lambda: "ready" in log_text(request.log_path), "the command to start")
    host = host_pid(executor.home)
    keepers = [int(sub.handle.job_id) for sub in subs]
    assert len(set(keepers)) == 3 and all(parent_of(parent_of(keeper)) == host for keeper in keepers)

    os.kill(host, signal.SIGKILL)

    for sub in subs:
        keeper = int(sub.handle.job_id)
        wait_for(lambda: not is_alive(keeper), "the keeper to leave with its host")
        status = executor.poll(sub.handle)
        assert status.phase is JobPhase.RUNNING
        assert status.evidence == (
            f"executor shim pid {keeper} is gone; the command (pid {sub.pid}) still runs, unsupervised",)
    go.touch()
    for sub in subs:
        status = wait_terminal(executor, sub.handle)
        assert status.phase is JobPhase.VANISHED and status.exit_code is None and status.signal is None
        assert status.evidence == (f"executor shim pid {sub.handle.job_id} is gone and left no exit status",)
        assert not (sub.handle.state_dir / "exit.json").exists()
    # The next submit starts a host of its own and is recorded as before.
    after = executor.submit(make_request(python("import sys; sys.exit(4)")))
    assert wait_ended(executor, after.handle).exit_code == 4
    assert host_pid(executor.home) != host


def test_a_killed_keeper_leaves_the_other_attempts_of_its_host_supervised(executor, make_request, tmp_path):
    go = tmp_path / "go"
    killed, kept = (executor.submit(make_request(python(WAITS_FOR_GO + "\nsys.exit(6)", go))) for _ in range(2))

    os.kill(int(killed.handle.job_id), signal.SIGKILL)
    wait_for(lambda: executor.poll(killed.handle).evidence, "poll to notice the keeper is gone")
    go.touch()

    assert wait_terminal(executor, killed.handle).phase is JobPhase.VANISHED
    assert wait_ended(executor, kept.handle).exit_code == 6


def test_two_submits_racing_on_a_fresh_home_start_one_host(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    submitter = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from trackway.executors.base import LaunchRequest
        from trackway.executors.local import LocalExecutor
        home, state_dir, command = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
        sys.stdin.readline()  # both wait here, then submit at once
        request = LaunchRequest(attempt_id="r0000000000/1", command=command, cwd=state_dir.parent, env={},
                                state_dir=state_dir, log_path=state_dir / "output.log")
        sub = LocalExecutor(Path(home), gpu_inventory=lambda: []).submit(request)
        print(json.dumps({"job_id": sub.handle.job_id, "state_dir": str(sub.handle.state_dir)}))
    """)
    command = json.dumps(python(WAITS_FOR_GO, go))
    racers = [subprocess.Popen([sys.executable, "-c", submitter, str(home), str(tmp_path / "attempts" / name),
                                command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for name in ("a", "b")]
    for racer in racers:
        racer.stdin.write("go\n")
        racer.stdin.flush()
    outputs = [racer.communicate(timeout=60)[0] for racer in racers]

    assert [racer.returncode for racer in racers] == [0, 0]
    handles = [JobHandle(executor="local", **json.loads(out)) for out in outputs]
    host = host_pid(home)
    assert [parent_of(parent_of(int(handle.job_id))) for handle in handles] == [host, host]
    # The host, its zygote and the keepers forked from it share one command line: one of them is no other's child.
    processes = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _is_host_of(pid, home)]
    assert [pid for pid in processes if parent_of(pid) not in processes] == [host]
    go.touch()
    executor = LocalExecutor(home, gpu_inventory=lambda: [])
    assert [wait_ended(executor, handle).exit_code for handle in handles] == [0, 0]


def _is_host_of(pid: int, home: Path) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"trackway.executors.local_host" in argv and str(home).encode() in argv


def test_a_host_shutdown_stops_every_attempt_as_a_shim_sigterm_did(executor, make_request):
    handler = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
               "print('ready', flush=True)\ntime.sleep(120)")
    requests = [make_request(python(handler)) for _ in range(2)]
    subs = [executor.submit(request) for request in requests]
    for request in requests:
        wait_for(lambda: "ready" in log_text(request.log_path), "the command to start")
    host = host_pid(executor.home)

    os.kill(host, signal.SIGTERM)

    for sub in subs:
        status = wait_ended(executor, sub.handle)
        assert (status.exit_code, status.signal, status.cancelled) == (75, None, False)
        assert status.evidence[0].startswith("executor shim received SIGTERM: sent SIGTERM to process group"), \
            status.evidence
    wait_for(lambda: not is_alive(host), "the host to leave once its attempts ended")


def test_the_host_leaves_once_idle_and_the_next_submit_starts_another(make_request, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKWAY_LOCAL_HOST_IDLE_S", "0.5")
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: [])
    first = executor.submit(make_request(python("pass")))
    assert wait_ended(executor, first.handle).exit_code == 0
    host = host_pid(executor.home)

    wait_for(lambda: not is_alive(host), "the idle host to leave")
    assert not (executor.home / "local" / "host.sock").exists()

    second = executor.submit(make_request(python("import sys; sys.exit(2)")))
    assert wait_ended(executor, second.handle).exit_code == 2
    assert host_pid(executor.home) != host
    assert read_json(second.handle.state_dir / "job.json")["shim_pid"] == int(second.handle.job_id)


def test_a_command_whose_submitter_died_before_hearing_it_started_ends_as_an_interrupted_launch(
        executor, make_request, tmp_path):
    """The submitter (`trackway submit`, a supervisor) killed mid-launch: the host stops the command it just
    started, and the SIGTERM that ended it is trackway's, not a preemption from outside (bench_supervisor_kills)."""
    from trackway.executors.local_host import host_paths, submitter_state
    from trackway.supervisor.classify import Evidence, classify
    from trackway.taxonomy import TerminationReason

    executor.submit(make_request(python("pass")))  # a host shim runs
    request = make_request(python(WAITS_FOR_GO, tmp_path / "never"))
    request.state_dir.mkdir(parents=True)
    (request.state_dir / "launch.json").write_text(json.dumps(executor._launch_record(request, [], [])))
    sock_path, _ = host_paths(executor.home)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as submitter:
        submitter.connect(str(sock_path))
        # ...and it is gone before the host answers. Shut for reading before it asks, so that the host's answer
        # fails even when a loaded machine lets the host answer before this test closes the socket.
        submitter.shutdown(socket.SHUT_RD)
        submitter.sendall(json.dumps({"state_dir": str(request.state_dir), **submitter_state()}).encode() + b"\n")

    job = wait_for(lambda: read_json(request.state_dir / "job.json"), "job.json to be written")
    handle = JobHandle("local", str(job["shim_pid"]), request.state_dir)
    status = wait_terminal(executor, handle)
    assert status.signal == signal.SIGTERM and status.reason == TerminationReason.INFRA_TRANSIENT.value
    (line,) = [line for line in status.evidence if "submitter" in line]
    assert line.startswith("the launch was interrupted: the submitter stopped waiting for the command to start")

    verdict = classify(Evidence(signal=status.signal, executor_reason=status.reason, executor_lines=status.evidence,
                                log_tail=log_text(request.log_path).splitlines()))
    assert verdict.reason is TerminationReason.INFRA_TRANSIENT  # retried, and never called a preemption
    assert any("launch was interrupted" in line for line in verdict.lines)


def test_a_shared_scan_of_process_groups_never_names_a_process_that_has_gone():
    """Ends in one burst share one /proc scan (GroupScans): what it found is checked alive when asked."""
    from trackway.executors.local_host import GroupScans

    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30; wait"], start_new_session=True)
    try:
        scans = GroupScans()
        wait_for(lambda: len(scans.members(leader.pid)) == 3, "the group's three processes")
        scans.MAX_AGE_S = 3600.0  # from now on, the scan above answers
        (first_sleep, *_) = sorted(pid for pid in scans.members(leader.pid) if pid != leader.pid)
        os.kill(first_sleep, signal.SIGKILL)
        wait_for(lambda: first_sleep not in scans.members(leader.pid), "the killed one to be left out")
        assert leader.pid in scans.members(leader.pid) and len(scans.members(leader.pid)) == 2
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
