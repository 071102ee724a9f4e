"""Evaluation seeds on a resource of their own (an inference box over SSH), reading the checkpoint from S3."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from trackway.checkpoints.object_store import RemoteCheckpointStore

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")
NO_HOST_KEYS = '["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]'


def evaluations_ended(cli, run: str, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        assert cli("supervise", "--once").code == 0
        rows = cli("evals", run, "--json").json()["evaluations"]
        if rows and all(r["state"] != "running" for r in rows):
            return rows
        assert time.monotonic() < deadline, f"evaluations of {run} still running: {rows}"
        time.sleep(0.2)


def test_seeds_run_on_the_specs_ssh_resource_from_the_runs_object_store(
        cli, write_spec, loopback_host, s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.bucket("evals")
    Path("trackway.toml").write_text(
        f'[resources.here]\nexecutor = "local"\ncheckpoint_root = "s3://{bucket}/ckpts"\n\n'
        f'[resources.box]\nexecutor = "ssh"\nhosts = ["{loopback_host.spec}"]\nkey_file = "{loopback_host.key}"\n'
        f'workdir = "{loopback_host.work}"\nssh_options = {NO_HOST_KEYS}\nforward_env = ["AWS_*"]\n'
        'use_for = ["eval"]\n'
        # The box's environment with trackway in it, as a user's setup activates one.
        f'setup = "export PATH={Path(PY).parent}:$PATH"\n')
    spec = write_spec("toy", body='seeds = [0]\nmetrics = ["pass@1"]\nresource = "box"\n\n[decoding]\nsamples = 2\n')

    result = cli("submit", "--name", "train", "--resource", "here", "--eval", str(spec), "--", PY, NEUTRAL, "25")
    assert result.code == 0, result.err
    rows = evaluations_ended(cli, "train")

    assert [r["step"] for r in rows] == [10, 20]
    assert all(r["state"] == "completed" for r in rows), rows
    url = cli("show", "train", "--json").json()["checkpoint_root"]
    assert url.startswith(f"s3://{bucket}/ckpts/")
    detail = cli("eval", "show", rows[0]["eval_id"], "--json").json()
    assert detail["checkpoint_path"] == f"{url}/step-00000010"
    (attempt,) = cli("attempts", "train@10/toy/seed-0", "--json").json()
    assert attempt["executor"] == "ssh" and attempt["host"] == loopback_host.spec
    assert attempt["termination_reason"] == "completed"
    log = Path(attempt["log_path"]).read_text()
    assert "evaluator v1: step 10 seed 0" in log  # it read counter.txt from the checkpoint it downloaded
    # The evaluator saw a verified local copy of the checkpoint, not the URL.
    assert RemoteCheckpointStore(url).get(10).manifest_sha256 == detail["checkpoint_manifest_sha256"]
