"""Where attempts go: the resource chosen with its reasons on the receipt, and an OOM retried on more memory.

Made by the real `trackway submit` in a subprocess against a trackway.toml that declares
resources, read back through `attempts --json`, `show` and `explain` as a user reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = sys.executable
SCRIPTS = Path(__file__).resolve().parent / "scripts"

RESOURCES = """\
[resources.workstation]
executor = "local"
gpu = "RTX 4080"
gpu_memory_gb = 16
use_for = ["test", "full"]

[resources.bigbox]
executor = "local"
gpu = "A100"
gpu_memory_gb = 80
cost_per_gpu_hour = 1.5

[resources.inference]
executor = "local"
use_for = ["eval"]

[selection]
full = ["workstation", "bigbox"]

[retry.reasons.oom]
budget = 2
"""


@pytest.fixture
def project(tmp_path, ledger_url):
    """`trackway` run in a project whose trackway.toml declares RESOURCES."""
    (tmp_path / "trackway.toml").write_text(RESOURCES)
    env = {**os.environ, "TRACKWAY_HOME": str(tmp_path / "home"), "TRACKWAY_DB": ledger_url, "COLUMNS": "100"}

    def trackway(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "trackway", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=180)

    return trackway


def flat(text: str) -> str:
    """Text as one line: a long line is wrapped at the terminal's width."""
    return " ".join(text.split())


def attempts(trackway, run: str) -> list[dict]:
    done = trackway("attempts", run, "--json")
    assert done.returncode == 0, done.stderr
    return sorted(json.loads(done.stdout), key=lambda a: a["attempt_number"])


def test_the_choice_and_every_resource_passed_over_are_on_the_receipt(project):
    done = project("submit", "--name", "plain", "--", PY, "-c", "print('ok')")
    assert done.returncode == 0, done.stderr
    assert ("trackway: chose workstation: 1st in [selection] full; skipped bigbox: 2nd in [selection] full, "
            "after workstation; skipped inference: not used for full runs (use_for: eval)") in flat(done.stderr)

    (attempt,) = attempts(project, "plain")
    assert (attempt["resource"], attempt["qos"]) == ("workstation", None)
    assert json.loads(attempt["selection"])["chosen"] == "workstation"
    explained = flat(project("explain", "plain").stdout)
    assert "workstation (chosen: 1st in [selection] full)" in explained
    assert "bigbox: 2nd in [selection] full, after workstation" in explained
    shown = flat(project("show", "plain/1").stdout)
    assert "chose workstation: 1st in [selection] full" in shown


def test_a_run_no_resource_can_take_is_refused_before_anything_is_recorded(project):
    done = project("submit", "--gpu-memory-min", "200", "--", PY, "-c", "print('never')")

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "trackway: error: no resource can take this run: workstation: 16 GB < 200 GB asked; "
        "bigbox: 80 GB < 200 GB asked; inference: not used for full runs (use_for: eval)"
    ]
    assert json.loads(project("runs", "--json").stdout) == []


def test_an_oom_is_retried_on_a_resource_with_more_memory(project):
    done = project("submit", "--name", "grows", "--", PY, str(SCRIPTS / "oom_first_attempt.py"))
    assert done.returncode == 0, done.stderr

    first, second = attempts(project, "grows")
    assert (first["termination_reason"], first["resource"]) == ("oom", "workstation")
    # A bigger GPU is a changed memory footprint: the policy resumes instead of stopping.
    assert json.loads(first["retry_decision"])["action"] == "resume"
    assert (second["termination_reason"], second["resource"]) == ("completed", "bigbox")
    reason = json.loads(second["selection"])["reason"]
    assert reason.startswith("attempt 1 ran out of memory on workstation (16 GiB per GPU), bigbox has 80 GiB")
    assert "ran out of memory on workstation" in flat(project("explain", "grows").stdout)


def test_a_resource_named_on_the_command_line_is_used_and_said_so(project):
    done = project("submit", "--name", "named", "--resource", "bigbox", "--", PY, "-c", "print('ok')")
    assert done.returncode == 0, done.stderr

    (attempt,) = attempts(project, "named")
    assert attempt["resource"] == "bigbox"
    assert "asked for by name (--resource bigbox)" in flat(project("explain", "named").stdout)
    refused = project("submit", "--resource", "nowhere", "--", PY, "-c", "print('x')")
    assert refused.returncode == 2
    assert "--resource 'nowhere': not declared in trackway.toml (declared: bigbox, inference, workstation, or auto)" \
        in flat(refused.stderr)


def supervise_once_from(directory: Path, project_env: dict) -> None:
    done = subprocess.run([PY, "-m", "trackway", "supervise", "--once"], cwd=directory, env=project_env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def project_env(tmp_path, ledger_url):
    return {**os.environ, "TRACKWAY_HOME": str(tmp_path / "home"), "TRACKWAY_DB": ledger_url, "COLUMNS": "100"}


def test_a_supervisor_started_elsewhere_places_the_retry_among_the_runs_own_resources(project, project_env, tmp_path):
    done = project("submit", "--detach", "--name", "far", "--", PY, str(SCRIPTS / "oom_first_attempt.py"))
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"  # no trackway.toml here: this supervisor's own settings know no resource
    elsewhere.mkdir()

    deadline = time.monotonic() + 120
    while [a["state"] for a in attempts(project, "far")][-1:] != ["ended"] or len(attempts(project, "far")) < 2:
        assert time.monotonic() < deadline, attempts(project, "far")
        supervise_once_from(elsewhere, project_env)
        time.sleep(0.3)

    first, second = attempts(project, "far")
    assert (first["resource"], second["resource"]) == ("workstation", "bigbox")
    assert second["termination_reason"] == "completed"
    assert json.loads(second["selection"])["reason"].startswith("attempt 1 ran out of memory on workstation")


def test_a_retry_no_resource_can_take_waits_queued_and_says_why(project, project_env, tmp_path):
    done = project("submit", "--detach", "--name", "stranded", "--", PY, "-c",
                   "import os, signal, time\ntime.sleep(2)\nos.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == 0, done.stderr
    # While it runs, the project stops declaring anything that takes full runs.
    (tmp_path / "trackway.toml").write_text(RESOURCES.replace('use_for = ["test", "full"]', 'use_for = ["test"]')
                                            .replace('cost_per_gpu_hour = 1.5', 'cost_per_gpu_hour = 1.5\nuse_for = ["eval"]'))
    deadline = time.monotonic() + 120
    while attempts(project, "stranded")[0]["state"] != "ended":
        assert time.monotonic() < deadline
        supervise_once_from(tmp_path, project_env)
        time.sleep(0.3)
    supervise_once_from(tmp_path, project_env)

    (attempt,) = attempts(project, "stranded")
    assert attempt["termination_reason"] == "preempted"
    assert json.loads(attempt["retry_decision"])["action"] == "resume"
    assert json.loads(project("runs", "--json").stdout)[0]["state"] == "queued"
    explained = flat(project("explain", "stranded").stdout)
    assert "the retry could not be placed: no resource can take this run: workstation: not used for full runs" in explained
    assert "it stays queued and is tried again every 30 s" in explained


def test_an_oom_moves_to_a_gpu_the_catalog_knows_is_bigger_without_gpu_memory_gb(tmp_path, sqlite_url):
    # Resources named by their GPU alone: the catalog's driver figures (31.84 and 140.4 GiB) decide "bigger".
    (tmp_path / "trackway.toml").write_text(
        '[resources.desk]\nexecutor = "local"\ngpu = "RTX 5090"\n\n[resources.rented]\nexecutor = "local"\n'
        'gpu = "H200"\ncost_per_gpu_hour = 3.5\n\n[selection]\nfull = ["desk", "rented"]\n\n'
        '[retry.reasons.oom]\nbudget = 2\n')
    env = {**os.environ, "TRACKWAY_HOME": str(tmp_path / "home"), "TRACKWAY_DB": sqlite_url, "COLUMNS": "100"}

    def trackway(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "trackway", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=180)

    done = trackway("submit", "--name", "grows", "--", PY, str(SCRIPTS / "oom_first_attempt.py"))
    assert done.returncode == 0, done.stderr
    first, second = attempts(trackway, "grows")
    assert (first["resource"], second["resource"]) == ("desk", "rented")
    assert json.loads(second["selection"])["reason"].startswith(
        "attempt 1 ran out of memory on desk (31.84 GiB per GPU), rented has 140.4 GiB")


def test_a_projects_file_edited_between_two_ends_is_read_again(tmp_path):
    """Ends price and place by their project's trackway.toml as it is now, though a burst reads it once."""
    from trackway.resources.placement import project_settings
    from trackway.settings import load_settings

    supervisor = load_settings(home=tmp_path / "home", db=f"sqlite:///{tmp_path / 'ledger.db'}", cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    run = {"workdir": str(work)}
    assert project_settings(supervisor, run) is supervisor  # no file: the supervisor's own

    (work / "trackway.toml").write_text('[resources.box]\nexecutor = "local"\ncost_per_gpu_hour = 2.0\n')
    first = project_settings(supervisor, run)
    assert first.resource("box").cost_per_gpu_hour == 2.0
    assert project_settings(supervisor, run) is first  # the same bytes: read once

    (work / "trackway.toml").write_text('[resources.box]\nexecutor = "local"\ncost_per_gpu_hour = 3.5\n')
    assert project_settings(supervisor, run).resource("box").cost_per_gpu_hour == 3.5
    (work / "trackway.toml").write_text("[resources.box\n")  # a file that no longer reads: the supervisor's
    assert project_settings(supervisor, run) is supervisor
