"""A Kubernetes API on loopback for the executor tests: kmock's KubernetesEmulator, and a small controller.

The emulator stores objects and serves the API the official client speaks, but runs no controller:
nothing creates a Job's pod or moves its status. `Cluster` plays the Job controller and the kubelet
as the Kubernetes API reference describes them: it creates the Job's pod from its template (with the
`job-name` label), runs the pod's container for real as a local process (the Job's command, the
ConfigMap's files where the pod would mount them, the pod's variables with its paths moved under a
scratch directory), serves its output through the pod log API with RFC 3339 timestamps, and writes
the pod's and the Job's status and the pod's events as a cluster would for an exit, an OOM kill, an
eviction, a preemption, an image that cannot be pulled, an unschedulable pod and a lost node.
What it cannot show is the real server's own behaviour: validation, defaulting, uids, garbage
collection (done here by `collect_garbage()`), field and label selectors (the emulator ignores them).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kmock
from kubernetes import client

NODE = "gpu-node-1"


def now_rfc3339(offset_s: float = 0.0) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


class _KubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator keeping only its newest requests.

    It finds each request's reaction by scanning every request it has received (kept for assertions on
    them, which these tests do not make), through each reaction's filters, so the scan grew with each
    request of a test that polls it. The contract's Kubernetes cases took 92-100 s of CPU keeping 256
    requests, 73 s keeping 32 and 52 s keeping 8 or 2 (`pytest tests/supervisor/test_executor_contract.py
    -k kubernetes`).
    """

    # More than are ever in flight at once (the clients here wait for each answer): the scan looks for the one
    # just appended.
    KEEP = 8

    async def _handle(self, request):
        del self._requests[:-self.KEEP]
        return await super()._handle(request)


class Emulator:
    """KubernetesEmulator and its HTTP server on 127.0.0.1, in a thread with its own event loop."""

    def __init__(self):
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="kmock")
        self.error: BaseException | None = None

    def _serve(self):
        async def main():
            try:
                async with _KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
                    self.emulator, self.url = emulator, str(server.url).rstrip("/")
                    self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                self.error = exc
                self._ready.set()

        asyncio.run(main())

    def __enter__(self) -> Emulator:
        self._thread.start()
        self._ready.wait(30)
        if self.error is not None:
            raise self.error
        # The emulator serves only resources declared to it; namespaced objects are known by their URLs.
        for resource in ("v1/nodes", "v1/pods", "v1/configmaps", "v1/events", "batch/v1/jobs"):
            self.emulator.resources[resource] = {}
        return self

    def __exit__(self, *exc_info):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Path, context: str = "kmock") -> Path:
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: kmock
  cluster: {{server: "{self.url}"}}
users:
- name: tester
  user: {{token: not-checked}}
contexts:
- name: {context}
  context: {{cluster: kmock, user: tester}}
current-context: {context}
""")
        return path


class Cluster:
    """The Job controller and the kubelet, for the tests to drive (see the module docstring)."""

    def __init__(self, emulator: Emulator, scratch: Path):
        configuration = client.Configuration()
        configuration.host = emulator.url
        self.api = client.ApiClient(configuration)
        self.core, self.batch = client.CoreV1Api(self.api), client.BatchV1Api(self.api)
        self.scratch = scratch
        self.logs: dict[str, list[tuple[str, str]]] = {}  # pod -> [(RFC 3339 nano time, line)]
        self.processes: dict[str, subprocess.Popen] = {}
        self.log_requests: list[dict] = []
        self.pumps: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._started: set[str] = set()
        self._started_at: dict[str, float] = {}
        self._deadlined: set[str] = set()
        emulator.emulator[kmock.method.GET, kmock.path(re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/log$"))] << self._log

    # -- what the API serves -----------------------------------------------------------------

    def _log(self, request):
        pod = request.url.path.split("/")[-2]
        self.log_requests.append(dict(request.params))
        if pod not in self.logs:
            return kmock.Response(status=400, payload={"kind": "Status", "code": 400, "message":
                                                       f'container "attempt" in pod "{pod}" is waiting to start'})
        lines = list(self.logs[pod])
        if "sinceSeconds" in request.params:
            since = datetime.now(timezone.utc) - timedelta(seconds=int(request.params["sinceSeconds"]))
            lines = [(when, text) for when, text in lines
                     if datetime.fromisoformat(when[:26] + "+00:00") >= since.replace(microsecond=0)]
        stamped = str(request.params.get("timestamps")).lower() in ("true", "1", "t")  # Go's ParseBool
        return "".join((f"{when} {text}\n" if stamped else f"{text}\n") for when, text in lines).encode()

    def jobs(self, namespace: str) -> list[dict]:
        return [job.to_dict() for job in self.batch.list_namespaced_job(namespace).items]

    def job_body(self, namespace: str, name: str) -> dict:
        return self.api.sanitize_for_serialization(self.batch.read_namespaced_job(name, namespace))

    def pods(self, namespace: str) -> list[str]:
        return [pod.metadata.name for pod in self.core.list_namespaced_pod(namespace).items]

    # -- the Job controller ------------------------------------------------------------------

    def create_pod(self, namespace: str, job_name: str, node: str | None = NODE) -> str:
        job = self.job_body(namespace, job_name)
        template = job["spec"]["template"]
        name = f"{job_name}-x7k2p"
        labels = {**template["metadata"]["labels"], "job-name": job_name, "batch.kubernetes.io/job-name": job_name}
        spec = dict(template["spec"])
        if node:
            spec["nodeName"] = node
        self.core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "labels": labels, "creationTimestamp": now_rfc3339()},
            "spec": spec})
        self.pod_status(namespace, name, {"phase": "Pending"})
        self.batch.patch_namespaced_job_status(job_name, namespace, {"status": {"active": 1, "startTime": now_rfc3339()}})
        return name

    def pod_status(self, namespace: str, pod: str, status: dict) -> None:
        self.core.patch_namespaced_pod_status(pod, namespace, {"status": status})

    def job_condition(self, namespace: str, job: str, kind: str, reason: str, message: str, **counts) -> None:
        condition = {"type": kind, "status": "True", "reason": reason, "message": message,
                     "lastTransitionTime": now_rfc3339(), "lastProbeTime": now_rfc3339()}
        self.batch.patch_namespaced_job_status(job, namespace, {"status": {"conditions": [condition], "active": 0,
                                                                            **counts}})

    def event(self, namespace: str, pod: str, reason: str, message: str, kind: str = "Warning") -> None:
        self.core.create_namespaced_event(namespace, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod}.{reason.lower()}.{len(self.logs)}", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
            "reason": reason, "message": message, "type": kind,
            "firstTimestamp": now_rfc3339(), "lastTimestamp": now_rfc3339()})

    def collect_garbage(self, namespace: str) -> None:
        """What the garbage collector does after a Job's deletion: its pods go (the kubelet stops them first)."""
        jobs = {job["metadata"]["name"] for job in self.jobs(namespace)}
        for pod in self.core.list_namespaced_pod(namespace).items:
            if pod.metadata.labels.get("job-name") not in jobs:
                self.stop(pod.metadata.name)
                self.core.delete_namespaced_pod(pod.metadata.name, namespace)

    # -- the kubelet -------------------------------------------------------------------------

    def report_running(self, namespace: str, pod: str, image: str, image_digest: str = "sha256:" + "ab" * 32) -> None:
        """The pod's status as the kubelet writes it once its container runs."""
        started = now_rfc3339()
        self.pod_status(namespace, pod, {
            "phase": "Running", "startTime": started,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "attempt", "image": image, "imageID": image_digest,
                                   "ready": True, "restartCount": 0, "state": {"running": {"startedAt": started}}}]})

    def run_pod(self, namespace: str, pod: str, image_digest: str = "sha256:" + "ab" * 32) -> subprocess.Popen:
        """Start the pod's container as a local process, as the kubelet would, and report it running."""
        spec = self.core.read_namespaced_pod(pod, namespace)
        spec = self.api.sanitize_for_serialization(spec)["spec"]
        container = spec["containers"][0]
        root = self.scratch / pod
        mounts = {}
        for volume in spec["volumes"]:
            mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume["name"])
            local = root / mount.strip("/")
            if "persistentVolumeClaim" in volume:  # one volume, whichever pod mounts it
                local = self.scratch / "pvc" / volume["persistentVolumeClaim"]["claimName"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount] = local
            if "configMap" in volume:
                config_map = self.core.read_namespaced_config_map(volume["configMap"]["name"], namespace)
                for key, value in (config_map.binary_data or {}).items():
                    (local / key).write_bytes(base64.b64decode(value))

        def moved(value: str) -> str:
            for mount, local in mounts.items():
                if value == mount or value.startswith(mount + "/"):
                    return str(local) + value[len(mount):]
            return value

        env = {"PATH": os.environ["PATH"], **{item["name"]: moved(item["value"]) for item in container["env"]}}
        process = subprocess.Popen(container["command"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[pod] = process
        self.logs[pod] = []
        self.report_running(namespace, pod, container["image"], image_digest)

        def pump():
            for raw in process.stdout:
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
                self.logs[pod].append((stamp, raw.decode(errors="replace").rstrip("\n")))
            code = process.wait()
            try:
                self.terminated(namespace, pod, code, "Completed" if code == 0 else "Error", image_digest)
            except client.ApiException as exc:
                if exc.status != 404:  # a pod already deleted keeps no status
                    raise

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self.pumps.append(thread)
        return process

    def terminated(self, namespace: str, pod: str, code: int, container_reason: str, image_digest: str = "",
                   phase: str | None = None, **extra) -> None:
        finished = now_rfc3339()
        self.pod_status(namespace, pod, {
            "phase": phase or ("Succeeded" if code == 0 else "Failed"), **extra,
            "containerStatuses": [{"name": "attempt", "image": "", "imageID": image_digest, "ready": False,
                                   "restartCount": 0, "state": {"terminated": {
                                       "exitCode": code, "reason": container_reason, "finishedAt": finished}}}]})
        job = self.core.read_namespaced_pod(pod, namespace).metadata.labels["job-name"]
        try:
            conditions = self.batch.read_namespaced_job_status(job, namespace).status.conditions or []
            if any(condition.type == "Failed" for condition in conditions):
                return  # the Job controller ended it first (a deadline): its reason stands
            if code == 0:
                self.job_condition(namespace, job, "Complete", "", "", succeeded=1)
            elif not extra:
                self.job_condition(namespace, job, "Failed", "BackoffLimitExceeded",
                                   "Job has reached the specified backoff limit", failed=1)
        except client.ApiException as exc:
            if exc.status != 404:  # a Job deleted (a cancel) before its pod ended
                raise

    def stop(self, pod: str, grace_s: float = 5.0) -> None:
        """The kubelet's stop of a deleted pod: SIGTERM to PID 1, SIGKILL to every process after the grace."""
        process = self.processes.get(pod)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # the runtime signals the container's PID 1 (the launch script) only
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def disrupt(self, namespace: str, pod: str, reason: str, message: str) -> None:
        """A disruption as the scheduler or the eviction API makes one: the DisruptionTarget condition, then the
        pod's deletion: SIGTERM to its container, SIGKILL after the grace (in a thread, as the kubelet does)."""
        self.pod_status(namespace, pod, {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason,
                                                         "message": message, "lastTransitionTime": now_rfc3339()}]})
        grace = self.core.read_namespaced_pod(pod, namespace).spec.termination_grace_period_seconds or 30
        thread = threading.Thread(target=self.stop, args=(pod, grace), daemon=True)
        thread.start()
        self.pumps.append(thread)

    def waiting(self, namespace: str, pod: str, reason: str, message: str) -> None:
        self.pod_status(namespace, pod, {"phase": "Pending", "containerStatuses": [{
            "name": "attempt", "image": "", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}}]})

    def autorun(self, namespace: str) -> None:
        """Play the controllers on their own from now on: each new Job's pod created and run, a deleted Job's pod
        stopped (SIGTERM, SIGKILL after its grace) and removed."""
        def loop():
            while not self._stopping.is_set():
                try:
                    jobs = {job["metadata"]["name"] for job in self.jobs(namespace)}
                    owned = {pod.metadata.labels.get("job-name") for pod in self.core.list_namespaced_pod(namespace).items}
                    for job in sorted(jobs - owned - self._started):
                        self._started.add(job)
                        self._started_at[job] = time.monotonic()
                        self.run_pod(namespace, self.create_pod(namespace, job))
                    for job in self.jobs(namespace):
                        name, deadline = job["metadata"]["name"], job["spec"].get("active_deadline_seconds")
                        if deadline and name in self._started_at and name not in self._deadlined \
                                and time.monotonic() - self._started_at[name] > deadline:
                            # The Job controller at activeDeadlineSeconds: the Job fails, its pod is deleted.
                            self._deadlined.add(name)
                            self.job_condition(namespace, name, "Failed", "DeadlineExceeded",
                                               "Job was active longer than specified deadline")
                            pod = f"{name}-x7k2p"
                            grace = self.core.read_namespaced_pod(pod, namespace).spec.termination_grace_period_seconds
                            threading.Thread(target=self.stop, args=(pod, grace or 30), daemon=True).start()
                    for pod in self.core.list_namespaced_pod(namespace).items:
                        if pod.metadata.labels.get("job-name") not in jobs:
                            grace = pod.spec.termination_grace_period_seconds or 30
                            self.stop(pod.metadata.name, grace_s=grace)
                            self.core.delete_namespaced_pod(pod.metadata.name, namespace)
                except Exception:  # noqa: BLE001 - the emulator shutting down under the loop
                    if self._stopping.is_set():
                        return
                    raise
                self._stopping.wait(0.05)

        thread = threading.Thread(target=loop, daemon=True, name="kube-controller")
        thread.start()
        self.pumps.append(thread)

    def close(self) -> None:
        self._stopping.set()
        for pod in list(self.processes):
            self.stop(pod, grace_s=1.0)
        for thread in self.pumps:
            thread.join(10)
        self.api.close()
