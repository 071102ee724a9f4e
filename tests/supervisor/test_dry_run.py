"""`trackway submit --dry-run` (and the API's `dry_run`): what would be submitted, on every executor, recording nothing.

Real parts: the CLI in this process on a SQLite ledger, the single-node Slurm (scripts/ensure-slurm.sh),
an sshd on loopback (tests/ssh_hosts.py), the API server in a thread.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, func, select

from trackway.ledger.schema import metadata

PY = sys.executable
SECRET = "s3cr3t-value-of-the-token"


def _row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {table.name: conn.execute(select(func.count()).select_from(table)).scalar()
                    for table in metadata.sorted_tables}
    finally:
        engine.dispose()


def _sbatch_script(out: str) -> str:
    """The script between the dry run's `--- PATH` and `---` lines."""
    match = re.search(r"^--- \S+slurm\.sbatch\n(.*?)\n---$", out, re.S | re.M)
    assert match, out
    return match[1]


def test_a_local_dry_run_prints_the_command_and_environment_names_and_records_nothing(
        cli_sqlite, sqlite_url, home, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    Path("train.py").write_text("print('trained')\n")
    assert cli_sqlite("runs", "--json").code == 0  # the ledger exists, empty
    before = _row_counts(sqlite_url)

    shown = cli_sqlite("submit", "--dry-run", "--time-limit", "0.5", "--", PY, "train.py", "--lr", "3e-4")

    assert shown.code == 0, shown.err
    out = shown.out
    assert out.startswith("dry run: nothing recorded, nothing started\n")
    assert "resource: chose local" in out
    assert f"command: {PY} train.py --lr 3e-4" in out
    assert f"working directory: {Path.cwd()}" in out
    assert "time limit: 1800 s" in out
    # The run's variables by name (a secret's value never printed), trackway's own with their values.
    assert "HF_TOKEN" in out and SECRET not in out
    run_id = re.search(r"^attempt: (\S+)/1 ", out, re.M)[1]
    assert f"  TRACKWAY_RUN_ID={run_id}" in out
    assert _row_counts(sqlite_url) == before
    assert not (home / "runs" / run_id).exists()
    assert cli_sqlite("runs", "--json").json() == []


def test_a_dry_run_refuses_bad_input_as_submit_does(cli_sqlite, sqlite_url):
    assert cli_sqlite("runs", "--json").code == 0
    before = _row_counts(sqlite_url)
    refused = cli_sqlite("submit", "--dry-run", "--gpus", "-1", "--", PY, "-c", "pass")
    assert refused.code == 2
    assert refused.err.strip().splitlines()[-1] == "trackway: error: --gpus -1: expected a whole number from 0 to 100000", refused.err
    assert _row_counts(sqlite_url) == before


SLURM = '[resources.lab]\nexecutor = "slurm"\npartition = "test"\ngpus_per_node = 2\nsbatch = ["--mem=1G"]\n' \
        'setup = "export FROM_SETUP=1"\n'


SLEEPS = "import time; time.sleep(120)"


def _squeue() -> str:
    return subprocess.run(["squeue", "--noheader", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout


def test_a_slurm_dry_run_prints_the_sbatch_script_that_submit_then_writes(slurm_node, cli_sqlite, sqlite_url, home,
                                                                         monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    Path("trackway.toml").write_text(SLURM)
    assert cli_sqlite("runs", "--json").code == 0
    before, queue = _row_counts(sqlite_url), _squeue()

    # A command that is still running when the test cancels it below (a quick one may have completed by then).
    shown = cli_sqlite("submit", "--dry-run", "--gpus", "1", "--time-limit", "0.5", "--", PY, "-c", SLEEPS)

    assert shown.code == 0, shown.err
    assert "resource: chose lab" in shown.out
    assert "executor slurm: `sbatch --parsable " in shown.out and "(partition test)" in shown.out
    previewed = _sbatch_script(shown.out)
    for option in ("--partition=test", "--time=30", "--gres=gpu:1", "--mem=1G", "--no-requeue"):
        assert f"#SBATCH {option}\n" in previewed
    assert "export FROM_SETUP=1" in previewed
    assert _row_counts(sqlite_url) == before and _squeue() == queue  # nothing recorded, nothing queued
    dry_id = re.search(r"^attempt: (\S+)/1 ", shown.out, re.M)[1]

    # The real submit writes the same script: one renderer, no drift (the run id aside).
    assert cli_sqlite("submit", "--detach", "--name", "real", "--gpus", "1", "--time-limit", "0.5", "--",
                      PY, "-c", SLEEPS).code == 0
    (attempt,) = cli_sqlite("attempts", "real", "--json").json()
    run_id = attempt["attempt_id"].split("/")[0]
    written = (home / "runs" / run_id / "attempts" / "1" / "slurm.sbatch").read_text()
    assert previewed.replace(dry_id, run_id) == written.rstrip("\n")
    assert cli_sqlite("cancel", "real").code == 0


def test_an_ssh_dry_run_names_the_host_and_the_launch_and_contacts_nothing(loopback_host, cli_sqlite, sqlite_url):
    Path("trackway.toml").write_text(
        '[resources.box]\nexecutor = "ssh"\n'
        f'hosts = ["{loopback_host.spec}"]\nkey_file = "{loopback_host.key}"\nworkdir = "{loopback_host.work}"\n'
        'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n'
        'gpus_per_node = 2\nsetup = "export FROM_SETUP=1"\n')
    Path("train.py").write_text("print('trained')\n")
    assert cli_sqlite("runs", "--json").code == 0
    before = _row_counts(sqlite_url)

    shown = cli_sqlite("submit", "--dry-run", "--gpus", "1", "--", "python3", "train.py")

    assert shown.code == 0, shown.err
    out = shown.out
    assert f"executor ssh: host {loopback_host.spec}" in out
    run_id = re.search(r"^attempt: (\S+)/1 ", out, re.M)[1]
    remote_dir = f"{loopback_host.work}/attempts/{run_id}/1"
    assert f"agent.py start {remote_dir}`" in out
    assert "command: /bin/bash -c 'export FROM_SETUP=1" in out and "trackway-setup python3 train.py" in out
    assert "GPUs: 0 (CUDA_VISIBLE_DEVICES on the host)" in out
    assert f"  TRACKWAY_SPOOL_DIR={remote_dir}/spool" in out
    assert "TRACKWAY_HOME" not in out and "TRACKWAY_DB" not in out  # this machine's paths are never sent
    assert _row_counts(sqlite_url) == before
    assert not loopback_host.work.exists() or not any(loopback_host.work.iterdir())  # the host was not touched


def test_the_api_dry_run_answers_what_would_be_submitted_and_records_nothing(home, sqlite_url):
    from ..api_server import Api, serving

    Path("train.py").write_text("print('trained')\n")
    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        status, answer, _ = api.post("/api/jobs", {"script": "train.py", "dry_run": True, "args": ["--epochs", "2"]})
        assert status == 200, answer
        assert answer["dry_run"] is True and answer["resource"] == "local" and answer["executor"] == "local"
        assert "train.py --epochs 2" in answer["submitted"] and answer["selection"].startswith("chose local")
        assert api.get("/api/jobs")[1] == []
        status, answer, _ = api.post("/api/jobs", {"script": "train.py", "dry_run": True, "nodes": 3})
        assert status == 400 and answer["error"]["message"].startswith("nodes 3:"), answer
    counts = _row_counts(sqlite_url)
    assert counts["runs"] == counts["attempts"] == counts["blobs"] == 0, counts
