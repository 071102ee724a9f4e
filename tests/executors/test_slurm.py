"""The Slurm executor against a real single-node Slurm (scripts/ensure-slurm.sh brings it up).

No mocks of Slurm: sbatch, squeue, scancel and sacct are the real ones. Where a test counts or
slows down Slurm commands, it puts a logging wrapper script in front of the real binary on PATH.
Without a cluster these tests fail with ensure-slurm.sh's one line, unless TRACKWAY_SKIP_SLURM=1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from trackway.errors import ExecutorError
from trackway.executors.base import JobHandle, JobPhase, JobStatus
from trackway.executors.registry import get_executor
from trackway.executors.slurm import JOB_ID_FILE, SlurmExecutor, render_script
from trackway.settings.resources import QosTier, Resource

from .conftest import log_lines, python, wait_for

DEADLINE_S = 60.0

# Prints each notice with the time it came; on SIGTERM exits 75 as the SDK's exit_preempted() does.
NOTICE_TRAP = """
import signal, sys, time
def on(signum, frame):
    print(f"notice {signal.Signals(signum).name} {time.time():.3f}", flush=True)
    if signum == signal.SIGTERM:
        sys.exit(75)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGTERM, on)
print(f"started {time.time():.3f}", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def slurm(slurm_node, tmp_path: Path):
    executor = SlurmExecutor(tmp_path / "home")
    yield executor
    # A failed test must not leave its jobs holding the node's CPUs and GPUs.
    ids = [(path.parent, path.read_text()) for path in tmp_path.rglob(JOB_ID_FILE)]
    job_ids = [json.loads(text)["job_id"] for _, text in ids]
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30)


def wait_phase(executor: SlurmExecutor, handle: JobHandle, phases: set[JobPhase], timeout: float = DEADLINE_S,
               interval: float = 0.1) -> JobStatus:
    def reached():
        status = executor.poll(handle)
        return status if status.phase in phases else None

    return wait_for(reached, f"job {handle.job_id} to reach {sorted(p.value for p in phases)}", timeout, interval)


def wait_ended(executor, handle, timeout: float = DEADLINE_S) -> JobStatus:
    status = wait_phase(executor, handle, {JobPhase.ENDED, JobPhase.VANISHED}, timeout)
    assert status.phase is JobPhase.ENDED, status
    return status


def out_lines(path: Path) -> list[str]:
    return [text for _, tag, text in log_lines(path) if tag == "out"]


def wrap_commands(tmp_path: Path, monkeypatch, names: tuple[str, ...], before: str = "") -> Path:
    """Put logging wrappers of Slurm's `names` first on PATH; returns the log (one line per call)."""
    bin_dir = tmp_path / "wrapped-bin"
    bin_dir.mkdir()
    calls = tmp_path / "slurm-calls.log"
    calls.touch()
    for name in names:
        real = shutil.which(name)
        assert real, name
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{before}exec {real} "$@"\n')
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


# -- completion, failure, signals ------------------------------------------------------------


def test_completion_is_ended_with_exit_code_0_and_placement(slurm, make_request):
    assert isinstance(get_executor("slurm", Path("/nonexistent")), SlurmExecutor)
    sub = slurm.submit(make_request(python("print('hello from slurm')")))
    assert sub.host == "", "submit() returns right after sbatch, before Slurm places the job"

    status = wait_ended(slurm, sub.handle)

    assert sub.handle.executor == "slurm" and sub.handle.job_id.isdigit() and sub.pid is None
    assert (status.exit_code, status.signal, status.timed_out, status.cancelled, status.reason) == (0, None, False,
                                                                                                      False, None)
    assert status.started_at <= status.ended_at
    assert status.evidence[0].startswith(f"slurm job {sub.handle.job_id}: COMPLETED")
    assert status.placement["slurm_job_id"] == sub.handle.job_id
    assert status.placement["partition"] == "test"  # the cluster's default partition
    assert status.placement["node_list"] == status.placement["host"].split(".")[0]
    assert out_lines(slurm.logs(sub.handle)) == ["hello from slurm"]
    # Once ended, the end is read back from the state directory: the same answer, no Slurm needed.
    assert slurm.poll(sub.handle) == status


def test_failure_keeps_exit_code_and_evidence(slurm, make_request):
    sub = slurm.submit(make_request(python("import sys; print('about to fail', file=sys.stderr); sys.exit(3)")))

    status = wait_ended(slurm, sub.handle)

    assert (status.exit_code, status.signal, status.reason, status.cancelled) == (3, None, None, False)
    assert f"slurm job {sub.handle.job_id}: FAILED (NonZeroExitCode), exit code 3:0" in status.evidence[0]
    assert [(tag, text) for _, tag, text in log_lines(slurm.logs(sub.handle))] == [("err", "about to fail")]


def test_death_by_signal_is_reported_as_the_signal(slurm, make_request):
    sub = slurm.submit(make_request(python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")))

    status = wait_ended(slurm, sub.handle)

    assert (status.exit_code, status.signal, status.reason) == (None, signal.SIGSEGV, None)
    # The shim exits 128 + 11, so Slurm's own record agrees that the job failed.
    assert "FAILED" in status.evidence[0] and "exit code 139:0" in status.evidence[0]


def test_gpus_environment_and_setup_prologue(slurm, make_request, tmp_path):
    resource = Resource(name="ci", executor="slurm", gpu="FakeGPU", partition="short",
                        qos=(QosTier("normal", 1),), setup="export FROM_SETUP=\"set up: $FROM_RUN\"")
    code = """
        import os
        print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('SLURM_JOB_PARTITION'))
        print(os.environ['FROM_SETUP'])
        print(os.environ['TRICKY'])
        print(sorted(k for k in os.environ if not k.startswith(('SLURM', 'CUDA_', 'GPU_', 'ROCR_', 'ZE_'))))
    """
    env = {"PATH": os.environ["PATH"], "FROM_RUN": "run's value", "TRICKY": "a 'b' \"c\" $d `e` \\f\nnext",
           "SLURM_JOB_ID": "stale, from where the run was submitted", "NOT-A-NAME": "skipped"}
    sub = slurm.submit(make_request(python(code), gpus=1, env=env, env_is_complete=True, resource=resource,
                                    qos="normal", time_limit_s=150))

    status = wait_ended(slurm, sub.handle)

    assert status.exit_code == 0, (status, (Path(sub.handle.state_dir) / "slurm.out").read_text())
    lines = out_lines(slurm.logs(sub.handle))
    assert lines[0] in ("0 short", "1 short")
    assert lines[1:4] == ["set up: run's value", "a 'b' \"c\" $d `e` \\f", "next"]
    # The whole environment is the run's: nothing from the supervisor's leaks in (bash adds PWD, SHLVL
    # and _; Python's C-locale coercion adds LC_CTYPE; the shim adds TRACKWAY_JOB_TREE, the mark by which it
    # finds the job's processes that left its session).
    assert set(eval(lines[4])) <= {"PATH", "FROM_RUN", "TRICKY", "FROM_SETUP", "PWD", "SHLVL", "_", "OLDPWD",
                                   "LC_CTYPE", "TRACKWAY_JOB_TREE"}
    assert status.placement["gpu_ids"] == [int(lines[0][0])]
    assert status.placement["partition"] == "short"
    assert sub.gpu_model == "FakeGPU"
    script = (Path(sub.handle.state_dir) / "slurm.sbatch").read_text()
    for option in ("--partition=short", "--qos=normal", "--time=3", "--gres=gpu:1", "--no-requeue",
                   "--open-mode=append", "--signal=B:USR1@30"):
        assert f"#SBATCH {option}\n" in script
    assert oct((Path(sub.handle.state_dir) / "slurm.sbatch").stat().st_mode & 0o777) == "0o600"


def test_a_failing_setup_prologue_is_in_the_log(slurm, make_request):
    resource = Resource(name="broken", executor="slurm", setup="module load cuda/99")
    sub = slurm.submit(make_request(python("print('never')"), resource=resource))

    status = wait_ended(slurm, sub.handle)

    assert status.exit_code == 127 and status.signal is None
    assert "the command never started" in " ".join(status.evidence)
    (line,) = log_lines(slurm.logs(sub.handle))
    assert line[1] == "err" and "setup prologue of resource broken failed with exit code 127" in line[2]


def test_memory_limit_kill_is_oom_with_slurmstepd_evidence(slurm, make_request):
    """Without cgroups OUT_OF_MEMORY never shows: OverMemoryKill ends the job FAILED 0:9, and
    slurmstepd says why in the batch output. That line is the evidence for "oom"."""
    resource = Resource(name="small", executor="slurm", sbatch=("--mem=200M",))
    code = """
        import time
        memory = bytearray(600 << 20)
        for i in range(0, len(memory), 4096):
            memory[i] = 1
        print('allocated', flush=True)
        time.sleep(60)
    """
    sub = slurm.submit(make_request(python(code), resource=resource))

    status = wait_ended(slurm, sub.handle)

    assert (status.reason, status.signal, status.exit_code) == ("oom", signal.SIGKILL, None), status
    assert "FAILED" in status.evidence[0] and "exit code 0:9" in status.evidence[0]
    assert any("exceeded memory limit" in line and "being killed" in line for line in status.evidence)


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_by_trackway_and_by_someone_else(slurm, make_request):
    ours = slurm.submit(make_request(python("import time; print('up', flush=True); time.sleep(300)")))
    theirs = slurm.submit(make_request(python("import time; print('up', flush=True); time.sleep(300)")))
    for sub in (ours, theirs):
        wait_for(lambda sub=sub: out_lines(slurm.logs(sub.handle)) if slurm.logs(sub.handle).exists() else None,
                 "the command to start", DEADLINE_S)

    slurm.cancel(ours.handle)
    subprocess.run(["scancel", theirs.handle.job_id], check=True, timeout=30)
    mine, other = wait_ended(slurm, ours.handle), wait_ended(slurm, theirs.handle)

    assert (mine.cancelled, mine.reason, mine.signal) == (True, None, signal.SIGTERM)
    assert "CANCELLED" in mine.evidence[0]
    assert (other.cancelled, other.reason, other.signal) == (False, "user_cancelled", signal.SIGTERM)
    assert any(line.startswith("cancelled outside trackway") for line in other.evidence), other.evidence
    slurm.cancel(ours.handle)  # cancelling an ended job does nothing


def test_cancel_while_queued(slurm, make_request):
    # Both fake GPUs taken: the second job waits in the queue.
    holder = slurm.submit(make_request(python("import time; time.sleep(300)"), gpus=2))
    queued = slurm.submit(make_request(python("print('never ran')"), gpus=2))
    status = wait_phase(slurm, queued.handle, {JobPhase.QUEUED})
    assert status.evidence and "PENDING" in status.evidence[0]

    slurm.cancel(queued.handle)
    slurm.cancel(holder.handle)

    ended = wait_ended(slurm, queued.handle)
    assert ended.cancelled and ended.exit_code is None and ended.signal is None
    assert "the job ended before it ever ran" in ended.evidence
    assert wait_ended(slurm, holder.handle).cancelled


# -- time limit and preemption ---------------------------------------------------------------


@pytest.mark.slow
def test_time_limit_is_timeout_after_the_usr1_notice(slurm, make_request):
    started = time.monotonic()
    sub = slurm.submit(make_request(python(NOTICE_TRAP.replace("sys.exit(75)", "pass")), time_limit_s=60,
                                    grace_s=10))

    status = wait_ended(slurm, sub.handle, timeout=180)
    took = time.monotonic() - started

    assert (status.reason, status.timed_out, status.cancelled) == ("timeout", True, False), status
    assert "TIMEOUT" in status.evidence[0]
    assert any("DUE TO TIME LIMIT" in line for line in status.evidence), status.evidence
    notices = [line.split()[1] for line in out_lines(slurm.logs(sub.handle)) if line.startswith("notice")]
    assert notices[:1] == ["SIGUSR1"], notices
    print(f"\ntime limit: --time=1 job ended TIMEOUT {took:.1f} s after submit; notices {notices}")


@pytest.mark.slow  # GraceTime's 20 s; a preemption on Slurm runs in the suite (test_executor_contract.py)
def test_preemption_sends_usr1_then_sigterm_and_ends_preempted(slurm, make_request, tmp_path):
    ours = slurm.submit(make_request(python(NOTICE_TRAP), gpus=2, grace_s=30))
    wait_for(lambda: slurm.logs(ours.handle).exists() and out_lines(slurm.logs(ours.handle)), "our job to run",
             DEADLINE_S)
    assert slurm.poll(ours.handle).phase is JobPhase.RUNNING

    t0 = time.time()
    high = subprocess.run(["sbatch", "--parsable", "--partition=high", "--gres=gpu:2", f"--output={tmp_path}/high.out",
                           "--wrap", "date +%s.%N; sleep 1"], capture_output=True, text=True, check=True, timeout=30)
    high_id = high.stdout.strip()
    try:
        status = wait_ended(slurm, ours.handle, timeout=120)
        ended_s = time.time() - t0
        high_started = float(wait_for(lambda: (tmp_path / "high.out").exists() and (tmp_path / "high.out").read_text(),
                                      "the high job to start", DEADLINE_S).split()[0])
    finally:
        subprocess.run(["scancel", high_id], capture_output=True, timeout=30)

    assert (status.reason, status.cancelled, status.timed_out) == ("preempted", False, False), status
    assert status.exit_code == 75 and "PREEMPTED" in status.evidence[0]
    notices = [line.split() for line in out_lines(slurm.logs(ours.handle)) if line.startswith("notice")]
    assert [name for _, name, _ in notices[:2]] == ["SIGUSR1", "SIGTERM"], notices
    usr1_s, term_s = (float(at) - t0 for _, _, at in notices[:2])
    print(f"\npreemption: USR1 {usr1_s:.1f} s after the high job's sbatch, SIGTERM {term_s:.1f} s, "
          f"ours ENDED (polled) {ended_s:.1f} s, the high job started {high_started - t0:.1f} s")


def test_a_job_that_ends_itself_on_the_preemption_notice_is_preempted(slurm, make_request, tmp_path):
    """The SDK saves and exits on the USR1 notice: Slurm's state is then FAILED (exit 75), not PREEMPTED,
    but Slurm set PreemptTime, and the high job gets the GPUs at once instead of after the GraceTime."""
    ours = slurm.submit(make_request(python(NOTICE_TRAP.replace("signum == signal.SIGTERM", "True")), gpus=2,
                                     grace_s=30))
    wait_for(lambda: slurm.logs(ours.handle).exists() and out_lines(slurm.logs(ours.handle)), "our job to run",
             DEADLINE_S)
    high = subprocess.run(["sbatch", "--parsable", "--partition=high", "--gres=gpu:2", f"--output={tmp_path}/high.out",
                           "--wrap", "true"], capture_output=True, text=True, check=True, timeout=30)
    try:
        status = wait_ended(slurm, ours.handle)
    finally:
        subprocess.run(["scancel", high.stdout.strip()], capture_output=True, timeout=30)

    assert (status.reason, status.exit_code, status.timed_out) == ("preempted", 75, False), status
    assert "FAILED" in status.evidence[0] and "preempted at" in status.evidence[0]
    assert "Slurm preempted the job (PreemptTime set); it ended on its own after the notice" in status.evidence


@pytest.mark.slow
def test_a_job_that_ends_itself_on_the_time_limit_notice_is_timeout(slurm, make_request):
    started = time.monotonic()
    # Slurm sends `--signal` up to 60 s early: with a 60 s limit the notice could land before the
    # command's handler is up (it then dies of SIGUSR1). 120 s puts it 10-70 s into the job.
    sub = slurm.submit(make_request(python(NOTICE_TRAP.replace("signum == signal.SIGTERM", "True")),
                                    time_limit_s=120, grace_s=50))

    status = wait_ended(slurm, sub.handle, timeout=180)

    assert (status.reason, status.timed_out, status.exit_code) == ("timeout", True, 75), status
    assert "COMPLETED" not in status.evidence[0] and "TIMEOUT" not in status.evidence[0]
    assert any("time-limit notice" in line for line in status.evidence), status.evidence
    print(f"\ntime-limit notice: the job ended itself {time.monotonic() - started:.1f} s after submit")


# -- batching, adoption, failures of Slurm itself --------------------------------------------


def test_poll_many_asks_squeue_once_for_all_jobs(slurm, make_request, tmp_path, monkeypatch):
    done = slurm.submit(make_request(python("print('done')")))
    failed = slurm.submit(make_request(python("import sys; sys.exit(4)")))
    sleeping = slurm.submit(make_request(python("import time; time.sleep(300)")))
    # A job squeue has forgotten (as after MinJobAge): its end comes from `sacct -c`, the completion log.
    forgotten = slurm.submit(make_request(python("import sys; sys.exit(5)")))
    for sub in (done, failed, forgotten):
        wait_for(lambda sub=sub: (Path(sub.handle.state_dir) / "exit.json").exists(), "the job to end", DEADLINE_S)
    wait_phase(slurm, sleeping.handle, {JobPhase.RUNNING})
    ended_ids = [sub.handle.job_id for sub in (done, failed, forgotten)]

    def slurm_says_ended():  # asked directly: a poll now would keep the ends in the state directories
        out = subprocess.run(["squeue", "-h", "--states=all", "-j", ",".join(ended_ids), "-o", "%T"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return len(out) == 3 and set(out) <= {"COMPLETED", "FAILED"}

    wait_for(slurm_says_ended, "Slurm to record the three ends", DEADLINE_S)
    calls = wrap_commands(tmp_path, monkeypatch, ("sacct", "scontrol"))
    squeue_filter = tmp_path / "wrapped-bin" / "squeue"
    real_squeue = shutil.which("squeue")
    squeue_filter.write_text(
        f'#!/bin/sh\necho "squeue $*" >> {calls}\n{real_squeue} "$@" | grep -v "^{forgotten.handle.job_id}|"\n'
    )
    squeue_filter.chmod(0o755)
    handles = [sub.handle for sub in (done, failed, sleeping, forgotten)]

    statuses = slurm.poll_many(handles)

    assert {job_id: s.phase for job_id, s in statuses.items()} == {
        done.handle.job_id: JobPhase.ENDED, failed.handle.job_id: JobPhase.ENDED,
        sleeping.handle.job_id: JobPhase.RUNNING, forgotten.handle.job_id: JobPhase.ENDED}
    assert statuses[failed.handle.job_id].exit_code == 4 and statuses[forgotten.handle.job_id].exit_code == 5
    assert "[sacct -c]" in statuses[forgotten.handle.job_id].evidence[0]
    called = calls.read_text().splitlines()
    assert [line.split()[0] for line in called].count("squeue") == 1, called
    assert len(called) <= 3, called  # one squeue; sacct once (twice the first time: slurmdbd, then -c)
    assert "scontrol" not in " ".join(called)

    calls.write_text("")
    again = slurm.poll_many(handles)
    assert calls.read_text().splitlines() == [f"squeue --noheader --states=all --jobs {sleeping.handle.job_id} "
                                              "-O JobID:|,State:|,Reason:|,exit_code:|,NodeList:|,Partition:|,QOS:|,"
                                              "StartTime:|,EndTime:|,PreemptTime:|,TimeLimit:|,STDOUT:|,Name:|"]
    assert again[done.handle.job_id] == statuses[done.handle.job_id]


def test_adopt_finds_a_job_whose_id_was_never_recorded(slurm, make_request, monkeypatch):
    request = make_request(python("import time; print('adopted', flush=True); time.sleep(300)"))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed between sbatch and recording the job id")

    crashing = SlurmExecutor(slurm.home)
    monkeypatch.setattr(crashing, "_record_job_id", crash)
    with pytest.raises(KeyboardInterrupt):
        crashing.submit(request)
    assert not (request.state_dir / JOB_ID_FILE).exists()

    adopted = SlurmExecutor(slurm.home).adopt(request.state_dir)

    assert adopted is not None and adopted.handle.job_id.isdigit()
    assert wait_phase(slurm, adopted.handle, {JobPhase.RUNNING}).phase is JobPhase.RUNNING
    # Adopted once, recorded: a second supervisor finds the same job, and nothing was submitted twice.
    assert slurm.adopt(request.state_dir).handle == adopted.handle
    names = subprocess.run(["squeue", "-h", "--name", f"trackway-{request.attempt_id.replace('/', '_')}", "-o", "%i"],
                           capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert [n for n in names if n == adopted.handle.job_id] == [adopted.handle.job_id]
    assert slurm.adopt(request.state_dir.parent / "never-submitted") is None
    slurm.cancel(adopted.handle)
    assert wait_ended(slurm, adopted.handle).cancelled


def test_missing_client_and_silent_controller_are_one_line_errors(slurm, make_request, tmp_path, monkeypatch):
    sub = slurm.submit(make_request(python("print(1)")))
    wait_ended(slurm, sub.handle)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with monkeypatch.context() as patched:
        patched.setenv("PATH", str(empty))
        with pytest.raises(ExecutorError) as missing:
            slurm.submit(make_request(python("print(2)")))
    assert str(missing.value).startswith("attempt r0000000000/2: sbatch is not on PATH: install the Slurm client")
    assert "\n" not in str(missing.value)
    with pytest.raises(ExecutorError) as refused:
        slurm.submit(make_request(python("print(2)"), gpus=3))  # the node has 2
    assert str(refused.value) == ("attempt r0000000000/3: sbatch failed: Batch job submission failed: "
                                  "Requested node configuration is not available")

    wrap_commands(tmp_path, monkeypatch, ("squeue",), before="sleep 30\n")
    slow = SlurmExecutor(slurm.home, timeout_s=1)
    other = make_request(python("print(4)"))
    handle = JobHandle("slurm", "999999999", other.state_dir)
    with pytest.raises(ExecutorError) as silent:
        slow.poll(handle)
    # Said by the 1 s timeout, not after the wrapper's 30 s sleep.
    assert str(silent.value) == "squeue did not answer within 1 s: is slurmctld reachable?"


def test_render_script_options(make_request, tmp_path):
    resource = Resource(name="lab", executor="slurm", nodes=2, partition="lab", account="ml-group",
                        sbatch=("--constraint=b200", "--mem=200G"), setup="module load cuda/12.4")
    request = make_request(["train.py", "--lr", "1e-4"], gpus=16, time_limit_s=3601, grace_s=90.5,
                           resource=resource, qos="gpu-short", env={"A": "1"}, nodes=2)

    script = render_script(request)

    options = [line[len("#SBATCH "):] for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert options == [
        "--job-name=trackway-r0000000000_1", f"--output={request.state_dir}/slurm.out", "--open-mode=append",
        f"--chdir={request.state_dir}", "--no-requeue", "--signal=B:USR1@91", "--export=ALL", "--nodes=2",
        "--ntasks-per-node=1", "--partition=lab", "--account=ml-group", "--qos=gpu-short", "--time=61", "--gres=gpu:8",
        "--constraint=b200", "--mem=200G",
    ]
    assert "export A=1\n" in script and "module load cuda/12.4\n" in script
    assert "compgen" not in script  # env_is_complete=False: the job keeps what sbatch passed on
    odd = render_script(replace(request, gpus=3))
    assert "#SBATCH --gpus=3\n" in odd
