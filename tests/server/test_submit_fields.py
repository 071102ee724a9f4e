"""`trackway submit` and `POST /api/jobs` take the same options, from one table, and the API's errors name its fields."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import typer.main

from trackway.cli.submit_cmd import submit
from trackway.server.jobs import JobRequest
from trackway.supervisor.submit import INTERNAL_FIELDS, SUBMIT_FIELDS, SUBMIT_MODES, RunSpec, api_words

from ..api_server import Api, serving

# What the API takes that is no RunSpec option: the script and its arguments make the command.
API_ONLY = {"script", "args"}


def _submit_flags() -> set[str]:
    alone = typer.Typer()
    alone.command()(submit)
    command = typer.main.get_command(alone)  # one command: the command itself
    return {flag for param in command.params for flag in getattr(param, "opts", ())}


def test_every_submit_option_is_taken_by_both_the_cli_and_the_api():
    options = {f.name for f in dataclasses.fields(RunSpec)} - INTERNAL_FIELDS
    assert options == set(SUBMIT_FIELDS), "a RunSpec option without its flag and field in SUBMIT_FIELDS"
    flags = _submit_flags()
    assert {flag for flag, _ in SUBMIT_FIELDS.values()} | {flag for flag, _ in SUBMIT_MODES.values()} <= flags
    taken = {api for _, api in SUBMIT_FIELDS.values()} | {api for _, api in SUBMIT_MODES.values()}
    assert taken == set(JobRequest.model_fields) - API_ONLY


def test_api_errors_name_the_json_field_not_the_flag():
    assert api_words("--repo/--branch: expected both together") == "repo/branch: expected both together"
    assert api_words("--nodes 2: expected 1 to 1") == "nodes 2: expected 1 to 1"
    assert api_words("--strict: no resource") == "strict_memory_preflight: no resource"
    assert api_words("a -- b and --unknown-flag stay") == "a -- b and --unknown-flag stay"


STEPPED = "for step in range(5):\n    print(f'Step {step} | Loss: {1.0 / (step + 1):.4f}', flush=True)\n"


def _wait_ended(api: Api, job_id: str, supervise) -> dict:
    for _ in range(60):
        supervise()
        shown = api.get(f"/api/jobs/{job_id}")[1]
        if shown["status"] in ("completed", "failed", "cancelled"):
            return shown
    raise AssertionError(f"{job_id} did not end: {shown}")


def test_a_job_posted_with_metric_patterns_gets_curves_and_prefer_resource_is_a_preference(home, sqlite_url):
    import os
    import sys

    Path("trackway.toml").write_text('[resources.tests-only]\nexecutor = "local"\nuse_for = ["test"]\n'
                                     '[resources.box]\nexecutor = "local"\n')
    Path("stepped.py").write_text(STEPPED)
    environ = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}

    def supervise() -> None:
        subprocess.run([sys.executable, "-m", "trackway", "supervise", "--once"], capture_output=True, env=environ,
                       timeout=120)

    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        status, job, _ = api.post("/api/jobs", {
            "script": "stepped.py", "prefer_resource": "tests-only",
            "metric_patterns": [r"Step (?P<step>\d+) \| Loss: (?P<loss>\S+)"]})
        assert status == 201, job
        shown = _wait_ended(api, job["id"], supervise)
        assert shown["status"] == "completed"
        # Preferred, but it takes test runs only: the other was chosen, and the attempt says why.
        chart = api.get(f"/api/runs/{job['id']}/metrics?keys=loss")[1]
        assert chart["series"]["loss"]["steps"] == [0, 1, 2, 3, 4]
        explained = api.get(f"/api/runs/{job['id']}/explain")[1]
        chosen = json.dumps(explained["placement"])
        assert "box" in chosen and "tests-only" in chosen and "not used for full runs" in chosen, chosen

        status, answer, _ = api.post("/api/jobs", {"script": "stepped.py", "kind": "test",
                                                   "prefer_resource": "tests-only"})
        assert status == 201
        explained = api.get(f"/api/runs/{answer['id']}/explain")[1]
        assert "preferred (prefer_resource)" in json.dumps(explained["placement"]), explained["placement"]

        status, answer, _ = api.post("/api/jobs", {"script": "stepped.py", "nodes": 5})
        assert status == 400 and answer["error"]["message"].startswith("nodes 5:"), answer


def test_a_script_missing_from_the_repository_is_refused_at_submit(home, sqlite_url, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('here')\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit",
                                                                "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        status, answer, _ = api.post("/api/jobs", {"script": "missing.py", "repo": str(repo), "branch": "main"})
        assert status == 400, answer
        assert answer["error"]["message"].startswith(f"script 'missing.py': not a file in {repo} at branch main")
        assert api.get("/api/jobs")[1] == []  # nothing recorded
        status, answer, _ = api.post("/api/jobs", {"script": "train.py", "repo": str(repo)})
        assert status == 400 and answer["error"]["message"].startswith("repo/branch: expected both"), answer
