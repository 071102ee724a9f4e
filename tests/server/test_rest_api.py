"""The REST API against a real `trackway serve` process: jobs across a preemption, errors in one shape, tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from api_server import CHATTY, Api, serving
from waiting import wait_for


@pytest.fixture
def server(home, sqlite_url) -> Iterator[tuple[Api, object]]:
    """The API, and `supervise()`: one pass of `trackway supervise --once` over the same ledger."""
    environ = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}

    def supervise() -> None:
        subprocess.run([sys.executable, "-m", "trackway", "supervise", "--once"], capture_output=True, env=environ,
                       timeout=120)

    with serving(home, sqlite_url) as (base, _):
        yield Api(base), supervise


def test_a_job_posted_with_our_users_field_names_runs_and_its_logs_stream_across_a_preemption(home, sqlite_url):
    env = {"TRACKWAY_BACKGROUND_SUPERVISOR": "1"}  # the server hands its jobs to a background supervisor
    try:
        with serving(home, sqlite_url, env=env) as (base, _):
            api = Api(base)
            status, job, _ = api.post("/api/jobs", {
                "script": CHATTY, "args": [], "gpu_count": 0, "time_limit_hours": 1,
                "name": "via-api", "project": "api", "config": {"train": {"lr": 0.1}},
            })
            assert status == 201, job
            assert job["url"] == f"/api/jobs/{job['id']}" and job["attempt_id"] == f"{job['id']}/1"
            # Followed: the output of attempt 1 (preempted), then attempt 2 (resumed), until the job ends.
            status, text, headers = api.get(f"/api/jobs/{job['id']}/logs?follow=true", timeout=120)
            assert status == 200 and headers["content-type"].startswith("text/plain")
            first, second = text.index(f"=== {job['id']}/1 ==="), text.index(f"=== {job['id']}/2 ===")
            assert first < text.index("step 7 loss 0.1250 attempt 1") < second < text.index("step 11 loss 0.0833 attempt 2")
            shown = api.get(f"/api/jobs/{job['id']}")[1]
            assert shown["status"] == "completed" and shown["name"] == "via-api" and shown["project"] == "api"
            assert [(a["number"], a["termination_reason"]) for a in shown["attempts"]] == [(1, "preempted"), (2, "completed")]
            assert shown["attempts"][0]["decision"]["action"] == "resume"
            assert shown["attempts"][1]["resumed_from"] is not None
            # Who started it: the token's name, and from where.
            assert "POST /api/jobs with token server from 127.0.0.1" in shown["attempts"][0]["started_by"]
            tail = api.get(f"/api/jobs/{job['id']}/logs?tail=3")[1]
            assert len(tail.splitlines()) == 3 and tail in text
            listed = api.get("/api/jobs?project=api&state=completed")[1]
            assert [j["id"] for j in listed] == [job["id"]]
            # The curve on the run's step axis, with the attempt boundary and why the first ended.
            chart = api.get(f"/api/runs/{job['id']}/metrics?keys=loss")[1]
            assert chart["series"]["loss"]["steps"] == list(range(12))
            bounds = chart["attempts"]
            # Saved at the notice (step 7), so attempt 2 starts at step 8.
            assert [(b["number"], b["after"], b["first_step"]) for b in bounds] == [(1, None, 0), (2, "preempted", 8)]
            explained = api.get(f"/api/attempts/{job['id']}/1/explain")[1]
            assert explained["ended_by"]["reason"] == "preempted" and explained["attempt"]["attempt_number"] == 1
            assert [c["step"] for c in api.get(f"/api/runs/{job['id']}/checkpoints")[1]][:3] == [0, 5, 7]
    finally:
        subprocess.run([sys.executable, "-m", "trackway", "supervise", "--stop"], capture_output=True,
                       env={**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}, timeout=60)


def test_bad_input_gets_one_error_shape_naming_the_field_and_never_a_500(server):
    api, _ = server
    cases = [
        ("POST", "/api/jobs", {}, 422, "script"),
        ("POST", "/api/jobs", {"script": "x.py", "gpu_count": -1}, 422, "gpu_count"),
        ("POST", "/api/jobs", {"script": "x.py", "nodes": 0}, 422, "nodes"),
        ("POST", "/api/jobs", {"script": "x.py", "time_limit_hours": "soon"}, 422, "time_limit_hours"),
        ("POST", "/api/jobs", {"script": "x.py", "surprise": 1}, 422, "surprise"),
        ("POST", "/api/jobs", {"script": "x.py", "prefer_resource": "moon"}, 400, None),
        ("POST", "/api/jobs", {"script": "x.py", "eval": ["/nope.toml"]}, 400, None),
        ("GET", "/api/jobs/nope", None, 404, None),
        ("GET", "/api/jobs?state=lost", None, 422, "state"),
        ("GET", "/api/runs/nope/metrics?max_points=1", None, 422, "max_points"),
        ("GET", "/api/runs/nope/metrics", None, 404, None),
        ("GET", "/api/events?since=yesterday", None, 400, None),
        ("POST", "/api/sql", {"query": "delete from runs"}, 403, None),
        ("POST", "/api/sql", {"query": "select from where"}, 400, None),
        ("GET", "/api/nothing-here", None, 404, None),
    ]
    for method, path, body, expected, field in cases:
        status, answer, _ = api.call(method, path, body)
        assert status == expected, (method, path, answer)
        assert set(answer) == {"error"} and answer["error"]["type"] and answer["error"]["message"], answer
        if field is not None:
            assert field in [f["field"] for f in answer["error"]["fields"]], answer
    preflight = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "batch_size": 4, "max_length": 4096}
    Path("x.py").write_text("print('never runs')\n")
    status, answer, _ = api.post("/api/jobs", {"script": "x.py", "nodes": 2})
    assert status == 400 and answer["error"]["message"].startswith("nodes 2: expected 1 to 1"), answer
    status, answer, _ = api.post("/api/jobs", {"script": "x.py", "config": {"preflight": preflight},
                                               "strict_memory_preflight": True})
    assert status == 400 and answer["error"]["message"].startswith(
        "strict_memory_preflight: no resource this run may go to declares its GPU"), answer
    status, answer, _ = api.post("/api/sql", {"query": "select 1 as one"})
    assert status == 200 and answer == {"columns": ["one"], "rows": [[1]]}
    status, schema, _ = api.get("/openapi.json")
    assert status == 200 and "/api/jobs" in schema["paths"] and "/api/runs/{run_id}/metrics" in schema["paths"]


def test_metrics_are_downsampled_on_the_server_keeping_the_spikes(server, tmp_path):
    api, _ = server
    script = Path.cwd() / "long.py"
    script.write_text(
        "import trackway\nrun = trackway.init()\n"
        "for step in range(5000):\n"
        "    run.log({'loss': 100.0 if step == 3333 else 1.0 / (step + 1), 'lr': 0.1}, step=step)\n"
        "run.finish()\n"
    )
    status, job, _ = api.post("/api/jobs", {"script": script.name})
    assert status == 201
    supervise = server[1]
    wait_for(lambda: supervise() or api.get(f"/api/jobs/{job['id']}")[1]["status"] == "completed",
             "the job to complete")
    chart = api.get(f"/api/runs/{job['id']}/metrics?keys=loss&max_points=100")[1]
    loss = chart["series"]["loss"]
    assert loss["downsampled"] is True and loss["points"] == 5000 and len(loss["steps"]) <= 100
    assert max(loss["values"]) == 100.0 and min(loss["values"]) == pytest.approx(1 / 5000)
    assert loss["steps"] == sorted(loss["steps"])
    both = api.get(f"/api/runs/{job['id']}/metrics?max_points=6000")[1]["series"]
    # Beside the script's own keys, the supervisor's node samples (node/...) when one landed while it stepped.
    assert sorted(key for key in both if not key.startswith("node/")) == ["loss", "lr"]
    assert both["lr"]["downsampled"] is False and len(both["lr"]["steps"]) == 5000


def test_events_stream_what_happens(server):
    import threading

    api, supervise = server
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    status, job, _ = api.post("/api/jobs", {"script": CHATTY})
    assert status == 201
    done = threading.Event()

    def drive() -> None:  # what the background supervisor would do
        while not done.is_set():
            supervise()
            done.wait(0.3)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    seen: list[tuple[str, dict]] = []
    try:
        request = urllib.request.Request(api.base + f"/api/events?since={since}",
                                         headers={"Authorization": f"Bearer {api.token}"})
        with urllib.request.urlopen(request, timeout=60) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            kind = None
            while not any(k == "attempt_ended" and d["termination_reason"] == "completed" for k, d in seen):
                line = stream.readline().decode()
                if line.startswith("event: "):
                    kind = line.split(": ", 1)[1].strip()
                elif line.startswith("data: ") and kind:
                    seen.append((kind, json.loads(line.split(": ", 1)[1])))
    finally:
        done.set()
        driver.join(timeout=60)
    kinds = [k for k, _ in seen]
    assert kinds[0] == "attempt_started" and kinds.count("attempt_started") == 2
    assert [d["termination_reason"] for k, d in seen if k == "attempt_ended"] == ["preempted", "completed"]
    assert "checkpoint_committed" in kinds
    assert all(d["run_id"] == job["id"] for k, d in seen if k != "watcher_fired")


def test_every_request_needs_a_token_made_on_the_first_start_and_never_printed(home, sqlite_url):
    # Before issue 31 a loopback server took requests without any token: any local user, or a web page
    # rebinding its DNS name to 127.0.0.1, could start jobs as the server's user.
    with serving(home, sqlite_url, env={"TRACKWAY_SERVER_TOKEN": ""}) as (base, process):
        token_file = home / "server-token"
        token = token_file.read_text().strip()
        assert oct(token_file.stat().st_mode & 0o777) == "0o600" and len(token) >= 32
        api = Api(base, token="")
        status, answer, headers = api.get("/api/jobs")
        assert status == 401 and answer["error"]["type"] == "Unauthorized" and headers["www-authenticate"] == "Bearer"
        assert api.get("/api/jobs", token="wrong")[0] == 401
        assert api.get("/api/jobs", token=token)[0] == 200
    said = process.stderr.read()
    assert token not in said and str(token_file) in said  # the file is named, the token never printed

    with serving(home, sqlite_url, env={"TRACKWAY_SERVER_TOKEN": "s3cret-token"}) as (base, process):
        assert Api(base, token="s3cret-token").get("/api/jobs")[0] == 200
        assert Api(base, token=token).get("/api/jobs")[0] == 401  # the variable wins over the file
    assert "s3cret-token" not in process.stderr.read()


def test_a_token_file_others_can_read_is_refused_with_the_fix(home, sqlite_url):
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "server-token"
    token_file.write_text("exposed-token\n")
    token_file.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "trackway", "serve", "--port", "0"], capture_output=True, text=True,
                          env={**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url,
                               "TRACKWAY_SERVER_TOKEN": ""}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"trackway: error: {token_file}: readable by group or others (mode 644); whoever "
                                   f"reads it can start jobs as you: `chmod 600 {token_file}`, or remove it and a new "
                                   "one is made")


def test_metrics_are_rank_0s_unless_a_rank_is_asked_and_the_ranks_are_listed(server, sqlite_url):
    from datetime import datetime, timezone

    from trackway.ledger import open_ledger
    from trackway.ledger.records import insert_run
    from trackway.ledger.schema import metric_points, metric_series

    ledger = open_ledger(sqlite_url)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rtwo", name="two", project="p", kind="full", state="completed", command="[]",
                              workdir="/w", resource="local", executor="local", gpus=0,
                              created_at=datetime.now(timezone.utc)))
        for rank in (0, 1):
            series = conn.execute(metric_series.insert().values(run_id="rtwo", key="loss", rank=rank)).inserted_primary_key[0]
            conn.execute(metric_points.insert(), [dict(series_id=series, step=s, value=10.0 * rank + s, attempt_number=1,
                                                       logged_at=1.0) for s in range(3)])
    ledger.dispose()
    api, _ = server
    chart = api.get("/api/runs/two/metrics")[1]
    assert (chart["rank"], chart["ranks"], chart["series"]["loss"]["values"]) == (0, [0, 1], [0.0, 1.0, 2.0])
    chart = api.get("/api/runs/two/metrics?rank=1")[1]
    assert (chart["rank"], chart["series"]["loss"]["values"]) == (1, [10.0, 11.0, 12.0])
    status, body, _ = api.get("/api/runs/two/metrics?rank=4")
    assert status == 404 and body["error"]["message"] == "rank 4: run rtwo has no metrics from that rank; it has rank(s) 0, 1"
    status, body, _ = api.get("/api/runs/two/metrics?rank=-1")
    assert status == 422 and "rank" in json.dumps(body["error"])
