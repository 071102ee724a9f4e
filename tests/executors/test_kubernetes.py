"""The Kubernetes executor through the official client against kmock's KubernetesEmulator on loopback.

tests/kube_cluster.py plays the Job controller and the kubelet (the emulator has none):
the container's command really runs, from the code the executor put in the ConfigMap, and its
output is served through the pod log API; the endings a cluster reports (OOMKilled, an eviction, a
preemption, an image that cannot be pulled, an unschedulable pod, a lost node, a deadline) are
written into the pod's and the Job's status as the API reference describes them.
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install -e .[kubernetes])")
pytest.importorskip("kmock", reason="kmock is not installed (pip install -e .[dev])")

from kube_cluster import NODE, Cluster, Emulator  # noqa: E402
from waiting import wait_for  # noqa: E402

from trackway.errors import ExecutorError  # noqa: E402
from trackway.executors.base import JobPhase, LaunchRequest  # noqa: E402
from trackway.executors.code_snapshot import build_snapshot  # noqa: E402
from trackway.executors.kube_manifest import LABEL_ATTEMPT, LABEL_RUN  # noqa: E402
from trackway.executors.kubernetes import FINAL_FILE, KubernetesExecutor  # noqa: E402
from trackway.executors.registry import get_executor  # noqa: E402
from trackway.settings.resources import Resource  # noqa: E402

NS = "ml-team"
DIGEST = "registry.example.com/train@sha256:" + "cd" * 32


@pytest.fixture
def cluster(tmp_path):
    with Emulator() as emulator:
        kubeconfig = emulator.kubeconfig(tmp_path / "kubeconfig")
        fake = Cluster(emulator, tmp_path / "nodes")
        fake.kubeconfig = kubeconfig
        try:
            yield fake
        finally:
            fake.close()


def resource(cluster, **overrides) -> Resource:
    fields = dict(name="k8s", executor="kubernetes", namespace=NS, image="python:3.11-slim", gpus_per_node=8,
                  kubeconfig=str(cluster.kubeconfig), context="kmock", grace_seconds=7.0, pending_seconds=60.0)
    fields.update(overrides)
    return Resource(**fields)


def launch(tmp_path: Path, res: Resource, script: str = "print('hello')", attempt: str = "r-abc123/1",
           gpus: int = 1, time_limit_s: float | None = None) -> tuple[KubernetesExecutor, LaunchRequest]:
    work = tmp_path / "project"
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.py").write_text(script)
    state = tmp_path / "state" / attempt.replace("/", "-")
    run_env = {"TRACKWAY_RUN_ID": attempt.split("/")[0], "TRACKWAY_ATTEMPT_ID": attempt, "LR": "0.1",
               "TRACKWAY_DB": "sqlite:////nowhere.db", "TRACKWAY_SPOOL_DIR": str(state / "spool")}
    request = LaunchRequest(attempt_id=attempt, command=[sys.executable, "job.py"], cwd=work, env=dict(run_env),
                            state_dir=state, log_path=state / "output.log", gpus=gpus, resource=res,
                            grace_s=res.grace_seconds, time_limit_s=time_limit_s, run_env=run_env,
                            code=build_snapshot(work, None, None))
    return KubernetesExecutor(tmp_path / "home"), request


def settle(executor, handle, timeout=30.0):
    return wait_for(lambda: (lambda s: s if s.phase.is_terminal() else None)(executor.poll(handle)),
                    f"{handle.job_id} to end", timeout, 0.1)


def started(cluster, executor, request):
    """Submit, have the controller create the pod and the kubelet run it; the job's name and pod."""
    submission = executor.submit(request)
    namespace, job = submission.handle.job_id.split("/")
    assert executor.poll(submission.handle).phase is JobPhase.QUEUED  # no pod yet: the Job waits
    assert executor.logs(submission.handle).read_text() == ""  # readable before the pod prints anything
    pod = cluster.create_pod(namespace, job)
    return submission, job, pod


SPOOLING = """
import json, os, sys, time
spool = os.environ["TRACKWAY_SPOOL_DIR"]
print("lr", os.environ["LR"], "db", os.environ.get("TRACKWAY_DB"), flush=True)
for step in range(3):
    with open(os.path.join(spool, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\\n")
    print("step", step, flush=True)
    time.sleep(0.3)
print("to stderr", file=sys.stderr, flush=True)
"""


def test_a_run_goes_as_a_job_and_its_output_spool_and_end_come_back_then_the_job_is_deleted(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster), SPOOLING)
    submission, job, pod = started(cluster, executor, request)
    body = cluster.job_body(NS, job)
    assert body["spec"]["backoffLimit"] == 0
    pod_spec = body["spec"]["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never" and pod_spec["terminationGracePeriodSeconds"] == 7
    assert pod_spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    labels = body["metadata"]["labels"]
    assert (labels[LABEL_RUN], labels[LABEL_ATTEMPT]) == ("r-abc123", "r-abc123-1")

    cluster.run_pod(NS, pod, image_digest="docker-pullable://python@sha256:" + "ab" * 32)
    running = wait_for(lambda: (lambda s: s if s.phase is JobPhase.RUNNING else None)(executor.poll(submission.handle)),
                       "the pod to run", 30, 0.1)
    assert running.placement["node"] == NODE
    status = settle(executor, submission.handle)

    assert status.phase is JobPhase.ENDED and status.exit_code == 0 and status.reason is None
    # The image the pod ran, by digest, as the kubelet reported it: recorded even though the resource named a tag.
    assert status.placement["image"] == "docker-pullable://python@sha256:" + "ab" * 32
    log = request.log_path.read_text()
    assert "lr 0.1 db None" in log  # the run's variables went; this machine's ledger URL did not
    assert [line.split(" ", 2)[2] for line in log.splitlines()] == [
        "lr 0.1 db None", "step 0", "step 1", "step 2", "to stderr"]  # each line once, spool frames left out
    metrics = (request.state_dir / "spool" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [0, 1, 2]
    assert cluster.jobs(NS) == []  # deleted once ended (keep_pods is false), with the code's ConfigMap
    assert cluster.core.list_namespaced_config_map(NS).items == []
    assert json.loads((request.state_dir / FINAL_FILE).read_text())["exit_code"] == 0
    assert executor.poll(submission.handle) == status  # later polls read the kept end


LIVE = """
import json, os, time
spool = os.environ["TRACKWAY_SPOOL_DIR"]
for step in range(40):
    with open(os.path.join(spool, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": step}) + "\\n")
    with open(os.path.join(spool, ".hb"), "w") as f:
        f.write(json.dumps({"step": step}))
    os.replace(os.path.join(spool, ".hb"), os.path.join(spool, "heartbeat.json"))
    time.sleep(0.1)
"""


def test_the_spool_arrives_while_the_pod_runs_each_byte_once(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster), LIVE)
    request.run_env["TRACKWAY_RELAY_SECONDS"] = "0.3"  # the pod relays its spool this often (default 5 s)
    submission, job, pod = started(cluster, executor, request)
    cluster.run_pod(NS, pod)
    metrics = request.state_dir / "spool" / "metrics.jsonl"

    def some_while_running():
        status = executor.poll(submission.handle)
        return status.phase is JobPhase.RUNNING and metrics.exists() and (request.state_dir / "spool" /
                                                                           "heartbeat.json").exists()
    wait_for(some_while_running, "spool lines while the pod runs", 30, 0.1)
    status = settle(executor, submission.handle)
    assert status.exit_code == 0
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(40))
    assert json.loads((request.state_dir / "spool" / "heartbeat.json").read_text()) == {"step": 39}
    assert "@@trackway" not in request.log_path.read_text()


CHATTY = """
import json, os, sys, time
spool = os.environ["TRACKWAY_SPOOL_DIR"]
for step in range(60):
    with open(os.path.join(spool, "events.jsonl"), "a") as f:
        f.write(json.dumps({"seq": step, "kind": "step", "note": "x" * 300}) + "\\n")
    sys.stdout.write("done\\nabcd\\n")  # all base64 characters, as a frame's lines were
    sys.stdout.write(f"progress {step}")  # no newline yet: a frame may begin in the middle of this line
    sys.stdout.flush()
    time.sleep(0.01)
    print(f" step {step}", flush=True)
"""


def test_the_commands_own_lines_never_spoil_a_frame_while_it_prints_among_them(tmp_path, cluster):
    # The pod's real entry point, with the command printing as fast as it writes its spool: every byte of the
    # events file arrives, and every line the command printed is its output.
    executor, request = launch(tmp_path, resource(cluster), CHATTY)
    request.run_env["TRACKWAY_RELAY_SECONDS"] = "0.05"
    submission, job, pod = started(cluster, executor, request)
    cluster.run_pod(NS, pod)
    status = settle(executor, submission.handle)
    assert status.exit_code == 0
    spool = request.state_dir / "spool"
    assert [json.loads(line)["seq"] for line in (spool / "events.jsonl").read_text().splitlines()] == list(range(60))
    assert not (spool / "lost-bytes.jsonl").exists()
    said = [line.split(" out ", 1)[1] for line in request.log_path.read_text().splitlines()]
    assert said.count("done") == 60 and said.count("abcd") == 60
    assert "".join(line for line in said if line.startswith(("progress", " step"))) == "".join(
        f"progress {step} step {step}" for step in range(60))  # a line a frame cut in two keeps its parts in order
    assert not any("@@" in line for line in said)


def test_keep_pods_leaves_the_job_for_debugging(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, keep_pods=True), "raise SystemExit(3)")
    submission, job, pod = started(cluster, executor, request)
    cluster.run_pod(NS, pod)
    status = settle(executor, submission.handle)
    assert status.exit_code == 3
    assert [item["metadata"]["name"] for item in cluster.jobs(NS)] == [job]


def test_oom_killed_is_oom(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    cluster.terminated(NS, pod, 137, "OOMKilled")
    status = settle(executor, submission.handle)
    assert (status.phase, status.reason, status.signal) == (JobPhase.ENDED, "oom", 9)
    assert any("OOMKilled" in line for line in status.evidence)


def test_an_eviction_is_preempted(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    cluster.pod_status(NS, pod, {"phase": "Failed", "reason": "Evicted",
                                 "message": "The node was low on resource: memory."})
    status = settle(executor, submission.handle)
    assert (status.phase, status.reason) == (JobPhase.ENDED, "preempted")
    assert "The node was low on resource: memory." in status.evidence[0]


def test_a_preemption_by_priority_is_preempted(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    cluster.terminated(NS, pod, 143, "Error", conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "Preempted in order to admit critical pod"}])
    status = settle(executor, submission.handle)
    assert (status.reason, status.signal) == ("preempted", 15)
    assert "PreemptionByScheduler" in status.evidence[0]


def test_a_preempted_pod_keeps_running_through_its_grace_and_then_ends_preempted(tmp_path, cluster):
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('saving a checkpoint', flush=True), time.sleep(1),"
              " print('saved', flush=True), sys.exit(143)))\n"
              "print('training', flush=True)\ntime.sleep(60)\n")
    executor, request = launch(tmp_path, resource(cluster), script)
    submission, job, pod = started(cluster, executor, request)
    cluster.run_pod(NS, pod)
    wait_for(lambda: executor.poll(submission.handle).phase is JobPhase.RUNNING and request.log_path.exists()
             and "training" in request.log_path.read_text(), "the command to start", 30, 0.1)
    cluster.disrupt(NS, pod, "PreemptionByScheduler", "Preempted in order to admit critical pod")

    during = executor.poll(submission.handle)
    assert during.phase is JobPhase.RUNNING and "stopping within its grace" in during.evidence[0]
    status = settle(executor, submission.handle)
    assert (status.phase, status.reason, status.signal) == (JobPhase.ENDED, "preempted", 15)
    assert "saved" in request.log_path.read_text()  # the grace was the command's, not cut short by trackway


def test_a_lost_node_is_infra_transient_or_preempted_on_a_preemptible_resource(tmp_path, cluster):
    for preemptible, expected in ((False, "infra_transient"), (True, "preempted")):
        executor, request = launch(tmp_path / expected, resource(cluster, preemptible=preemptible),
                                   attempt=f"r-{expected.replace('_', '-')}/1")
        submission, job, pod = started(cluster, executor, request)
        cluster.pod_status(NS, pod, {"phase": "Unknown", "reason": "NodeLost",
                                     "message": f"Node {NODE} which was running pod {pod} is unresponsive"})
        status = settle(executor, submission.handle)
        assert (status.phase, status.reason) == (JobPhase.VANISHED, expected)
        assert "unresponsive" in status.evidence[0] and status.placement["node_lost"]


def test_a_pod_gone_with_its_node_is_infra_transient(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    cluster.pod_status(NS, pod, {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
    assert executor.poll(submission.handle).phase is JobPhase.RUNNING
    cluster.core.delete_namespaced_pod(pod, NS)  # the node controller removed it with its node, no status left
    status = settle(executor, submission.handle)
    assert (status.phase, status.reason) == (JobPhase.VANISHED, "infra_transient")


def test_an_image_that_cannot_be_pulled_is_a_config_error_past_the_pending_limit_with_the_event(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, pending_seconds=1.0))
    submission, job, pod = started(cluster, executor, request)
    cluster.waiting(NS, pod, "ErrImagePull", 'failed to pull and unpack image "python:3.11-slim": not found')
    cluster.event(NS, pod, "Failed", 'Failed to pull image "python:3.11-slim": manifest unknown')
    status = settle(executor, submission.handle)
    assert (status.phase, status.reason, status.never_started) == (JobPhase.ENDED, "config_error", True)
    assert "ErrImagePull" in status.evidence[0]
    assert any("manifest unknown" in line for line in status.evidence)
    assert cluster.jobs(NS) == []


def test_image_pull_backoff_within_the_limit_is_still_queued(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, pending_seconds=3600.0))
    submission, job, pod = started(cluster, executor, request)
    cluster.waiting(NS, pod, "ImagePullBackOff", "Back-off pulling image")
    status = executor.poll(submission.handle)
    assert status.phase is JobPhase.QUEUED and "ImagePullBackOff" in status.evidence[0]


def test_unschedulable_past_the_limit_is_a_config_error(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, pending_seconds=1.0))
    submission, job, pod = started(cluster, executor, request)
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    cluster.pod_status(NS, pod, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]})
    cluster.event(NS, pod, "FailedScheduling", message)
    status = settle(executor, submission.handle)
    assert (status.reason, status.never_started) == ("config_error", True)
    assert message in status.evidence[0]


def test_the_deadline_is_a_timeout(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster), time_limit_s=30.5)
    submission, job, pod = started(cluster, executor, request)
    assert cluster.job_body(NS, job)["spec"]["activeDeadlineSeconds"] == 31
    cluster.run_pod(NS, pod)
    cluster.job_condition(NS, job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
    cluster.stop(pod, grace_s=5.0)  # the Job controller deletes the pod at the deadline
    status = settle(executor, submission.handle)
    assert (status.reason, status.timed_out) == ("timeout", True)


def test_cancel_deletes_the_job_and_the_pod_gets_sigterm_with_the_grace(tmp_path, cluster):
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
              "print('waiting', flush=True)\ntime.sleep(60)\n")
    executor, request = launch(tmp_path, resource(cluster), script)
    submission, job, pod = started(cluster, executor, request)
    cluster.run_pod(NS, pod)
    wait_for(lambda: "waiting" in (request.log_path.read_text() if request.log_path.exists() else "")
             or executor.poll(submission.handle) and False, "the first line", 30, 0.1)
    executor.cancel(submission.handle)
    assert cluster.jobs(NS) == []
    cluster.collect_garbage(NS)  # the kubelet stops the pod: SIGTERM through the launch script
    status = settle(executor, submission.handle)
    assert status.cancelled and status.phase is JobPhase.ENDED
    assert status.reason is None  # a cancel is trackway's own: the classifier says user_cancelled


def test_cancel_before_any_pod_ran_spent_nothing(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission = executor.submit(request)
    assert executor.poll(submission.handle).phase is JobPhase.QUEUED
    executor.cancel(submission.handle)
    status = executor.poll(submission.handle)
    assert (status.phase, status.cancelled, status.never_started) == (JobPhase.ENDED, True, True)
    assert cluster.jobs(NS) == []


def test_a_cluster_that_does_not_answer_is_not_the_jobs_end(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    record = json.loads((request.state_dir / "k8s-job.json").read_text())
    record["kubeconfig"] = str(cluster.kubeconfig.with_name("down"))
    Emulator.kubeconfig(type("E", (), {"url": "http://127.0.0.1:9"})(), cluster.kubeconfig.with_name("down"))
    (request.state_dir / "k8s-job.json").write_text(json.dumps(record))
    status = executor.poll(submission.handle)
    assert status.phase is JobPhase.RUNNING and "unreachable" in status.evidence[0]


def test_adopt_finds_the_job_a_dead_launcher_created(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster))
    submission = executor.submit(request)
    again = KubernetesExecutor(tmp_path / "home").adopt(request.state_dir)
    assert again is not None and again.handle == submission.handle


def test_a_refused_manifest_is_refused_here_naming_the_field_and_nothing_is_created(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, namespace="ML_Team"))
    with pytest.raises(ExecutorError, match=r"metadata.namespace 'ML_Team': expected a DNS-1123 label"):
        executor.submit(request)
    executor, request = launch(tmp_path, resource(cluster, cpu="lots"))
    with pytest.raises(ExecutorError, match=r"resources.limits\[cpu\] 'lots': expected a quantity"):
        executor.submit(request)
    assert cluster.jobs(NS) == [] and not (request.state_dir / "k8s-job.json").exists()


def test_preview_is_the_manifest_and_sends_nothing(tmp_path, cluster):
    executor, request = launch(tmp_path, resource(cluster, image=DIGEST))
    text = executor.preview(request)
    assert "kind: Job" in text and "kind: ConfigMap" in text and DIGEST in text and "backoffLimit: 0" in text
    assert cluster.jobs(NS) == [] and not request.state_dir.exists()


def test_the_registry_names_it(tmp_path):
    assert isinstance(get_executor("kubernetes", tmp_path), KubernetesExecutor)


def test_the_kubernetes_client_imports_in_a_process_that_loaded_the_ssh_executor_first():
    """A supervisor with SSH and Kubernetes resources: the SSH executor's agent module must not put trackway's
    executors directory on sys.path, where its kubernetes.py would stand in for the Kubernetes client."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import trackway.executors.ssh\nfrom kubernetes import client, config\n"
                           "import kubernetes, sys\nprint(kubernetes.__file__)"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "trackway" not in done.stdout


def test_a_line_the_script_prints_inside_a_spool_frame_is_its_output_and_the_frame_still_arrives(tmp_path, cluster):
    # The pod's relay and the script share its stdout: a step line printed while a frame is being written lands
    # among the frame's base64 lines. The frame's bytes must still arrive (the pod never sends them again) and
    # the line is the script's output.
    executor, request = launch(tmp_path, resource(cluster))
    submission, job, pod = started(cluster, executor, request)
    cluster.report_running(NS, pod, "python:3.12-slim")  # its log written below, by the test, not a process
    events = b"".join(json.dumps({"seq": i, "kind": "checkpoint_committed", "step": 10 * i}).encode() + b"\n"
                      for i in range(4))
    wrapped = base64.encodebytes(events).decode().splitlines()  # 76 characters a line, as base64(1) prints
    assert len(wrapped) > 2
    printed = ["@@trackway-spool events.jsonl 0", wrapped[0], "step 25: loss 1.5", *wrapped[1:],
               "@@trackway-spool-end events.jsonl", "step 26: loss 1.4"]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    cluster.logs[pod] = [(f"{stamp}.{i:06d}123Z", line) for i, line in enumerate(printed)]

    assert executor.poll(submission.handle).phase is JobPhase.RUNNING
    assert (request.state_dir / "spool" / "events.jsonl").read_bytes() == events
    said = request.log_path.read_text()
    assert "step 25: loss 1.5" in said and "step 26: loss 1.4" in said and "@@trackway" not in said
