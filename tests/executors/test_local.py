"""The local executor with real processes and real signals: exit status, logs, limits, cancel, survival."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from trackway.errors import NotFound
from trackway.executors.base import JobHandle, JobPhase
from trackway.executors.local import LocalExecutor
from trackway.executors.local_shim import read_json
from trackway.executors.process_tree import group_alive, launch_times

from .conftest import is_alive, log_lines, log_text, python, wait_ended, wait_for, wait_terminal

# Writes its pid to argv[1] once it ignores SIGTERM, so only SIGKILL can end it.
STUBBORN_GRANDCHILD = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.replace(sys.argv[1] + '.tmp', sys.argv[1]); "
    "time.sleep(120)"
)


def read_pid(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text(), f"pid file {path}"))


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_is_reported(executor, make_request, code):
    sub = executor.submit(make_request(python(f"import sys; sys.exit({code})")))

    status = wait_ended(executor, sub.handle)

    assert (status.exit_code, status.signal, status.timed_out, status.cancelled) == (code, None, False, False)
    assert status.started_at == sub.started_at
    assert status.ended_at >= status.started_at
    assert status.evidence == ()


def test_a_commands_start_is_when_its_process_started_not_when_the_launcher_heard_of_it():
    # On a loaded host the launcher learns the pid late: an attempt's wall time (its GPU hours) would be cut short.
    tick = timedelta(milliseconds=20)  # /proc counts a start in 10 ms ticks, and its uptime in hundredths
    before = datetime.now(timezone.utc)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launched = datetime.now(timezone.utc)
    try:
        time.sleep(0.5)  # the launcher, late to hear of it
        asked = datetime.now(timezone.utc)
        created, started = launch_times(child.pid)
        assert before - tick <= started <= launched + tick < asked
        assert created is not None  # the same read names the process
    finally:
        child.kill()
        child.wait()
    asked = datetime.now(timezone.utc)
    created, gone = launch_times(child.pid)  # no /proc entry: now, the launcher's own reading
    assert created is None and asked <= gone <= datetime.now(timezone.utc)


def test_submission_names_the_shim_and_the_child(executor, make_request):
    before = datetime.now(timezone.utc)
    sub = executor.submit(make_request(python("print('hi')")))

    assert sub.handle.executor == "local"
    assert int(sub.handle.job_id) > 0 and sub.pid > 0 and int(sub.handle.job_id) != sub.pid
    assert sub.gpu_ids == [] and sub.gpu_model is None
    assert sub.host
    assert sub.started_at.tzinfo is not None
    assert before - timedelta(seconds=1) <= sub.started_at <= datetime.now(timezone.utc)
    wait_ended(executor, sub.handle)


def test_child_killed_by_sigkill_reports_signal_9(executor, make_request):
    sub = executor.submit(make_request(python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")))

    status = wait_ended(executor, sub.handle)

    assert (status.exit_code, status.signal) == (None, 9)


def test_exit_137_stays_an_exit_code(executor, make_request):
    sub = executor.submit(make_request(python("import sys; sys.exit(137)")))

    status = wait_ended(executor, sub.handle)

    assert (status.exit_code, status.signal) == (137, None)


def test_stdout_and_stderr_land_in_the_log_with_timestamps_and_tags(executor, make_request):
    request = make_request(python("""
        import sys
        for i in range(5):
            print(f"line {i}", flush=True)
            print(f"problem {i}", file=sys.stderr, flush=True)
        sys.stdout.write("no newline at the end")
    """))
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    sub = executor.submit(request)
    wait_ended(executor, sub.handle)
    after = datetime.now(timezone.utc)

    assert executor.logs(sub.handle) == request.log_path
    lines = log_lines(request.log_path)
    out = [(stamp, text) for stamp, tag, text in lines if tag == "out"]
    err = [(stamp, text) for stamp, tag, text in lines if tag == "err"]
    assert [text for _, text in out] == [f"line {i}" for i in range(5)] + ["no newline at the end"]
    assert [text for _, text in err] == [f"problem {i}" for i in range(5)]
    for stream in (out, err):
        stamps = [stamp for stamp, _ in stream]
        assert stamps == sorted(stamps)
        assert before <= stamps[0] and stamps[-1] <= after


def test_request_env_and_cwd_reach_the_child(executor, make_request, tmp_path, monkeypatch):
    monkeypatch.setenv("TW_INHERITED", "from-os-environ")
    work = tmp_path / "work dir"
    work.mkdir()
    request = make_request(
        python("import os; print(os.environ['TW_PROBE'], os.environ['TW_INHERITED'], os.getcwd())"),
        env={"TW_PROBE": "hello world"},
        cwd=work,
    )

    wait_ended(executor, executor.submit(request).handle)

    assert [text for _, _, text in log_lines(request.log_path)] == [f"hello world from-os-environ {work}"]


def test_command_runs_in_its_own_process_group(executor, make_request):
    request = make_request(python("import os; print(os.getpid(), os.getpgid(0), os.getsid(0))"))

    sub = executor.submit(request)
    wait_ended(executor, sub.handle)

    pid, pgid, sid = map(int, log_lines(request.log_path)[0][2].split())
    assert pid == pgid == sid == sub.pid
    assert pgid != os.getpgid(0)


def test_time_limit_sends_sigterm_then_sigkill_to_the_whole_group(executor, make_request, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    request = make_request(
        python(f"""
            import signal, subprocess, sys, time
            signal.signal(signal.SIGTERM, lambda signum, frame: print("child got SIGTERM", flush=True))
            subprocess.Popen([sys.executable, "-c", {STUBBORN_GRANDCHILD!r}, sys.argv[1]])
            while True:
                time.sleep(1)
        """, pid_file),
        time_limit_s=1,
        grace_s=1,
    )

    sub = executor.submit(request)
    status = wait_ended(executor, sub.handle)

    assert status.timed_out and not status.cancelled
    assert (status.exit_code, status.signal) == (None, 9)
    assert "child got SIGTERM" in log_text(request.log_path)
    assert any(line.startswith("time limit 1 s reached: sent SIGTERM") for line in status.evidence), status.evidence
    assert any(line.endswith("sent SIGKILL") for line in status.evidence), status.evidence
    assert status.ended_at - status.started_at >= timedelta(seconds=2)
    grandchild = read_pid(pid_file)
    wait_for(lambda: not is_alive(grandchild), "the grandchild to die")
    wait_for(lambda: not group_alive(sub.pid), "the process group to be gone")


@pytest.mark.parametrize(
    ("handler", "exit_code", "signum"),
    [("", None, signal.SIGTERM), ("signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))", 7, None)],
    ids=["killed-by-sigterm", "exits-on-sigterm"],
)
def test_child_that_stops_on_sigterm_ends_within_the_grace(executor, make_request, handler, exit_code, signum):
    request = make_request(
        python(f"import signal, sys, time\n{handler}\ntime.sleep(120)"),
        time_limit_s=1,
        grace_s=20,
    )

    sub = executor.submit(request)
    status = wait_ended(executor, sub.handle)

    assert status.timed_out
    assert (status.exit_code, status.signal) == (exit_code, signum)
    assert not any(line.endswith("sent SIGKILL") for line in status.evidence), status.evidence
    assert status.ended_at - status.started_at < timedelta(seconds=15)


def test_cancel_ends_the_job_and_its_grandchildren(executor, make_request, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    request = make_request(
        python(f"""
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", {STUBBORN_GRANDCHILD!r}, sys.argv[1]])
            time.sleep(120)
        """, pid_file),
        grace_s=30,
    )
    sub = executor.submit(request)
    grandchild = read_pid(pid_file)

    started = time.monotonic()
    executor.cancel(sub.handle)
    assert time.monotonic() - started < 2.0
    status = wait_ended(executor, sub.handle)

    assert status.cancelled and not status.timed_out
    assert (status.exit_code, status.signal) == (None, signal.SIGTERM)
    assert any(line.startswith("cancel requested: sent SIGTERM") for line in status.evidence), status.evidence
    # The grandchild ignores SIGTERM; it dies with its group when the command exits, not after the grace.
    assert any("killed 1 process left in process group" in line for line in status.evidence), status.evidence
    assert status.ended_at - status.started_at < timedelta(seconds=20)
    wait_for(lambda: not is_alive(grandchild), "the grandchild to die")
    wait_for(lambda: not group_alive(sub.pid), "the process group to be gone")


def test_shim_sends_usr1_and_sigterm_on_to_the_command(executor, make_request):
    """A preemption notice reaches the training process: SIGUSR1 (Slurm's --signal=B:USR1) stops
    nothing and is noted with its time; SIGTERM then ends the job as before."""
    sub = executor.submit(make_request(python("""
        import signal, sys, time
        def on(signum, frame):
            print("got", signal.Signals(signum).name, flush=True)
            if signum == signal.SIGTERM:
                sys.exit(75)
        signal.signal(signal.SIGUSR1, on)
        signal.signal(signal.SIGTERM, on)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)))
    log = sub.handle.state_dir / "output.log"
    wait_for(lambda: "ready" in log_text(log), "the command to start")
    shim = int(sub.handle.job_id)

    os.kill(shim, signal.SIGUSR1)
    wait_for(lambda: "got SIGUSR1" in log_text(log), "the notice to reach the command")
    assert executor.poll(sub.handle).phase is JobPhase.RUNNING
    os.kill(shim, signal.SIGTERM)
    status = wait_ended(executor, sub.handle)

    assert (status.exit_code, status.signal) == (75, None)
    assert [text for _, tag, text in log_lines(log) if tag == "out"] == ["ready", "got SIGUSR1", "got SIGTERM"]
    assert any(line.startswith("executor shim received SIGUSR1 (a notice): sent it on to 1 process of the job"
                               f" with a handler for it (pid {sub.pid} (") for line in status.evidence), status.evidence
    notices = read_json(sub.handle.state_dir / "exit.json")["notices"]
    assert [notice["signal"] for notice in notices] == ["SIGUSR1"]


def test_cancelling_an_ended_job_does_nothing(executor, make_request):
    sub = executor.submit(make_request(python("pass")))
    before = wait_ended(executor, sub.handle)

    executor.cancel(sub.handle)

    assert executor.poll(sub.handle) == before
    assert not (sub.handle.state_dir / "cancel.json").exists()


def test_missing_executable_ends_with_127_and_says_why_in_the_log(executor, make_request, tmp_path):
    request = make_request([str(tmp_path / "no-such-command"), "--flag"])

    sub = executor.submit(request)
    status = wait_ended(executor, sub.handle)

    assert sub.pid is None
    assert (status.exit_code, status.signal) == (127, None)
    assert "trackway: cannot start command:" in log_text(request.log_path)
    assert any("no-such-command" in line for line in status.evidence), status.evidence


def test_shim_killed_while_the_command_runs_then_the_command_dies(executor, make_request):
    request = make_request(python("import time; print('ready', flush=True); time.sleep(120)"))
    sub = executor.submit(request)
    shim_pid = int(sub.handle.job_id)
    wait_for(lambda: "ready" in log_text(request.log_path), "the command to start")

    os.kill(shim_pid, signal.SIGKILL)
    orphaned = wait_for(lambda: executor.poll(sub.handle).evidence and executor.poll(sub.handle),
                        "poll to notice the shim is gone")

    assert orphaned.phase is JobPhase.RUNNING
    assert orphaned.evidence == (
        f"executor shim pid {shim_pid} is gone; the command (pid {sub.pid}) still runs, unsupervised",
    )
    os.kill(sub.pid, signal.SIGKILL)
    status = wait_terminal(executor, sub.handle)
    assert status.phase is JobPhase.VANISHED
    assert status.evidence == (f"executor shim pid {shim_pid} is gone and left no exit status",)
    assert not status.cancelled


def test_cancel_without_a_shim_still_stops_the_group(executor, make_request):
    request = make_request(
        python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
               "time.sleep(120)"),
        grace_s=1,
    )
    sub = executor.submit(request)
    wait_for(lambda: "ready" in log_text(request.log_path), "the command to start")
    os.kill(int(sub.handle.job_id), signal.SIGKILL)
    wait_for(lambda: executor.poll(sub.handle).evidence, "poll to notice the shim is gone")

    executor.cancel(sub.handle)
    status = wait_terminal(executor, sub.handle)

    assert status.phase is JobPhase.VANISHED and status.cancelled
    wait_for(lambda: not group_alive(sub.pid), "the process group to be gone")


def test_job_outlives_the_process_that_submitted_it(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    state_dir = tmp_path / "attempts" / "detached"
    command = python("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)\nsys.exit(5)", go)
    submitter = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from trackway.executors.base import LaunchRequest
        from trackway.executors.local import LocalExecutor
        home, state_dir, command = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
        request = LaunchRequest(attempt_id="r0000000000/1", command=command, cwd=state_dir.parent, env={},
                                state_dir=state_dir, log_path=state_dir / "output.log")
        sub = LocalExecutor(Path(home), gpu_inventory=lambda: []).submit(request)
        print(json.dumps({"job_id": sub.handle.job_id, "state_dir": str(sub.handle.state_dir)}))
    """)

    done = subprocess.run([sys.executable, "-c", submitter, str(home), str(state_dir), json.dumps(command)],
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    handle = JobHandle(executor="local", job_id=info["job_id"], state_dir=Path(info["state_dir"]))
    executor = LocalExecutor(home, gpu_inventory=lambda: [])
    assert executor.poll(handle).phase is JobPhase.RUNNING
    go.touch()
    assert wait_ended(executor, handle).exit_code == 5


def test_poll_and_logs_of_a_directory_with_no_job(executor, tmp_path):
    handle = JobHandle(executor="local", job_id="1", state_dir=tmp_path / "nothing")

    status = executor.poll(handle)

    assert status.phase is JobPhase.VANISHED
    assert "never started" in status.evidence[0]
    with pytest.raises(NotFound):
        executor.logs(handle)
    with pytest.raises(NotFound):
        executor.cancel(handle)


def test_state_is_readable_from_files(executor, make_request):
    sub = executor.submit(make_request(python("import sys; sys.exit(2)"), time_limit_s=60, grace_s=5))
    wait_ended(executor, sub.handle)
    state_dir = sub.handle.state_dir

    launch, job, ended = (read_json(state_dir / name) for name in ("launch.json", "job.json", "exit.json"))

    assert launch["time_limit_s"] == 60 and launch["grace_s"] == 5 and launch["gpu_ids"] == []
    assert job["shim_pid"] == int(sub.handle.job_id) and job["child_pid"] == job["pgid"] == sub.pid
    assert isinstance(job["create_time"], float)
    assert ended["exit_code"] == 2 and ended["cancelled"] is False
    assert (state_dir / "shim.err").read_text() == ""
    # A second executor object (another process, say) reads the same answer.
    assert LocalExecutor(executor.home, gpu_inventory=lambda: []).poll(sub.handle) == executor.poll(sub.handle)


def test_a_supervisor_polling_every_tick_reads_job_json_once_per_running_job(
    executor, make_request, tmp_path, monkeypatch
):
    import trackway.executors.local as local

    reads: list[str] = []
    real_read_json = local.read_json

    def counting_read_json(path: Path):
        reads.append(Path(path).name)
        return real_read_json(path)

    monkeypatch.setattr(local, "read_json", counting_read_json)
    go = tmp_path / "go"
    waits_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"
    first = executor.submit(make_request(python(waits_for_go)))
    second = executor.submit(make_request(python("import time; time.sleep(120)")))
    handles = [first.handle, second.handle]

    for _ in range(5):
        assert {status.phase for status in executor.poll_many(handles).values()} == {JobPhase.RUNNING}
    assert reads.count("job.json") == 2  # once for each job, not once a tick

    go.touch()
    wait_for(lambda: executor.poll_many(handles)[first.handle.job_id].phase is JobPhase.ENDED, "the first job to end")
    status = executor.poll_many(handles)[first.handle.job_id]
    assert status.phase is JobPhase.ENDED and status.exit_code == 0
    # A job no longer asked about is forgotten: asked again, its job.json is read again.
    executor.poll_many([])
    before = reads.count("job.json")
    assert executor.poll_many([second.handle])[second.handle.job_id].phase is JobPhase.RUNNING
    assert reads.count("job.json") == before + 1


def test_group_members_are_the_live_processes_of_that_group_only(tmp_path):
    from trackway.executors.process_tree import group_members

    # A group of three: the shell (left a zombie once it exits, since we do not reap it yet), and two sleepers.
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo started; exec true"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    outsider = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == "started"
        wait_for(lambda: len(group_members(leader.pid)) == 2, "the leader to exit and leave its two sleepers")
        members = group_members(leader.pid)
        assert leader.pid not in members and outsider.pid not in members  # a zombie, and another group
        assert all(os.getpgid(pid) == leader.pid for pid in members)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        outsider.kill()
        leader.wait()
        outsider.wait()
