"""Receipt truth (issue 30): every attempt's receipt is what that attempt ran, on every executor.

Between attempts the work tree's code, the run's data, the shell's environment and the config
change, by a policy retry and by a person's `trackway resume`; each attempt's receipt and `explain`
must say what that attempt really ran. The policy-retry case runs on the local executor, on a
real single-node Slurm and over real SSH (sshd on loopback: tests/ssh_hosts.py); the manual cases
go through the CLI on the local executor.

Before: a retry ran the half-edited work tree (local, Slurm) while its receipt carried the
submit-time code hash and `explain` said `code: none`; every attempt carried the submit-time data
manifest although later attempts read an edited file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.ledger import open_ledger
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import attempt_events
from trackway.settings import load_settings
from trackway.reports.explain import explain
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

# Attempt 1 is preempted at step 3; while its notice is handled, "a person" edits the code in the work
# tree (uncommitted) and appends 10 rows to the data file. Every attempt prints what it ran.
TRAINER = '''
import os, pathlib, signal
import trackway
VERSION = "v1"
data = pathlib.Path(os.environ["DATA_FILE"])
run = trackway.init(checkpoint_every_steps=5)
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
first = os.environ["TRACKWAY_ATTEMPT_NUMBER"] == "1"
print(f"code {VERSION} rows {len(data.read_text().splitlines())} secret-set {bool(os.environ.get('HF_TOKEN'))}",
      flush=True)
for step in range(start, 10):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if step == 3 and first and os.environ.get("EDIT_BETWEEN_ATTEMPTS"):
        work = pathlib.Path(os.environ["WORK_TREE"]) / "train.py"
        work.write_text(work.read_text().replace('VERSION = "v1"', 'VERSION = "v2-half-edited"'))
        data.write_text(data.read_text() + "edited row\\n" * 10)
        os.kill(os.getpid(), signal.SIGTERM)
    if (run.checkpoints.due(step) and step > 0) or run.should_stop:
        with run.checkpoints.writing(step) as d:
            (d / "step.txt").write_text(str(step))
    if run.should_stop:
        run.exit_preempted()
run.finish()
'''

RESOURCES = {
    "local": '[resources.here]\nexecutor = "local"\n',
    "slurm": '[resources.here]\nexecutor = "slurm"\npartition = "test"\nsbatch = ["--mem=1G"]\n',
}


def git(work: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(work), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


def make_work_tree(work: Path) -> Path:
    """A git work tree with the trainer committed, and a data file beside it (ignored, as data is)."""
    work.mkdir(parents=True)
    git(work, "init", "-q")
    (work / "train.py").write_text(TRAINER)
    (work / ".gitignore").write_text("/data/\n/home/\n")
    data = work / "data"
    data.mkdir()
    (data / "train.csv").write_text("".join(f"{i},{i * i}\n" for i in range(600)))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "trainer")
    return data / "train.csv"


def ssh_resource(host) -> str:
    return (f'[resources.here]\nexecutor = "ssh"\nhosts = ["{host.spec}"]\nkey_file = "{host.key}"\n'
            f'workdir = "{host.work}"\n'
            'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n')


@pytest.fixture(params=["local", "slurm", "ssh"])
def executor_toml(request):
    if request.param == "slurm":
        request.getfixturevalue("slurm_node")
        return "slurm", RESOURCES["slurm"]
    if request.param == "ssh":
        return "ssh", ssh_resource(request.getfixturevalue("loopback_host"))
    return "local", RESOURCES["local"]


def _events(ledger, attempt_id: str, kind: str) -> list[dict]:
    with ledger.read() as conn:
        return [json.loads(p) for p in conn.execute(select(attempt_events.c.payload).where(
            attempt_events.c.attempt_id == attempt_id, attempt_events.c.kind == kind)).scalars()]


def test_a_policy_retry_runs_the_submitted_code_and_says_the_data_it_read(executor_toml, tmp_path, sqlite_url,
                                                                             monkeypatch):
    name, toml = executor_toml
    work = tmp_path / "work"
    data_file = make_work_tree(work)
    (work / "trackway.toml").write_text(toml)
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 30)  # a secret in the submitter's environment
    settings = load_settings(home=work / "home", db=sqlite_url, cwd=work)
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    spec = RunSpec(command=[sys.executable, "train.py"], cwd=work, data_paths=[str(data_file.parent)],
                   resource="here", env={"DATA_FILE": str(data_file), "WORK_TREE": str(work),
                                         "EDIT_BETWEEN_ATTEMPTS": "1"})
    run_id = submit_run(ledger, settings, spec)
    monkeypatch.delenv("HF_TOKEN")  # the launcher's own environment changes: the retry keeps the submitted one
    start_attempt(ledger, settings, run_id, supervisor.executor, first=True)
    deadline = time.monotonic() + 180
    while True:
        supervisor.tick()
        with ledger.read() as conn:
            if resolve_run(conn, run_id)["state"] in ("completed", "failed", "cancelled"):
                break
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.3)
    with ledger.read() as conn:
        first, second = list_attempts(conn, run_id=run_id)
        facts = explain(conn, f"{run_id}/2")
    assert (first["termination_reason"], second["termination_reason"]) == ("preempted", "completed")

    def said(attempt) -> list[str]:
        lines = Path(attempt["log_path"]).read_text().splitlines()
        return [line.split(" out ", 1)[1] for line in lines if " out code " in line]

    # The retry ran the code that was submitted, not the half-edited work tree; it read the edited data, and
    # it had the environment the run was submitted with (over SSH only what forward_env names, both times).
    secret = "False" if name == "ssh" else "True"
    assert said(first) == [f"code v1 rows 600 secret-set {secret}"], said(first)
    assert said(second) == [f"code v1 rows 610 secret-set {secret}"], said(second)
    assert 'VERSION = "v2-half-edited"' in (work / "train.py").read_text()  # the person's edit is left alone
    # Its receipt says exactly that: the submitted code, rebuilt; the data it read, with what changed.
    assert (second["code_commit"], second["code_dirty_sha256"]) == (first["code_commit"], first["code_dirty_sha256"])
    capture = json.loads(second["code_capture"])
    assert capture["source"] == "receipt"
    if name == "ssh":
        assert "sent to the host as a snapshot" in capture["said"]
    else:
        assert Path(second["workdir"]) == Path(capture["workspace"]["cwd"]) != work
    assert json.loads(first["code_capture"])["source"] == "submit" and first["workdir"] == str(work)
    assert second["data_manifest_sha256"] != first["data_manifest_sha256"]
    (changed,) = _events(ledger, second["attempt_id"], "data_changed")
    (change,) = changed["changes"]
    assert change["path"] == "data/train.csv"
    assert (change["before"]["size"], change["after"]["size"]) == (data_file.stat().st_size - 110,
                                                                      data_file.stat().st_size)
    assert second["environ_sha256"] == first["environ_sha256"]
    # explain states it from the ledger alone.
    assert facts["changes"]["code"] == []
    assert facts["receipt"]["code"]["capture"]["source"] == "receipt"
    (line,) = facts["data"]["changed_since_previous"]
    before, after = data_file.stat().st_size - 110, data_file.stat().st_size
    assert line.startswith(f"changed data/train.csv ({before:,} bytes, ") and f" → {after:,} bytes, " in line
    assert facts["changes"]["environment variables"] == []
    ledger.dispose()


# -- a person's resume, on the local executor, through the CLI -------------------------------------------


@pytest.fixture
def failing_run(cli_sqlite, tmp_path, monkeypatch):
    """A run whose only attempt failed with a code error (KeyError at step 3), in a git work tree."""
    work = Path.cwd()
    git(work, "init", "-q")
    (work / "train.py").write_text(
        "import trackway\nrun = trackway.init()\nfor step in range(6):\n    run.log({'loss': 1.0}, step=step)\n"
        "    if step == 3:\n        raise KeyError('lr')\nrun.finish()\n")
    (work / "cfg.toml").write_text("lr = 0.1\n")
    (work / ".gitignore").write_text("/.trackway/\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "trainer")
    result = cli_sqlite("submit", "--name", "k", "--config", "cfg.toml", "--", sys.executable, "train.py")
    assert result.code == 1, result.err
    return work


def test_a_persons_resume_takes_the_work_tree_as_it_is_with_a_new_code_receipt(cli_sqlite, failing_run):
    (failing_run / "train.py").write_text((failing_run / "train.py").read_text().replace("raise KeyError('lr')", "pass"))
    result = cli_sqlite("resume", "k", "--set", "lr=0.05")
    assert result.code == 0, result.err
    first, second = cli_sqlite("attempts", "k", "--json").json()
    assert second["code_commit"] == first["code_commit"] and first["code_dirty_sha256"] is None
    assert second["code_dirty_sha256"]  # the uncommitted fix is in this attempt's receipt
    assert second["config_sha256"] != first["config_sha256"]
    facts = cli_sqlite("explain", "k/2", "--json").json()
    assert facts["receipt"]["code"]["capture"]["source"] == "work_tree"
    assert facts["changes"]["code"] == [f"uncommitted diff none → {second['code_dirty_sha256'][:12]}"]
    assert facts["changes"]["config"] == ["lr: 0.1 → 0.05"]
    assert "trackway resume --set lr=0.05" in second["started_by"]


def test_resume_same_code_runs_the_submitted_code_whatever_the_work_tree_holds(cli_sqlite, failing_run):
    (failing_run / "train.py").write_text((failing_run / "train.py").read_text().replace("raise KeyError('lr')", "pass"))
    result = cli_sqlite("resume", "k", "--same-code")
    assert result.code == 1  # the submitted code still raises
    first, second = cli_sqlite("attempts", "k", "--json").json()
    assert (second["code_commit"], second["code_dirty_sha256"]) == (first["code_commit"], None)
    assert second["termination_reason"] == "code_error" and "--same-code" in second["started_by"]
    facts = cli_sqlite("explain", "k/2", "--json").json()
    assert facts["receipt"]["code"]["capture"]["source"] == "receipt" and facts["changes"]["code"] == []


def test_same_code_on_a_run_without_a_code_receipt_is_refused_and_records_nothing(cli_sqlite):
    assert cli_sqlite("submit", "--name", "plain", "--", sys.executable, "-c", "raise SystemExit(3)").code == 1
    before = cli_sqlite("attempts", "plain", "--json").json()
    result = cli_sqlite("resume", "plain", "--same-code")
    assert result.code == 2
    assert result.err.strip().splitlines()[-1].startswith("trackway: error: --same-code: run 'plain' has no code receipt")
    assert cli_sqlite("attempts", "plain", "--json").json() == before


def test_an_unknown_on_data_change_is_refused_at_submit_and_records_nothing(cli_sqlite):
    Path("trackway.toml").write_text('[retry]\non_data_change = "sometimes"\n')
    result = cli_sqlite("submit", "--", sys.executable, "-c", "pass")
    assert result.code == 2
    assert "on_data_change 'sometimes': expected one of warn, stop" in result.err
    assert cli_sqlite("runs", "--json").json() == []


def test_on_data_change_stop_launches_no_retry_and_lists_the_files(cli_sqlite, tmp_path):
    work = Path.cwd()
    data_file = make_work_tree(work / "proj")
    Path("trackway.toml").write_text('[retry]\non_data_change = "stop"\n')
    result = cli_sqlite("submit", "--name", "d", "--data", str(data_file.parent), "--", "env",
                        f"DATA_FILE={data_file}", f"WORK_TREE={work / 'proj'}", "EDIT_BETWEEN_ATTEMPTS=1",
                        sys.executable, str(work / "proj" / "train.py"))
    assert result.code == 1, result.err
    (attempt,) = cli_sqlite("attempts", "d", "--json").json()  # the retry was never launched
    assert attempt["termination_reason"] == "preempted"
    decision = json.loads(attempt["retry_decision"])
    assert (decision["action"], decision["rule"]) == ("stop", "data changed: stop")
    after = data_file.stat().st_size
    assert decision["message"].startswith(f"1 data file(s) changed since {attempt['attempt_id']}: "
                                          f"data/train.csv ({after - 110:,} → {after:,} bytes)")
    assert "`trackway resume d`" in decision["message"]
    assert cli_sqlite("runs", "--json").json()[0]["state"] == "failed"
