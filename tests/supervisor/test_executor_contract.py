"""One contract, four executors: the same runs end the same way locally, on a real Slurm, over real SSH and on Kubernetes.

Each case runs real scripts through `submit_run`/`start_attempt` and the supervisor's tick,
against a resource declared in trackway.toml as `executor = "local"` or `executor = "slurm"`
(partition `test` of the single-node cluster scripts/ensure-slurm.sh brings up) or `executor =
"ssh"` (OpenSSH's sshd on a loopback port, started by the test: tests/ssh_hosts.py). What
differs is only how the outside world ends a job: locally and over SSH a SIGTERM to the shim (a
host shutting down), on Slurm a job in the `high` partition that needs our GPUs (a real
preemption, with the `--signal=B:USR1` notice first). Kubernetes is kmock's emulator on loopback
with tests/kube_cluster.py playing the Job controller and the kubelet (the pods' commands run here;
a preemption is the scheduler's DisruptionTarget and the pod's deletion, SIGTERM then the grace).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.executors.slurm import job_name
from trackway.ledger import open_ledger
from trackway.ledger.reader import Reader
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import attempt_events
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["train.log_every=5", "train.checkpoint_every=10", "model.hidden=32", "train.batch_size=16"]

# A time limit of a minute (Slurm's least) may take several attempts; each must commit a newer checkpoint.
RETRY = "[retry.reasons.timeout]\nbudget = 20\n"
RESOURCES = {
    "local": '[resources.here]\nexecutor = "local"\ngrace_seconds = 20\n',
    "slurm": ('[resources.here]\nexecutor = "slurm"\npartition = "test"\ngpus_per_node = 2\ngrace_seconds = 20\n'
              'setup = "echo setup ran"\n'
              # torch needs more than the test cluster's default of 256 MB a job.
              'sbatch = ["--mem=2G"]\n'),
}


class Project:
    """A working directory with its trackway.toml, a ledger, and a supervisor ticking over it."""

    def __init__(self, executor: str, work: Path, db_url: str, resource_toml: str | None = None):
        self.executor = executor
        self.work = work
        (work / "trackway.toml").write_text((resource_toml or RESOURCES[executor]) + RETRY)
        self.settings = load_settings(home=work / "home", db=db_url, cwd=work)
        self.ledger = open_ledger(db_url)
        self.supervisor = Supervisor(self.ledger, self.settings)
        self.corpus = work / "corpus.txt"

    def submit(self, command: list[str], gpus: int = 0, time_limit_hours: float | None = None,
               overrides: list[str] = ()) -> str:
        spec = RunSpec(command=command, cwd=self.work, gpus=gpus, time_limit_hours=time_limit_hours,
                       resource="here", overrides=list(overrides),
                       config_path=str(EXAMPLES / "tiny.toml") if overrides else None)
        run_id = submit_run(self.ledger, self.settings, spec)
        start_attempt(self.ledger, self.settings, run_id, self.supervisor.executor, first=True)
        return run_id

    def tiny(self, steps: int, delay: float, gpus: int = 0, time_limit_hours: float | None = None) -> str:
        if not self.corpus.exists():
            subprocess.run([sys.executable, str(EXAMPLES / "make_corpus.py"), str(self.corpus), "--lines", "2000"],
                           check=True, capture_output=True)
        command = [sys.executable, str(EXAMPLES / "train_tiny.py"), "--data-file", str(self.corpus),
                   "--step-delay", str(delay)]
        return self.submit(command, gpus=gpus, time_limit_hours=time_limit_hours,
                           overrides=[f"train.steps={steps}", *TINY])

    def state(self, run_id: str) -> str:
        with self.ledger.read() as conn:
            return resolve_run(conn, run_id)["state"]

    def attempts(self, run_id: str) -> list:
        with self.ledger.read() as conn:
            return list_attempts(conn, run_id=run_id)

    def until(self, what: str, done, timeout: float = 240.0, each=None):
        deadline = time.monotonic() + timeout
        while True:
            self.supervisor.tick()
            if each is not None:
                each()
            value = done()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
            time.sleep(0.3)

    def ended(self, *run_ids: str, timeout: float = 240.0) -> None:
        self.until(f"{run_ids} to end", lambda: all(self.state(r) in ("completed", "failed", "cancelled") for r in run_ids), timeout)

    def trackway(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TRACKWAY_HOME": str(self.settings.home), "TRACKWAY_DB": self.settings.db_url}
        done = subprocess.run([sys.executable, "-m", "trackway", *args], cwd=self.work, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    def final_loss(self, run_id: str) -> float:
        with self.ledger.read() as conn:
            return Reader.over(conn).metric_points(run_id, key="loss")[-1]["value"]

    def evidence(self, attempt) -> dict:
        return json.loads(attempt["termination_evidence"])


def ssh_resource(host) -> str:
    return (f'[resources.here]\nexecutor = "ssh"\nhosts = ["{host.spec}"]\nkey_file = "{host.key}"\n'
            f'workdir = "{host.work}"\ngrace_seconds = 20\nsetup = "echo setup ran"\n'
            'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n')


def shim_pid(attempt) -> int:
    """The shim's pid: the local job id, or the SSH one's `PID@host` (the test's host is this machine)."""
    return int(attempt["executor_job_id"].split("@")[0])


def kube_resource(kubeconfig: Path) -> str:
    return ('[resources.here]\nexecutor = "kubernetes"\nnamespace = "contract"\nimage = "python:3.12-slim"\n'
            f'kubeconfig = "{kubeconfig}"\ncontext = "kmock"\ngrace_seconds = 20\npvc = "checkpoints"\n')


@pytest.fixture
def kube_cluster(tmp_path):
    """kmock's emulator on loopback, with tests/kube_cluster.py playing the Job controller and the kubelet."""
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install -e .[kubernetes])")
    pytest.importorskip("kmock", reason="kmock is not installed (pip install -e .[dev])")
    from kube_cluster import Cluster, Emulator

    with Emulator() as emulator:
        cluster = Cluster(emulator, tmp_path / "nodes")
        cluster.kubeconfig = emulator.kubeconfig(tmp_path / "kubeconfig")
        cluster.autorun("contract")
        try:
            yield cluster
        finally:
            cluster.close()


@pytest.fixture(params=["local", "slurm", "ssh", "kubernetes"])
def project(request, tmp_path, sqlite_url, monkeypatch):
    resource_toml = None
    if request.param == "slurm":
        request.getfixturevalue("slurm_node")
    if request.param == "ssh":
        resource_toml = ssh_resource(request.getfixturevalue("loopback_host"))
    work = tmp_path
    if request.param == "kubernetes":
        cluster = request.getfixturevalue("kube_cluster")
        resource_toml = kube_resource(cluster.kubeconfig)
        work = tmp_path / "work"  # the code sent to the pod: not the fake nodes' scratch beside it
        work.mkdir()
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    made = Project(request.param, work, sqlite_url, resource_toml)
    if request.param == "kubernetes":
        made.cluster = cluster
    yield made
    if request.param == "slurm":  # a failed case must not leave its jobs holding the node
        for attempt in list_attempts_all(made):
            if attempt["executor_job_id"] and attempt["state"] != "ended":
                subprocess.run(["scancel", attempt["executor_job_id"]], capture_output=True, timeout=30)
    made.ledger.dispose()


def list_attempts_all(project: Project) -> list:
    with project.ledger.read() as conn:
        return list_attempts(conn)


def test_completion_and_a_failure_with_its_evidence(project):
    ok = project.submit([sys.executable, "-c", "print('done')"])
    bad = project.submit([sys.executable, "-c", "raise ValueError('bad value 42')"])

    project.ended(ok, bad)

    (good,), (failed,) = project.attempts(ok), project.attempts(bad)
    assert good["termination_reason"] == "completed" and good["exit_code"] == 0
    assert good["resource"] == "here" and good["executor"] == project.executor and good["host"]
    assert failed["termination_reason"] == "code_error"
    assert "ValueError: bad value 42" in "\n".join(project.evidence(failed)["lines"])
    assert project.state(bad) == "failed"  # a code error is not retried
    if project.executor == "slurm":
        with project.ledger.read() as conn:
            placed = conn.execute(select(attempt_events.c.payload).where(
                attempt_events.c.attempt_id == good["attempt_id"], attempt_events.c.kind == "placed")).scalar_one()
        assert json.loads(placed)["slurm_job_id"] == good["executor_job_id"]
        explained = " ".join(project.trackway("explain", ok).stdout.split())
        assert f"scheduler: job {good['executor_job_id']}, partition test, nodes " in explained
        assert "setup ran" in Path(good["state_dir"], "slurm.out").read_text()
    if project.executor == "kubernetes":
        assert good["host"] == "gpu-node-1"  # the node the pod ran on, once its container started
        explained = " ".join(project.trackway("explain", ok).stdout.split())
        assert "scheduler: namespace contract, pod tw-" in explained
        assert "node gpu-node-1, image sha256:" + "ab" * 32 in explained  # the digest the kubelet pulled
    if project.executor == "ssh":
        assert good["host"].startswith("root@127.0.0.1:")
        assert "setup ran" in Path(good["log_path"]).read_text()  # the host's log, pulled back


def test_cancel_ends_the_run_as_user_cancelled(project):
    run_id = project.submit([sys.executable, "-c", "import time\nprint('up', flush=True)\ntime.sleep(600)"])
    project.until("the job to run", lambda: "up" in Path(project.attempts(run_id)[0]["log_path"]).read_text()
                  if Path(project.attempts(run_id)[0]["log_path"]).exists() else False, timeout=60)

    project.supervisor.cancel(run_id)
    project.ended(run_id, timeout=60)

    (attempt,) = project.attempts(run_id)
    assert attempt["termination_reason"] == "user_cancelled"
    assert project.state(run_id) == "cancelled"


# The uninterrupted run's final loss, the same on every executor (one script, one config, one seed):
# trained by the first executor's case that runs and compared against by the others.
REFERENCE_LOSS: list[float] = []


def test_a_preemption_resumes_from_the_last_committed_checkpoint_to_the_same_final_loss(project):
    reference = None if REFERENCE_LOSS else project.tiny(steps=60, delay=0.05)
    # On Slurm the preempted run holds both GPUs, so the `high` job that needs them must evict it.
    preempted = project.tiny(steps=60, delay=0.05, gpus=2 if project.executor == "slurm" else 0)
    sent = []

    def preempt_once_it_committed():
        (attempt, *_) = project.attempts(preempted)
        log = Path(attempt["log_path"])
        if sent or attempt["state"] != "running" or not log.exists() or "step 25 " not in log.read_text():
            return
        if project.executor == "slurm":
            subprocess.run(["sbatch", "--parsable", "--partition=high", "--gres=gpu:2", "--time=1",
                            "--output=/dev/null", "--wrap=sleep 2"], check=True, capture_output=True, timeout=30)
        elif project.executor == "kubernetes":
            job = attempt["executor_job_id"].split("/")[1]
            project.cluster.disrupt("contract", f"{job}-x7k2p", "PreemptionByScheduler",
                                    "Preempted in order to admit critical pod")
        else:
            os.kill(shim_pid(attempt), signal.SIGTERM)  # the shim passes it on, as a host shutting down would
        sent.append(time.monotonic())

    runs = [run for run in (reference, preempted) if run is not None]
    project.until("the runs to end", lambda: all(project.state(r) in ("completed", "failed") for r in runs),
                  timeout=300, each=preempt_once_it_committed)

    attempts = project.attempts(preempted)
    assert [a["termination_reason"] for a in attempts] == ["preempted", "completed"]
    assert json.loads(attempts[0]["retry_decision"])["action"] == "resume"
    assert attempts[1]["resumed_from_checkpoint"] is not None
    if reference is not None:
        assert project.state(reference) == "completed"
        REFERENCE_LOSS.append(project.final_loss(reference))
    assert project.final_loss(preempted) == REFERENCE_LOSS[0]


@pytest.mark.slow
def test_a_time_limit_ends_as_timeout_and_resumes_from_a_newer_checkpoint(project):
    # Slurm's limits are whole minutes, checked every ~30 s. Elsewhere 18 s: twice the work needs more than one
    # attempt, and a loaded machine's start-up (torch's import can take 8 s with the suite beside it) still leaves
    # each attempt time to commit a newer checkpoint, which a timeout's resume requires.
    hours = 1 / 60 if project.executor == "slurm" else 0.005
    delay = 0.05 if project.executor == "slurm" else 0.02
    run_id = project.tiny(steps=700 if project.executor == "slurm" else 1500, delay=delay, time_limit_hours=hours)

    project.ended(run_id, timeout=480)

    attempts = project.attempts(run_id)
    assert attempts[0]["termination_reason"] == "timeout"
    assert attempts[-1]["termination_reason"] == "completed"
    assert attempts[0]["resumed_from_checkpoint"] is None
    assert attempts[1]["resumed_from_checkpoint"] is not None  # work done before the limit was kept


# On Slurm this takes 40 s of the scheduler's own pace (`make trials`); adoption on Slurm is in the suite:
# tests/executors/test_slurm.py::test_adopt_finds_a_job_whose_id_was_never_recorded.
@pytest.mark.parametrize("project", ["local", pytest.param("slurm", marks=pytest.mark.slow), "ssh", "kubernetes"],
                         indirect=True)
def test_a_supervisor_killed_mid_job_is_replaced_and_the_job_adopted_not_duplicated(project):
    run_id = project.submit([sys.executable, "-c", "import time\nprint('working', flush=True)\ntime.sleep(6)\nprint('done')"])
    env = {**os.environ, "TRACKWAY_HOME": str(project.settings.home), "TRACKWAY_DB": project.settings.db_url}
    command = [sys.executable, "-m", "trackway", "supervise", "--interval", "0.3"]
    first = subprocess.Popen(command, cwd=project.work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second = subprocess.Popen(command, cwd=project.work, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while project.state(run_id) not in ("completed", "failed"):
                assert time.monotonic() < deadline, "the run did not end under the second supervisor"
                time.sleep(0.3)
        finally:
            second.terminate()
            second.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()

    (attempt,) = project.attempts(run_id)
    assert attempt["termination_reason"] == "completed"
    if project.executor == "slurm":
        jobs = subprocess.run(["squeue", "--noheader", "--states=all", f"--name={job_name(attempt['attempt_id'])}", "--format=%i"],
                              capture_output=True, text=True, timeout=30).stdout.split()
        assert jobs == [attempt["executor_job_id"]]
