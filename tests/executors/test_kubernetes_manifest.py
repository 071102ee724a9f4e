"""Every Job and ConfigMap the Kubernetes executor renders, validated against the official OpenAPI schemas.

kubernetes-validate holds the schemas of each Kubernetes release offline; strict mode refuses unknown
fields too. What the schemas cannot say (DNS-1123 names, a Job's restartPolicy, an image present,
label lengths, quantities) kube_manifest.problems() checks, and is tested here rule by rule.
"""

from __future__ import annotations

import base64
import copy
import sys

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e .[dev]")

from trackway.executors.base import LaunchRequest  # noqa: E402
from trackway.executors.code_snapshot import build_snapshot  # noqa: E402
from trackway.executors.kube_manifest import label_value, job_name, problems  # noqa: E402
from trackway.settings.resources import Resource  # noqa: E402

VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]

BASE = dict(name="k8s", executor="kubernetes", namespace="ml-team", image="registry.example.com/train@sha256:"
            + "ab" * 32, gpus_per_node=8)
VARIANTS = {
    "plain, no GPU": ({}, 0, None),
    "8 GPUs, CPU and memory, a deadline": (dict(cpu="32", memory="256Gi"), 8, 3600.0),
    "AMD GPUs on a tainted pool, a PVC": (dict(
        gpu_resource="amd.com/gpu", node_selector=(("cloud.google.com/gke-nodepool", "mi300"),),
        tolerations=({"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                      "tolerationSeconds": 30}),
        pvc="team-checkpoints", pvc_mount="/ckpt"), 4, None),
    "priority, service account, kept pods": (dict(priority_class="training", service_account="trainer",
                                                  keep_pods=True), 1, 90.5),
}


def rendered(tmp_path, overrides: dict, gpus: int, time_limit_s):
    from trackway.executors.kubernetes import KubernetesExecutor

    work = tmp_path / "project"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('hi')\n")
    config = tmp_path / "config.json"
    config.write_text('{"lr": 0.1}')
    env = {"TRACKWAY_RUN_ID": "r-20261129-abc", "TRACKWAY_ATTEMPT_ID": "r-20261129-abc/2", "TRACKWAY_CONFIG":
           str(config), "TRACKWAY_EVAL_OUTPUT": str(tmp_path / "eval-output.jsonl"), "WANDB_MODE": "offline"}
    request = LaunchRequest(attempt_id="r-20261129-abc/2", command=[sys.executable, "train.py", "--lr", "0.1"],
                            cwd=work, env=dict(env), state_dir=tmp_path / "state", log_path=tmp_path / "state" / "o.log",
                            gpus=gpus, time_limit_s=time_limit_s, grace_s=45.0, resource=Resource(**BASE, **overrides),
                            run_env=env, code=build_snapshot(work, None, None))
    return KubernetesExecutor(tmp_path / "home")._render(request)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_manifest_is_valid_for_each_supported_kubernetes(tmp_path, variant):
    job, bundle = rendered(tmp_path, *VARIANTS[variant])
    for version in VERSIONS:
        for manifest in (job, bundle):
            kubernetes_validate.validate(copy.deepcopy(manifest), version, strict=True)  # raises when invalid
    assert problems(job) == []


def test_the_job_says_what_the_issue_asks(tmp_path):
    job, bundle = rendered(tmp_path, *VARIANTS["8 GPUs, CPU and memory, a deadline"])
    spec = job["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert (spec["backoffLimit"], pod["restartPolicy"], pod["terminationGracePeriodSeconds"]) == (0, "Never", 45)
    assert spec["activeDeadlineSeconds"] == 3600
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"},
                                      "requests": {"cpu": "32", "memory": "256Gi"}}
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["WANDB_MODE"] == "offline" and env["TRACKWAY_CONFIG"] == "/trackway/bundle/input-trackway-config"
    assert env["TRACKWAY_EVAL_OUTPUT"] == "/trackway/attempt/eval-output.jsonl"
    assert base64.b64decode(bundle["binaryData"]["input-trackway-config"]) == b'{"lr": 0.1}'
    assert container["command"][-4:] == [sys.executable, "train.py", "--lr", "0.1"]
    assert job["metadata"]["annotations"]["trackway.dev/attempt-id"] == "r-20261129-abc/2"


def test_the_pvc_holds_the_runs_checkpoints(tmp_path):
    job, _ = rendered(tmp_path, *VARIANTS["AMD GPUs on a tainted pool, a PVC"])
    pod = job["spec"]["template"]["spec"]
    env = {item["name"]: item["value"] for item in pod["containers"][0]["env"]}
    assert env["TRACKWAY_CHECKPOINT_DIR"] == "/ckpt/runs/r-20261129-abc/checkpoints"
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-checkpoints"}} in pod["volumes"]
    assert pod["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "4"}


def test_names_and_labels_fit_what_the_server_takes_whatever_the_ids():
    long_id = "r-" + "x" * 80 + "/12"
    assert len(job_name(long_id)) <= 63 and job_name(long_id) != job_name("r-" + "x" * 80 + "/13")
    for text in (long_id, "run/1", "_weird_/3", "a.b-c_d/9"):
        value = label_value(text)
        assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum(), value


@pytest.mark.parametrize("edit, said", [
    (lambda job: job["metadata"].update(namespace="ML_team"), "metadata.namespace 'ML_team': expected a DNS-1123"),
    (lambda job: job["metadata"].update(name="Job_1"), "metadata.name 'Job_1': expected a DNS-1123 label"),
    (lambda job: job["spec"]["template"]["spec"].update(restartPolicy="Always"),
     "restartPolicy 'Always': a Job takes Never or OnFailure"),
    (lambda job: job["spec"]["template"]["spec"]["containers"][0].update(image=" "), "expected an image"),
    (lambda job: job["metadata"]["labels"].update(team="x" * 64), "expected a label value of at most 63"),
    (lambda job: job["spec"]["template"]["spec"]["containers"][0].update(resources={"limits": {"cpu": "lots"}}),
     "resources.limits[cpu] 'lots': expected a quantity"),
])
def test_what_the_schema_allows_and_the_server_refuses_is_caught_here(tmp_path, edit, said):
    job, _ = rendered(tmp_path, *VARIANTS["plain, no GPU"])
    edit(job)
    kubernetes_validate.validate(copy.deepcopy(job), VERSIONS[-1], strict=True)  # the schema lets it through
    found = problems(job)
    assert len(found) == 1 and said in found[0], found


def test_the_validator_would_refuse_a_wrong_manifest(tmp_path):
    """The check above can fail: a misspelt field and a wrong type are refused by the same schemas."""
    job, _ = rendered(tmp_path, *VARIANTS["plain, no GPU"])
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["backofLimit"] = 0
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, VERSIONS[0], strict=True)
