"""The Kubernetes objects one attempt is: a batch/v1 Job, the ConfigMap carrying its code, and our own checks of both.

An attempt is one Job (`backoffLimit: 0`, `restartPolicy: Never`: trackway decides retries, not
the Job controller) whose one pod runs the command in the resource's image. The code reaches the
pod as the receipt's snapshot (executors/code_snapshot.py: the recorded commit plus the recorded
diff, as a gzip tar) in a ConfigMap mounted at /trackway/bundle; the pod's launch script unpacks
it into an emptyDir and runs the command there. The image is the resource's; when it is named
by tag, the digest the kubelet pulled is read back from the pod's status and recorded.

The API server enforces rules that an offline OpenAPI schema does not (DNS-1123 names, a Job's
restartPolicy, a container's image, label lengths, quantities): `problems()` checks them here, so
a bad manifest is refused with a line that names the field before anything is sent.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
from dataclasses import dataclass

import yaml

from trackway.settings.kube_names import QUANTITY, is_dns_label, is_dns_subdomain, is_label_key, is_label_value

# The pod's own paths: the bundle (read-only), the attempt's scratch (spool, inputs, the unpacked code).
BUNDLE_DIR = "/trackway/bundle"
WORK_DIR = "/trackway/attempt"
CONTAINER = "attempt"
CODE_KEY = "code.tar.gz"
# A ConfigMap holds at most 1 MiB (etcd's object limit, less room for its metadata).
MAX_BUNDLE_BYTES = 1_000_000

LABEL_RUN = "trackway.dev/run"
LABEL_ATTEMPT = "trackway.dev/attempt"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "trackway"
ANNOTATION_ATTEMPT = "trackway.dev/attempt-id"
ANNOTATION_CODE = "trackway.dev/code"

ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# The pod's entry point, as `sh -c SCRIPT trackway-launch COMMAND...`: unpack the code, run the command
# as a child (its exit status is the container's), pass SIGTERM on (Kubernetes sends it
# terminationGracePeriodSeconds before SIGKILL: the SDK's preemption notice). Meanwhile, every
# TRACKWAY_RELAY_SECONDS and once more at the end, print what the spool's files gained, framed
# (`@@trackway-spool NAME OFFSET SIZE`, base64 lines each prefixed `@@: `, `@@trackway-spool-end NAME`;
# files the SDK replaces whole, heartbeat.json and termination.json, with OFFSET `whole`): the log API
# is the one way back from a pod that the executor has, so the SDK's metrics, heartbeat and note come
# back through it while it runs. The command shares the pod's stdout: each of the frame's lines is one
# write (awk's fflush), so no line of the command's lands inside one, and the prefix tells the frame's
# lines from the command's; SIZE lets the reader know a frame that lost a line (executors/kube_spool.py).
LAUNCH_SCRIPT = """\
set -u
mkdir -p "$TRACKWAY_SPOOL_DIR" "$TRACKWAY_CODE_DIR" "$TRACKWAY_CODE_DIR.relay"
tar -xzf "$TRACKWAY_BUNDLE/code.tar.gz" -C "$TRACKWAY_CODE_DIR" || { echo "trackway: could not unpack the code" >&2; exit 126; }
cd "$TRACKWAY_CODE_DIR/$TRACKWAY_CODE_CWD" || exit 126
frame() {
  echo "@@trackway-spool $1 $2 $3"
  base64 | awk '{ print "@@: " $0; fflush() }'
  echo "@@trackway-spool-end $1"
}
relay() {
  for file in "$TRACKWAY_SPOOL_DIR"/*; do
    [ -f "$file" ] || continue
    name=${file##*/}
    mark="$TRACKWAY_CODE_DIR.relay/$name"
    case "$name" in
      heartbeat.json|termination.json)
        cp "$file" "$mark.now" 2>/dev/null || continue
        now=$(cksum < "$mark.now")
        [ "$now" != "$(cat "$mark" 2>/dev/null)" ] || continue
        frame "$name" whole "$(wc -c < "$mark.now" | tr -d ' ')" < "$mark.now"
        echo "$now" > "$mark" ;;
      *.jsonl)
        sent=$(cat "$mark" 2>/dev/null || echo 0)
        size=$(wc -c < "$file" | tr -d ' ')
        [ "$size" -gt "$sent" ] || continue
        tail -c +$((sent + 1)) "$file" | head -c $((size - sent)) | frame "$name" "$sent" $((size - sent))
        echo "$size" > "$mark" ;;
    esac
  done
}
child=
trap 'test -n "$child" && kill -TERM "$child" 2>/dev/null' TERM INT
"$@" &
child=$!
( nap=; trap 'kill $nap 2>/dev/null; exit 0' TERM
  while :; do sleep "${TRACKWAY_RELAY_SECONDS:-5}" & nap=$!; wait $nap; relay; done ) &
relayer=$!
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
kill "$relayer" 2>/dev/null
wait "$relayer" 2>/dev/null
relay
exit "$status"
"""
SPOOL_BEGIN = "@@trackway-spool "
SPOOL_END = "@@trackway-spool-end "
SPOOL_DATA = "@@: "


@dataclass(frozen=True)
class KubeTarget:
    """What a resource says about where and how its pods run."""

    namespace: str
    image: str
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict, ...] = ()
    priority_class: str | None = None
    service_account: str | None = None
    cpu: str | None = None  # per pod, requested and limited
    memory: str | None = None
    pvc: str | None = None  # a PersistentVolumeClaim mounted at pvc_mount (checkpoints outlive the pod)
    pvc_mount: str = "/checkpoints"


def label_value(text: str) -> str:
    """`text` as a valid label value (63 characters of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    if len(value) > 63:
        value = value[:54] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return value.strip("-_.") or "x"


def job_name(attempt_id: str) -> str:
    """A DNS-1123 label naming the attempt's Job (and prefixing its pod's name): `tw-<run>-<n>-<hash>`."""
    digest = hashlib.sha256(attempt_id.encode()).hexdigest()[:6]
    stem = re.sub(r"[^a-z0-9]+", "-", attempt_id.lower()).strip("-")[:40].strip("-")
    return f"tw-{stem}-{digest}"


def pod_env(request_env: dict[str, str], run_id: str, target: KubeTarget, code_cwd: str,
            inputs: dict[str, str]) -> dict[str, str]:
    """The pod's variables: the run's, with the paths of this machine replaced by the pod's."""
    env = dict(request_env)
    env["TRACKWAY_SPOOL_DIR"] = posixpath.join(WORK_DIR, "spool")
    env["TRACKWAY_CODE_DIR"] = posixpath.join(WORK_DIR, "code")
    env["TRACKWAY_CODE_CWD"] = code_cwd
    env["TRACKWAY_BUNDLE"] = BUNDLE_DIR
    env["TRACKWAY_CHECKPOINT_DIR"] = (posixpath.join(target.pvc_mount, "runs", run_id, "checkpoints") if target.pvc
                                      else posixpath.join(WORK_DIR, "checkpoints"))
    if "TRACKWAY_EVAL_OUTPUT" in env:
        env["TRACKWAY_EVAL_OUTPUT"] = posixpath.join(WORK_DIR, posixpath.basename(env["TRACKWAY_EVAL_OUTPUT"]))
    for name, key in inputs.items():
        env[name] = posixpath.join(BUNDLE_DIR, key)
    return env


def job_manifest(*, name: str, run_id: str, attempt_id: str, target: KubeTarget, command: list[str],
                 env: dict[str, str], gpus: int, grace_s: float, time_limit_s: float | None,
                 code_source: str) -> dict:
    """The batch/v1 Job of one attempt, as a plain dict (what `kubectl apply -f` would take)."""
    labels = {LABEL_MANAGED: MANAGED_BY, LABEL_RUN: label_value(run_id), LABEL_ATTEMPT: label_value(attempt_id)}
    annotations = {ANNOTATION_ATTEMPT: attempt_id, ANNOTATION_CODE: code_source}
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if gpus:
        limits[target.gpu_resource] = str(gpus)  # extended resources: the request is the limit
    if target.cpu:
        requests["cpu"] = limits["cpu"] = target.cpu
    if target.memory:
        requests["memory"] = limits["memory"] = target.memory
    mounts = [{"name": "bundle", "mountPath": BUNDLE_DIR, "readOnly": True},
              {"name": "work", "mountPath": WORK_DIR}]
    volumes: list[dict] = [{"name": "bundle", "configMap": {"name": name}}, {"name": "work", "emptyDir": {}}]
    if target.pvc:
        mounts.append({"name": "checkpoints", "mountPath": target.pvc_mount})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": target.pvc}})
    container: dict = {
        "name": CONTAINER,
        "image": target.image,
        "command": ["/bin/sh", "-c", LAUNCH_SCRIPT, "trackway-launch", *command],
        "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
        "volumeMounts": mounts,
    }
    if limits or requests:
        container["resources"] = {key: value for key, value in (("limits", limits), ("requests", requests)) if value}
    if not gpus:
        # A pod that asked for no GPU must not see the node's (the NVIDIA runtime shows all without this).
        container["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})
    pod_spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(math.ceil(grace_s)),
        "containers": [container],
        "volumes": volumes,
    }
    if target.node_selector:
        pod_spec["nodeSelector"] = dict(target.node_selector)
    if target.tolerations:
        pod_spec["tolerations"] = [dict(item) for item in target.tolerations]
    if target.priority_class:
        pod_spec["priorityClassName"] = target.priority_class
    if target.service_account:
        pod_spec["serviceAccountName"] = target.service_account
    spec: dict = {
        "backoffLimit": 0,
        # The pod's own failure ends the Job at once (a pod that is disrupted too: trackway retries it).
        "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod_spec},
    }
    if time_limit_s:
        spec["activeDeadlineSeconds"] = int(math.ceil(time_limit_s))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": target.namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def bundle_manifest(name: str, namespace: str, labels: dict[str, str], files: dict[str, str]) -> dict:
    """The ConfigMap carrying the code snapshot and the attempt's input files (base64, by key)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "binaryData": dict(files)}


def problems(manifest: dict) -> list[str]:
    """What the API server would refuse in a Job manifest that its OpenAPI schema allows, one line each."""
    found = []
    meta = manifest.get("metadata") or {}
    name, namespace = meta.get("name") or "", meta.get("namespace") or ""
    if not is_dns_label(namespace):
        found.append(f"metadata.namespace {namespace!r}: expected a DNS-1123 label (lower-case letters, digits and "
                     "'-', at most 63 characters, alphanumeric at both ends)")
    if not is_dns_label(name):
        found.append(f"metadata.name {name!r}: expected a DNS-1123 label of at most 63 characters")
    template = (manifest.get("spec") or {}).get("template") or {}
    for where, labels in (("metadata.labels", meta.get("labels") or {}),
                          ("spec.template.metadata.labels", (template.get("metadata") or {}).get("labels") or {}),
                          ("spec.template.spec.nodeSelector", (template.get("spec") or {}).get("nodeSelector") or {})):
        for key, value in labels.items():
            if not is_label_key(key):
                found.append(f"{where} key {key!r}: expected [prefix/]name, name at most 63 characters")
            if not is_label_value(value):
                found.append(f"{where}[{key}] {value!r}: expected a label value of at most 63 characters")
    pod = template.get("spec") or {}
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        found.append(f"spec.template.spec.restartPolicy {pod.get('restartPolicy')!r}: a Job takes Never or OnFailure")
    for container in pod.get("containers") or []:
        if not str(container.get("image") or "").strip():
            found.append(f"container {container.get('name')!r}: expected an image")
        for item in container.get("env") or []:
            if not ENV_NAME.match(item["name"]):
                found.append(f"container {container.get('name')!r} env {item['name']!r}: expected a variable name of "
                             "letters, digits, '_', '-' and '.', not starting with a digit")
        for kind, quantities in ((container.get("resources") or {}).items()):
            for resource, quantity in quantities.items():
                if not QUANTITY.match(str(quantity)):
                    found.append(f"container {container.get('name')!r} resources.{kind}[{resource}] {quantity!r}: "
                                 "expected a quantity such as 8, 500m, 64Gi")
    account = pod.get("serviceAccountName")
    if account is not None and not is_dns_subdomain(account):
        found.append(f"spec.template.spec.serviceAccountName {account!r}: expected a DNS-1123 subdomain")
    return found


def to_yaml(*documents: dict) -> str:
    """The objects as one YAML stream, in the order given (kubectl apply -f - takes it as it is)."""
    return "---\n".join(yaml.safe_dump(document, sort_keys=False, width=120) for document in documents)
