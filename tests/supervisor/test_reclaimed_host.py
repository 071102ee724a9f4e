"""A spot pod reclaimed mid-run: the attempt ends `preempted`, the retry runs on another host from the checkpoint in S3.

Real parts only: two hosts, each its own sshd in its own network namespace with its own working
directory (tests/ssh_hosts.py), S3 from moto's standalone server, the tiny CharLM trained by
examples/train_tiny.py with the SDK. Host A is reclaimed the way a provider does it: every
process on it killed at once and its disk wiped, so the only checkpoints left are in S3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trackway.checkpoints.object_store import RemoteCheckpointStore
from trackway.ledger import open_ledger
from trackway.ledger.reader import Reader
from trackway.ledger.records import list_attempts, resolve_run
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["train.log_every=5", "train.checkpoint_every=10", "model.hidden=32", "train.batch_size=16", "train.steps=80"]


def pods_toml(hosts, workdir_template: str, bucket_url: str) -> str:
    specs = ", ".join(f'"{host.spec}"' for host in hosts)
    return (
        '[resources.pods]\nexecutor = "ssh"\n'
        f"hosts = [{specs}]\n"
        f'key_file = "{hosts[0].key}"\nworkdir = "{workdir_template}"\n'
        'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n'
        'preemptible = true\nunreachable_seconds = 3\ngrace_seconds = 10\nforward_env = ["AWS_*"]\n'
        f'checkpoint_root = "{bucket_url}"\n\n'
        '[resources.here]\nexecutor = "local"\n'
    )


@pytest.fixture
def s3_for_hosts(netns_hosts):
    """moto's S3 where every host (and this process) reaches it: the address each namespace routes to us."""
    from s3_server import running_moto

    with running_moto(host=netns_hosts.service_address) as server:
        yield server


def test_a_reclaimed_pod_resumes_on_another_host_from_s3_to_the_same_final_loss(
        tmp_path, netns_hosts, s3_for_hosts, monkeypatch, sqlite_url):
    s3 = s3_for_hosts
    host_a, host_b = netns_hosts("a"), netns_hosts("b")
    template = str(tmp_path / "hosts" / "{host}" / "work")
    for host in (host_a, host_b):
        host.work = Path(template.replace("{host}", host.address))
        host.work.mkdir(parents=True)
    bucket = s3.bucket("reclaim")
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    work = tmp_path / "project"
    work.mkdir()
    (work / "trackway.toml").write_text(pods_toml([host_a, host_b], template, f"s3://{bucket}/ckpts"))
    corpus = work / "corpus.txt"
    subprocess.run([sys.executable, str(EXAMPLES / "make_corpus.py"), str(corpus), "--lines", "2000"], check=True,
                   capture_output=True)
    settings = load_settings(home=work / "home", db=sqlite_url, cwd=work)
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    command = [sys.executable, str(EXAMPLES / "train_tiny.py"), "--data-file", str(corpus), "--step-delay", "0.1"]

    def submit(resource: str) -> str:
        spec = RunSpec(command=command, cwd=work, resource=resource, overrides=TINY,
                       config_path=str(EXAMPLES / "tiny.toml"), environ=dict(os.environ))
        run_id = submit_run(ledger, settings, spec)
        start_attempt(ledger, settings, run_id, supervisor.executor, first=True)
        return run_id

    reference = submit("here")
    pod_run = submit("pods")
    with ledger.read() as conn:
        url = resolve_run(conn, pod_run)["checkpoint_root"]
    assert url == f"s3://{bucket}/ckpts/{pod_run}"
    store = RemoteCheckpointStore(url)
    reclaimed_at = []

    def reclaim_once_a_checkpoint_is_in_s3():
        if reclaimed_at:
            return
        uploaded = store.latest_committed(verify=True)
        if uploaded is not None and uploaded.step >= 20:
            host_a.reclaim()  # every process on the pod killed at once, its disk wiped
            reclaimed_at.append(uploaded.step)

    deadline = time.monotonic() + 300
    while True:
        supervisor.tick()
        reclaim_once_a_checkpoint_is_in_s3()
        with ledger.read() as conn:
            states = [resolve_run(conn, r)["state"] for r in (reference, pod_run)]
        if all(state in ("completed", "failed", "cancelled") for state in states):
            break
        assert time.monotonic() < deadline, f"runs still {states}"
        time.sleep(0.3)

    with ledger.read() as conn:
        first, second = list_attempts(conn, run_id=pod_run)
        final = {r: Reader.over(conn).metric_points(r, key="loss")[-1]["value"] for r in (reference, pod_run)}
    assert reclaimed_at, "host A was never reclaimed: no checkpoint reached S3"
    assert first["host"] == host_a.spec and second["host"] == host_b.spec
    assert first["termination_reason"] == "preempted"
    evidence = "\n".join(json.loads(first["termination_evidence"])["lines"])
    assert f"host {host_a.spec} unreachable since" in evidence and "preemptible" in evidence
    assert second["termination_reason"] == "completed"
    assert second["resumed_from_checkpoint"] is not None
    assert int(second["resumed_from_checkpoint"].removeprefix("step-")) >= reclaimed_at[0]
    assert final[pod_run] == final[reference]

    def trackway(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "trackway", *args], cwd=work, capture_output=True, text=True, timeout=120,
            env={**os.environ, "TRACKWAY_HOME": str(settings.home), "TRACKWAY_DB": sqlite_url})
        assert done.returncode == 0, done.stderr
        return done.stdout

    said = " ".join(trackway("explain", second["attempt_id"]).split())
    assert host_b.spec in said and second["resumed_from_checkpoint"] in said
    assert f"{url}/{second['resumed_from_checkpoint']}" in said  # where it was read from

    # The store is the run's checkpoints now: listed from S3, and retention applies there.
    listed = json.loads(trackway("checkpoints", pod_run, "--json"))
    assert [c["step"] for c in listed] == list(range(10, 90, 10))
    assert all(c["path"] == f"{url}/{c['name']}" and c["state"] == "committed" for c in listed)
    trackway("gc", pod_run, "--keep-last", "2")
    assert [c.step for c in store.list() if c.state.readable] == [70, 80]
    ledger.dispose()
