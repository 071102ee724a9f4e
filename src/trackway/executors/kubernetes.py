"""The Kubernetes executor: each attempt a batch/v1 Job in the resource's namespace, through the official client.

`submit()` builds the attempt's ConfigMap (the code snapshot rebuilt from the receipt, and the
attempt's input files) and its Job (kube_manifest.py), checks both as the API server would,
creates them and returns: the pod's placement shows up in `poll()`. The Job owns the ConfigMap
(an ownerReference), so deleting the Job removes both, and the pod.

    here, in the attempt's state directory:
      k8s-job.json     cluster (kubeconfig, context), namespace, Job name, what the resource said
      k8s-logs.json    how far the pod's log has been read (the last timestamp, and lines at it)
      k8s-spool.json   a spool frame begun in the lines read so far and not yet ended (kube_spool.py)
      k8s-final.json   the end once known: later polls read it instead of asking the cluster
      cancel.json      trackway asked to stop it
      output.log, spool/   the pod's log as trackway's (`<UTC time> out <line>`), and the SDK's spool

`poll_many()` asks the API once per namespace for the Jobs, the pods and the events of trackway's
attempts (by label), maps each attempt's objects to a status (kube_endings.py), and appends the new
lines of each running pod's log to output.log. The pod prints what its spool's files gained, framed,
while the command runs and once more after it ends (kube_manifest.LAUNCH_SCRIPT); kube_spool.py
writes them back to spool/ here, so the SDK's metrics and its note reach the ledger as they do from
any executor, and records what never arrived. When the attempt has ended,
its Job (and so its pod and ConfigMap) is deleted, unless the resource says `keep_pods = true`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from trackway.errors import ExecutorError, NotFound
from trackway.executors import kube_endings, kube_manifest
from trackway.executors.kube_spool import SpoolFrames
from trackway.executors.base import (
    Executor,
    JobHandle,
    JobPhase,
    JobStatus,
    LaunchRequest,
    Submission,
    status_from_json,
    status_to_json,
)
from trackway.executors.local_shim import read_json, utc_now, write_json_atomic

JOB_FILE = "k8s-job.json"
LOGS_FILE = "k8s-logs.json"
FINAL_FILE = "k8s-final.json"
CANCEL_FILE = "cancel.json"
# Environment that names this machine's paths or ledger: never sent to the pod.
LOCAL_ONLY_ENV = ("TRACKWAY_HOME", "TRACKWAY_DB", "TRACKWAY_RESUME_PATH")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:\d\d) ?(.*)$")
REQUEST_TIMEOUT_S = 30
SINCE_MARGIN_S = 60


def target_of(resource) -> kube_manifest.KubeTarget:
    """The KubeTarget a `[resources.NAME]` table with `executor = "kubernetes"` declares."""
    return kube_manifest.KubeTarget(
        namespace=resource.namespace, image=resource.image, gpu_resource=resource.gpu_resource,
        node_selector=tuple(resource.node_selector), tolerations=tuple(resource.tolerations),
        priority_class=resource.priority_class, service_account=resource.service_account,
        cpu=resource.cpu, memory=resource.memory, pvc=resource.pvc, pvc_mount=resource.pvc_mount)


def api_client(kubeconfig: str | None, context: str | None):
    """An ApiClient for the cluster a kubeconfig (its `context`) names; in a pod without one, the pod's own."""
    from kubernetes import config

    path = os.path.expanduser(kubeconfig) if kubeconfig else None
    try:
        if path is None and "KUBECONFIG" not in os.environ and not os.path.exists(
                os.path.expanduser("~/.kube/config")) and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            from kubernetes import client

            return client.ApiClient()
        return config.new_client_from_config(config_file=path, context=context)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ExecutorError(f"kubeconfig {where}" + (f" context {context!r}" if context else "")
                            + f": {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


class KubeCluster:
    """The three APIs trackway calls, read as raw JSON (the API reference's field names)."""

    def __init__(self, kubeconfig: str | None, context: str | None):
        try:
            from kubernetes import client
        except ImportError as exc:
            raise ExecutorError(f"executor 'kubernetes': the kubernetes client is not installed ({exc.name}); "
                                "expected pip install 'trackway[kubernetes]'") from None

        self.api = api_client(kubeconfig, context)
        self.timeout_s: float = REQUEST_TIMEOUT_S
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)

    def call(self, method, *args, **kwargs):
        """`method`'s answer as a dict; None for 404. ExecutorError (one line) for any other failure."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = method(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs)
            data = response.data
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ExecutorError(f"Kubernetes API: {exc.status} {exc.reason}: {_message(exc.body)}") from None
        except Exception as exc:  # urllib3's connection errors: the API server cannot be reached
            raise ExecutorError(f"Kubernetes API unreachable: {type(exc).__name__}: {str(exc)[:200]}") from None
        return json.loads(data) if data else {}

    def raw(self, method, *args, **kwargs) -> bytes | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs).data
        except ApiException as exc:
            if exc.status in (400, 404):  # no such pod, or its container not started yet: no log to read
                return None
            raise ExecutorError(f"Kubernetes API: {exc.status} {exc.reason}: {_message(exc.body)}") from None
        except Exception as exc:
            raise ExecutorError(f"Kubernetes API unreachable: {type(exc).__name__}: {str(exc)[:200]}") from None


def _stamp(when: str, zone: str) -> str:
    """A log line's RFC 3339 time as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnn` in UTC: ordered as text, nanoseconds kept."""
    whole, _, fraction = when.partition(".")
    if zone not in ("Z", "+00:00"):
        whole = datetime.fromisoformat(whole + zone).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{(fraction + '000000000')[:9]}"


def _message(body) -> str:
    try:
        return json.loads(body).get("message") or str(body)[:200]
    except (TypeError, ValueError, AttributeError):
        return str(body)[:200]


class KubernetesExecutor(Executor):
    """Runs attempts as Kubernetes Jobs; see the module docstring for the objects and files."""

    name = "kubernetes"
    remote = True

    def __init__(self, home: Path):
        self.home = Path(home)
        self._clusters: dict[tuple, KubeCluster] = {}

    def _cluster(self, kubeconfig: str | None, context: str | None) -> KubeCluster:
        key = (kubeconfig, context)
        if key not in self._clusters:
            self._clusters[key] = KubeCluster(kubeconfig, context)
        return self._clusters[key]

    # -- the manifest ----------------------------------------------------------------------

    def _render(self, request: LaunchRequest) -> tuple[dict, dict]:
        """The attempt's (Job, ConfigMap), checked; ExecutorError naming the field when one would be refused."""
        resource = request.resource
        if resource is None or resource.executor != "kubernetes" or not resource.image:
            raise ExecutorError(f"attempt {request.attempt_id}: the kubernetes executor needs a resource with "
                                "namespace and image (trackway.toml: [resources.NAME] executor = \"kubernetes\")")
        if request.nodes > 1:
            raise ExecutorError(f"attempt {request.attempt_id}: {request.nodes} nodes asked; the kubernetes executor "
                                "runs one pod an attempt")
        target = target_of(resource)
        name = kube_manifest.job_name(request.attempt_id)
        run_id = (request.run_env or request.env).get("TRACKWAY_RUN_ID") or request.attempt_id.split("/")[0]
        source = request.env if request.run_env is None else request.run_env
        env = {key: value for key, value in source.items() if key not in LOCAL_ONLY_ENV}
        files: dict[str, str] = {}
        inputs: dict[str, str] = {}
        for key, value in sorted(env.items()):
            if key.startswith("TRACKWAY_") and value.startswith("/") and Path(value).is_file():
                item = f"input-{key.lower().replace('_', '-')}"
                files[item] = base64.b64encode(Path(value).read_bytes()).decode()
                inputs[key] = item
        code = request.code
        if code is not None:
            files[kube_manifest.CODE_KEY] = base64.b64encode(code.tar_gz).decode()
        else:
            from trackway.executors.code_snapshot import build_snapshot

            code = build_snapshot(Path(request.cwd), None, None)
            files[kube_manifest.CODE_KEY] = base64.b64encode(code.tar_gz).decode()
        size = sum(len(value) * 3 // 4 for value in files.values())
        if size > kube_manifest.MAX_BUNDLE_BYTES:
            raise ExecutorError(
                f"attempt {request.attempt_id}: the code and inputs are {size / 1e6:.1f} MB, past a ConfigMap's "
                f"{kube_manifest.MAX_BUNDLE_BYTES / 1e6:g} MB; keep data and checkpoints out of the repository "
                "(or put them on the resource's PVC)")
        pod_env = kube_manifest.pod_env(env, run_id, target, code.cwd, inputs)
        job = kube_manifest.job_manifest(
            name=name, run_id=run_id, attempt_id=request.attempt_id, target=target, command=list(request.command),
            env=pod_env, gpus=request.gpus, grace_s=request.grace_s, time_limit_s=request.time_limit_s,
            code_source=code.source)
        refused = kube_manifest.problems(job)
        if refused:
            raise ExecutorError(f"attempt {request.attempt_id}: the Job would be refused: {refused[0]}")
        bundle = kube_manifest.bundle_manifest(name, target.namespace, job["metadata"]["labels"], files)
        return job, bundle

    def preview(self, request: LaunchRequest) -> str:
        """What submit would send, as text; starts and records nothing."""
        job, bundle = self._render(request)
        shown = {**bundle, "binaryData": {key: f"<{len(value) * 3 // 4} bytes>" for key, value in
                                          bundle["binaryData"].items()}}
        return kube_manifest.to_yaml(shown, job)

    # -- submit ------------------------------------------------------------------------------

    def submit(self, request: LaunchRequest) -> Submission:
        state_dir = Path(request.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        if (state_dir / JOB_FILE).exists():
            raise ExecutorError(f"attempt {request.attempt_id}: {state_dir} already holds a started job")
        job, bundle = self._render(request)
        resource = request.resource
        cluster = self._cluster(resource.kubeconfig, resource.context)
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        record = {
            "kubeconfig": resource.kubeconfig, "context": resource.context, "namespace": namespace, "job": name,
            "keep_pods": resource.keep_pods, "pending_seconds": resource.pending_seconds,
            "lost_reason": "preempted" if resource.preemptible else "infra_transient",
            "local_log": str(request.log_path), "resource": resource.name, "image": resource.image,
            "submitted_at": utc_now().isoformat(),
        }
        # Recorded before the Job exists: a launcher that dies after creating it is found again by adopt().
        write_json_atomic(state_dir / JOB_FILE, record)
        try:
            cluster.call(cluster.core.create_namespaced_config_map, namespace, bundle)
            created = cluster.call(cluster.batch.create_namespaced_job, namespace, job)
        except ExecutorError as exc:
            try:
                cluster.call(cluster.core.delete_namespaced_config_map, name, namespace)
            except ExecutorError:
                pass  # the first failure is the one to say; a ConfigMap left is named as the Job for kubectl
            (state_dir / JOB_FILE).unlink(missing_ok=True)
            raise ExecutorError(f"attempt {request.attempt_id}: {exc}") from None
        # There from the start, empty until the pod prints: logs() names a file that can be read at once, as
        # the local executor's does, not one that appears only once a poll finds lines.
        Path(request.log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(request.log_path).touch()
        uid = ((created or {}).get("metadata") or {}).get("uid")
        if uid:
            # The ConfigMap goes with its Job (garbage collection), whoever deletes the Job.
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
            cluster.call(cluster.core.patch_namespaced_config_map, name, namespace,
                         {"metadata": {"ownerReferences": [owner]}}, _content_type="application/merge-patch+json")
        return self._submission(state_dir, record)

    def _submission(self, state_dir: Path, record: dict) -> Submission:
        return Submission(
            handle=JobHandle(executor=self.name, job_id=f"{record['namespace']}/{record['job']}", state_dir=state_dir),
            host="", gpu_ids=[], gpu_model=None,  # the node is known once the pod is scheduled: poll()'s placement
            started_at=datetime.fromisoformat(record["submitted_at"]), pid=None)

    def adopt(self, state_dir: Path) -> Submission | None:
        record = read_json(Path(state_dir) / JOB_FILE)
        if not record:
            return None
        cluster = self._cluster(record.get("kubeconfig"), record.get("context"))
        if cluster.call(cluster.batch.read_namespaced_job, record["job"], record["namespace"]) is None:
            return None
        return self._submission(Path(state_dir), record)

    # -- poll --------------------------------------------------------------------------------

    def poll(self, handle: JobHandle) -> JobStatus:
        return self.poll_many([handle])[handle.job_id]

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        statuses: dict[str, JobStatus] = {}
        groups: dict[tuple, list[tuple[JobHandle, dict]]] = {}
        for handle in handles:
            state_dir = Path(handle.state_dir)
            final = read_json(state_dir / FINAL_FILE)
            if final is not None:
                statuses[handle.job_id] = status_from_json(final)
                continue
            record = read_json(state_dir / JOB_FILE)
            if record is None:
                statuses[handle.job_id] = JobStatus(phase=JobPhase.VANISHED,
                                                    evidence=(f"no Kubernetes Job was launched from {state_dir}",))
                continue
            key = (record.get("kubeconfig"), record.get("context"), record["namespace"])
            groups.setdefault(key, []).append((handle, record))
        for (kubeconfig, context, namespace), group in groups.items():
            statuses.update(self._poll_namespace(kubeconfig, context, namespace, group))
        return statuses

    def _poll_namespace(self, kubeconfig, context, namespace: str,
                        group: list[tuple[JobHandle, dict]]) -> dict[str, JobStatus]:
        try:
            cluster = self._cluster(kubeconfig, context)
            selector = f"{kube_manifest.LABEL_MANAGED}={kube_manifest.MANAGED_BY}"
            jobs = cluster.call(cluster.batch.list_namespaced_job, namespace, label_selector=selector) or {}
            pods = cluster.call(cluster.core.list_namespaced_pod, namespace, label_selector=selector) or {}
            events = cluster.call(cluster.core.list_namespaced_event, namespace,
                                  field_selector="involvedObject.kind=Pod") or {}
        except ExecutorError as exc:
            # The API server not answering is not the job's end: it is polled again next tick.
            return {handle.job_id: JobStatus(phase=JobPhase.RUNNING, cancelled=(Path(handle.state_dir) / CANCEL_FILE)
                                             .exists(), evidence=(str(exc),)) for handle, _ in group}
        by_job = {(item.get("metadata") or {}).get("name"): item for item in jobs.get("items") or []}
        pods_by_job: dict[str, list[dict]] = {}
        for pod in pods.get("items") or []:
            # By the Job's own label, read here too: not every API server filters by the selector asked.
            owner = ((pod.get("metadata") or {}).get("labels") or {}).get("job-name") or \
                ((pod.get("metadata") or {}).get("labels") or {}).get("batch.kubernetes.io/job-name")
            if owner:
                pods_by_job.setdefault(owner, []).append(pod)
        events_by_pod: dict[str, list[dict]] = {}
        for event in events.get("items") or []:
            involved = event.get("involvedObject") or {}
            if involved.get("kind") == "Pod":
                events_by_pod.setdefault(involved.get("name"), []).append(event)
        statuses = {}
        for handle, record in group:
            statuses[handle.job_id] = self._poll_one(cluster, handle, record, by_job.get(record["job"]),
                                                     pods_by_job.get(record["job"], []), events_by_pod)
        return statuses

    def _poll_one(self, cluster: KubeCluster, handle: JobHandle, record: dict, job: dict | None, pods: list[dict],
                  events_by_pod: dict[str, list[dict]]) -> JobStatus:
        state_dir = Path(handle.state_dir)
        pod = max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", default=None)
        cursor = read_json(state_dir / LOGS_FILE) or {}
        pod_name = (pod.get("metadata") or {}).get("name") if pod is not None else None
        if pod_name and cursor.get("pod") != pod_name:
            cursor = {"pod": pod_name, "stamp": None, "at_stamp": 0}
        seen = kube_endings.Seen(
            job=job, pod=pod, events=tuple(events_by_pod.get(pod_name, ())) if pod_name else (),
            pod_was_seen=bool(cursor.get("pod")), cancelled=(state_dir / CANCEL_FILE).exists(),
            submitted_at=datetime.fromisoformat(record["submitted_at"]),
            pending_s=float(record.get("pending_seconds") or 600), lost_reason=record.get("lost_reason") or
            "infra_transient")
        if pod_name:
            write_json_atomic(state_dir / LOGS_FILE, cursor)
        status = kube_endings.status_of(seen)
        if pod_name and (status.phase is not JobPhase.QUEUED):
            self._pull_log(cluster, record, state_dir, pod_name)
        if status.phase.is_terminal():
            # The end is kept before the Job is deleted: once the pod is gone, only this file knows.
            write_json_atomic(state_dir / FINAL_FILE, status_to_json(status))
            if not record.get("keep_pods"):
                self._delete(cluster, record)
        return status

    def _pull_log(self, cluster: KubeCluster, record: dict, state_dir: Path, pod: str) -> None:
        """Append the pod's log lines not yet read to output.log, and the spool files it printed to spool/."""
        cursor = read_json(state_dir / LOGS_FILE) or {"pod": pod, "stamp": None, "at_stamp": 0}
        kwargs = {"container": kube_manifest.CONTAINER, "timestamps": True}
        if cursor.get("stamp"):
            # From a little before the last line read (a minute for clocks that disagree): lines already
            # read are skipped below by their timestamps.
            last = datetime.fromisoformat(cursor["stamp"][:19] + "+00:00")
            kwargs["since_seconds"] = max(1, int((utc_now() - last).total_seconds()) + SINCE_MARGIN_S)
        data = cluster.raw(cluster.core.read_namespaced_pod_log, pod, record["namespace"], **kwargs)
        if not data:
            return
        lines = data.decode("utf-8", "replace").splitlines()
        out = []
        stamp, at_stamp = cursor.get("stamp"), int(cursor.get("at_stamp") or 0)
        skip = 0
        spool = read_json(state_dir / "k8s-spool.json") or {}
        frames = SpoolFrames(state_dir / "spool", spool)
        for raw in lines:
            match = LOG_LINE.match(raw)
            if not match:
                continue
            when, text = _stamp(match[1], match[2]), match[3]
            if stamp is not None and when < stamp:
                continue
            if stamp is not None and when == stamp:
                skip += 1
                if skip <= at_stamp:
                    continue
                at_stamp += 1
            else:
                stamp, at_stamp, skip = when, 1, 1
            said = frames.line(text)
            if said is not None:
                out.append(f"{when[:26]}Z out {said}\n")
        log = Path(record["local_log"])
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.writelines(out)
        write_json_atomic(state_dir / "k8s-spool.json", spool)
        write_json_atomic(state_dir / LOGS_FILE, {"pod": pod, "stamp": stamp, "at_stamp": at_stamp})

    def _delete(self, cluster: KubeCluster, record: dict) -> None:
        try:
            cluster.call(cluster.batch.delete_namespaced_job, record["job"], record["namespace"],
                         propagation_policy="Background")
            cluster.call(cluster.core.delete_namespaced_config_map, record["job"], record["namespace"])
        except ExecutorError:
            pass  # the end is recorded; a Job left behind is named by its labels for `kubectl delete`

    # -- cancel, logs ------------------------------------------------------------------------

    def cancel(self, handle: JobHandle) -> None:
        """Note that trackway asked, then delete the Job: its pod gets SIGTERM, and SIGKILL after the grace."""
        state_dir = Path(handle.state_dir)
        record = read_json(state_dir / JOB_FILE)
        if record is None:
            raise NotFound(f"no Kubernetes Job was launched from {state_dir}")
        if (state_dir / FINAL_FILE).exists():
            return
        if not (state_dir / CANCEL_FILE).exists():
            write_json_atomic(state_dir / CANCEL_FILE, {"requested_at": utc_now().isoformat(), "epoch": time.time()})
        cluster = self._cluster(record.get("kubeconfig"), record.get("context"))
        # Foreground: the Job stays until its pod is gone, so the pod's last lines can still be read.
        cluster.call(cluster.batch.delete_namespaced_job, record["job"], record["namespace"],
                     propagation_policy="Foreground")

    def logs(self, handle: JobHandle) -> Path:
        record = read_json(Path(handle.state_dir) / JOB_FILE)
        if record is None:
            raise NotFound(f"no Kubernetes Job was launched from {handle.state_dir}")
        return Path(record["local_log"])
