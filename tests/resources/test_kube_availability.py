"""A Kubernetes resource's GPUs per node pool, read through the official client from kmock's emulator."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install -e .[kubernetes])")
pytest.importorskip("kmock", reason="kmock is not installed (pip install -e .[dev])")

from kube_cluster import Emulator  # noqa: E402
from kubernetes import client  # noqa: E402

from trackway.resources.availability import availability  # noqa: E402
from trackway.settings.resources import Resource  # noqa: E402


def node(name: str, pool: str, gpus: int, ready: bool = True, unschedulable: bool = False, **labels) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": pool, **labels}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, namespace: str, node_name: str | None, gpus: int, phase: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


@pytest.fixture
def kube(tmp_path):
    with Emulator() as emulator:
        configuration = client.Configuration()
        configuration.host = emulator.url
        core = client.CoreV1Api(client.ApiClient(configuration))
        yield emulator.kubeconfig(tmp_path / "kubeconfig"), core


def test_allocatable_and_requested_gpus_per_node_pool(kube, cli_process, tmp_path, monkeypatch):
    kubeconfig, core = kube
    for item in (node("a1", "h100", 8, accel="h100"), node("a2", "h100", 8, accel="h100"),
                 node("b1", "a100", 4, accel="a100"), node("a3", "h100", 8, ready=False, accel="h100"),
                 node("a4", "h100", 8, unschedulable=True, accel="h100")):
        core.create_node(item)
    for item in (pod("train-1", "ml-team", "a1", 8, "Running"), pod("train-2", "other", "a2", 2, "Running"),
                 pod("done", "ml-team", "a2", 4, "Succeeded"), pod("eval-1", "ml-team", "b1", 1, "Running"),
                 pod("waiting", "ml-team", None, 8, "Pending")):
        core.create_namespaced_pod(item["metadata"]["namespace"], item)
    res = Resource(name="k8s", executor="kubernetes", namespace="ml-team", image="python:3.12-slim",
                   kubeconfig=str(kubeconfig), context="kmock")

    row = availability(res)
    assert row.reachable, row.error
    # a3 is not ready and a4 cordoned: neither counts; a finished pod holds nothing.
    assert list(row.pools) == [{"name": "a100", "nodes": 1, "allocatable": 4, "requested": 1},
                               {"name": "h100", "nodes": 2, "allocatable": 16, "requested": 10}]
    assert (row.free_gpus, row.total_gpus, row.running_jobs, row.pending_jobs) == (9, 20, 2, 1)

    only_h100 = availability(Resource(**{**res.__dict__, "node_selector": (("accel", "h100"),)}))
    assert [pool["name"] for pool in only_h100.pools] == ["h100"] and only_h100.free_gpus == 6

    (tmp_path / "work" / "trackway.toml").write_text(
        f'[resources.k8s]\nexecutor = "kubernetes"\nnamespace = "ml-team"\nimage = "python:3.12-slim"\n'
        f'kubeconfig = "{kubeconfig}"\n')
    monkeypatch.setenv("COLUMNS", "200")
    shown = cli_process("resources")
    assert shown.code == 0, shown.err
    assert "k8s (ml-team) pool h100: 16 GPUs allocatable, 10 requested, 2 nodes" in shown.out
    listed = cli_process("resources", "--json")
    assert listed.json()[0]["pools"][1] == {"name": "h100", "nodes": 2, "allocatable": 16, "requested": 10}


def test_a_cluster_that_cannot_be_reached_is_a_row_saying_so(tmp_path):
    kubeconfig = Emulator.kubeconfig(type("Down", (), {"url": "http://127.0.0.1:9"})(), tmp_path / "kubeconfig")
    row = availability(Resource(name="k8s", executor="kubernetes", namespace="ml", image="x",
                                kubeconfig=str(kubeconfig), context="kmock"), timeout_s=2)
    assert not row.reachable and row.error.startswith("Kubernetes API unreachable")


def test_a_namespace_that_is_not_dns_1123_is_one_line_and_exit_2(cli_process, tmp_path):
    (tmp_path / "work" / "trackway.toml").write_text(
        '[resources.k8s]\nexecutor = "kubernetes"\nnamespace = "ML_Team"\nimage = "python:3.12-slim"\n')
    shown = cli_process("resources")
    assert shown.code == 2
    assert shown.err.strip().splitlines() == [
        f"trackway: error: {tmp_path / 'work' / 'trackway.toml'}:3: [resources.k8s] namespace: expected a DNS-1123 "
        "label (lower-case letters, digits and '-', at most 63 characters, alphanumeric at both ends), got 'ML_Team'"]


def test_a_kubeconfig_context_that_does_not_exist_is_a_row_saying_so(tmp_path):
    kubeconfig = Emulator.kubeconfig(type("Any", (), {"url": "http://127.0.0.1:9"})(), tmp_path / "kubeconfig")
    row = availability(Resource(name="k8s", executor="kubernetes", namespace="ml", image="x",
                                kubeconfig=str(kubeconfig), context="staging"), timeout_s=2)
    assert not row.reachable
    assert row.error.startswith(f"kubeconfig {kubeconfig} context 'staging': ") and "\n" not in row.error
