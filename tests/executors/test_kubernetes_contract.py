"""What every executor promises, asked of the Kubernetes executor: on kmock's emulator always, on a real cluster when asked.

The emulator has no controller: tests/kube_cluster.py's `autorun` creates each Job's pod and runs its
command as a local process. Set TRACKWAY_TEST_KUBECONFIG (a kubeconfig whose current context may
create Jobs and ConfigMaps) to run the same tests against a real cluster, where a real kubelet
runs them; TRACKWAY_TEST_K8S_NAMESPACE (default `default`) and TRACKWAY_TEST_K8S_IMAGE (default
`python:3.12-slim`: it needs python3, sh, tar and base64) say where and in what.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install -e .[kubernetes])")

from waiting import wait_for  # noqa: E402

from trackway.executors.base import JobPhase, LaunchRequest  # noqa: E402
from trackway.executors.code_snapshot import build_snapshot  # noqa: E402
from trackway.executors.kubernetes import KubernetesExecutor  # noqa: E402
from trackway.settings.resources import Resource  # noqa: E402

REAL = os.environ.get("TRACKWAY_TEST_KUBECONFIG")


@pytest.fixture(params=["kmock", "cluster"])
def backend(request, tmp_path):
    """(kubeconfig, context, namespace, image, python) of the API the test talks to."""
    if request.param == "cluster":
        if not REAL:
            pytest.skip("no real cluster: set TRACKWAY_TEST_KUBECONFIG to a kubeconfig to run these against one")
        yield (REAL, None, os.environ.get("TRACKWAY_TEST_K8S_NAMESPACE", "default"),
               os.environ.get("TRACKWAY_TEST_K8S_IMAGE", "python:3.12-slim"), "python3", None)
        return
    pytest.importorskip("kmock", reason="kmock is not installed (pip install -e .[dev])")
    from kube_cluster import Cluster, Emulator

    with Emulator() as emulator:
        cluster = Cluster(emulator, tmp_path / "nodes")
        cluster.autorun("contract")
        try:
            yield str(emulator.kubeconfig(tmp_path / "kubeconfig")), "kmock", "contract", "python:3.12-slim", \
                sys.executable, cluster
        finally:
            cluster.close()


def launch(tmp_path: Path, backend, script: str, attempt: str) -> tuple[KubernetesExecutor, LaunchRequest]:
    kubeconfig, context, namespace, image, python, _ = backend
    res = Resource(name="k8s", executor="kubernetes", namespace=namespace, image=image, kubeconfig=kubeconfig,
                   context=context, grace_seconds=5.0, pending_seconds=600.0, cpu="100m", memory="256Mi")
    work = tmp_path / "project"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(script)
    state = tmp_path / "state" / attempt.replace("/", "-")
    run_env = {"TRACKWAY_RUN_ID": attempt.split("/")[0], "TRACKWAY_ATTEMPT_ID": attempt, "GREETING": "hi there"}
    request = LaunchRequest(attempt_id=attempt, command=[python, "job.py"], cwd=work, env=dict(run_env),
                            state_dir=state, log_path=state / "output.log", resource=res, grace_s=5.0,
                            run_env=run_env, code=build_snapshot(work, None, None))
    return KubernetesExecutor(tmp_path / "home"), request


def terminal(executor, handle, timeout=300.0):
    return wait_for(lambda: (lambda s: s if s.phase.is_terminal() else None)(executor.poll(handle)),
                    f"{handle.job_id} to end", timeout, 0.2)


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{os.urandom(3).hex()}/1"


def test_exit_zero_with_its_output_and_environment(tmp_path, backend):
    script = "import os\nprint('greeting:', os.environ['GREETING'], flush=True)\nprint('done', flush=True)\n"
    executor, request = launch(tmp_path, backend, script, unique("zero"))
    submission = executor.submit(request)
    status = terminal(executor, submission.handle)
    assert (status.phase, status.exit_code, status.reason) == (JobPhase.ENDED, 0, None)
    text = executor.logs(submission.handle).read_text()
    assert [line.split(" ", 2)[1:] for line in text.splitlines()] == [["out", "greeting: hi there"], ["out", "done"]]


def test_the_exit_code_is_the_commands(tmp_path, backend):
    executor, request = launch(tmp_path, backend, "import sys\nsys.exit(3)\n", unique("three"))
    status = terminal(executor, executor.submit(request).handle)
    assert (status.phase, status.exit_code, status.signal) == (JobPhase.ENDED, 3, None)


def test_the_spool_comes_back(tmp_path, backend):
    script = ("import json, os\nwith open(os.path.join(os.environ['TRACKWAY_SPOOL_DIR'], 'metrics.jsonl'), 'a') as f:\n"
              "    f.write(json.dumps({'step': 1, 'loss': 0.5}) + '\\n')\n")
    executor, request = launch(tmp_path, backend, script, unique("spool"))
    terminal(executor, executor.submit(request).handle)
    lines = (request.state_dir / "spool" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "loss": 0.5}]


def test_cancel_gives_the_command_sigterm_and_it_ends_cancelled(tmp_path, backend):
    # As a trainer does in its grace: says so, takes a moment (a checkpoint), then exits. A line printed in the
    # grace is read while the pod stops; once the pod is deleted its log is gone with it.
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), time.sleep(1), "
              "sys.exit(143)))\n"
              "print('started', flush=True)\ntime.sleep(120)\n")
    executor, request = launch(tmp_path, backend, script, unique("cancel"))
    submission = executor.submit(request)
    wait_for(lambda: executor.poll(submission.handle).phase is JobPhase.RUNNING
             and "started" in executor.logs(submission.handle).read_text(), "the command to start", 300, 0.2)
    executor.cancel(submission.handle)
    status = terminal(executor, submission.handle)
    assert status.phase is JobPhase.ENDED and status.cancelled
    assert "got SIGTERM" in executor.logs(submission.handle).read_text()
