"""The server's trust boundary, tried as an attacker on the same machine would (issue 31): a real `trackway serve`.

Before: a loopback server took any request with no token and any Host, so any local user, or a web
page through DNS rebinding, ran Python as the server's user with `{"script": "-c", "args": [...]}`;
a 100 MB config went into the ledger; an attempt number too large for the database was a 500.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from api_server import TEST_TOKEN, Api, serving

PWNED = "pwned.txt"


def _token(cli_env: dict[str, str], name: str, role: str) -> str:
    done = subprocess.run([sys.executable, "-m", "trackway", "token", "add", name, "--role", role],
                          capture_output=True, text=True, env=cli_env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _raw(base: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict, bytes]:
    """A request with exactly these headers (urllib would set Host itself)."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        connection.putheader(name, value)
    if body is not None:
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


@pytest.fixture
def server(home, sqlite_url):
    (Path.cwd() / "train.py").write_text("print('trained')\n")
    env = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}
    with serving(home, sqlite_url) as (base, process):
        yield base, env, process


def test_interpreter_options_and_paths_outside_the_working_directory_are_never_run(server):
    base, _, _ = server
    api = Api(base)
    attacks = [
        {"script": "-c", "args": [f"open({PWNED!r}, 'w')"]},
        {"script": "-m", "args": ["http.server"]},
        {"script": "/usr/lib/python3/dist-packages/__init__.py"},
        {"script": "../../../etc/passwd"},
        {"script": "train.py", "data": ["/etc"]},
        {"script": "train.py", "eval": ["../outside.toml"]},
        {"script": "-c", "repo": "https://example.invalid/x.git", "branch": "main"},
    ]
    for body in attacks:
        status, answer, _ = api.post("/api/jobs", body)
        assert status == 400, (body, answer)
        # Named as sent; the server's own paths are never in the message.
        assert str(Path.cwd()) not in answer["error"]["message"], answer
    assert not Path(PWNED).exists()
    assert api.get("/api/jobs")[1] == []  # nothing was recorded
    status, job, _ = api.post("/api/jobs", {"script": "train.py"})
    assert status == 201, job


def test_a_rebinding_host_and_a_cross_site_origin_are_refused(server):
    base, _, _ = server
    auth = {"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": "application/json"}
    job = json.dumps({"script": "train.py"}).encode()
    # After the DNS flip the page's own name resolves to 127.0.0.1: same-origin to the browser, not to us.
    status, _, body = _raw(base, "POST", "/api/jobs", {**auth, "Host": "attacker.example:8080"}, job)
    assert status == 400 and json.loads(body)["error"]["type"] == "HostNotAllowed"
    status, _, body = _raw(base, "GET", "/", {"Host": "attacker.example"})
    assert status == 400  # the dashboard too
    host = base.removeprefix("http://")
    status, _, body = _raw(base, "POST", "/api/jobs", {**auth, "Host": host, "Origin": "http://attacker.example"}, job)
    assert status == 403 and json.loads(body)["error"]["type"] == "CrossOrigin"
    status, _, body = _raw(base, "POST", "/api/jobs", {**auth, "Host": host, "Origin": "http://localhost:1"}, job)
    assert status == 403  # another local origin (port) is another site
    status, _, body = _raw(base, "POST", "/api/jobs", {**auth, "Host": host, "Origin": base}, job)
    assert status == 201, body  # the server's own pages
    status, _, _ = _raw(base, "GET", "/api/jobs", {"Authorization": f"Bearer {TEST_TOKEN}", "Host": "localhost"})
    assert status == 200


def test_roles_decide_what_a_token_may_do_and_a_revoked_one_does_nothing(server):
    base, env, _ = server
    reader, submitter = _token(env, "reader", "read"), _token(env, "ana", "submit")
    status, answer, _ = Api(base, token=reader).post("/api/jobs", {"script": "train.py"})
    assert status == 403 and "has the role read; this needs submit" in answer["error"]["message"]
    assert Api(base, token=reader).get("/api/jobs")[0] == 200
    assert Api(base, token=reader).post("/api/sql", {"query": "select 1"})[0] == 200
    status, job, _ = Api(base, token=submitter).post("/api/jobs", {"script": "train.py"})
    assert status == 201
    shown = Api(base, token=reader).get(f"/api/jobs/{job['id']}")[1]
    assert shown["attempts"][0]["started_by"].startswith("POST /api/jobs with token ana from 127.0.0.1")
    # The ledger keeps only the digest: a copy of it gives no one a token. /api/sql shows not even that.
    ledger = create_engine(env["TRACKWAY_DB"])
    try:
        with ledger.connect() as conn:
            rows = conn.execute(text("select name, token_sha256 from api_tokens order by name")).all()
    finally:
        ledger.dispose()
    assert [r[0] for r in rows] == ["ana", "reader"] and all(submitter not in str(r) for r in rows)
    status, answer, _ = Api(base, token=reader).post("/api/sql", {"query": "select name, token_sha256 from api_tokens"})
    assert status == 403 and "api_tokens is not readable" in answer["error"]["message"], answer
    assert subprocess.run([sys.executable, "-m", "trackway", "token", "revoke", "ana"], env=env,
                          capture_output=True, timeout=60).returncode == 0
    assert Api(base, token=submitter).get("/api/jobs")[0] == 401


def test_bodies_and_ids_beyond_bounds_are_4xx_and_record_nothing(server):
    base, _, _ = server
    api = Api(base)
    # A 2 MB body is refused on its Content-Length, before a byte of it is read. Only the headers are sent:
    # the server answers and closes at once, and a client still writing the body would meet a broken pipe.
    host = base.removeprefix("http://")
    connection = http.client.HTTPConnection(*host.split(":"), timeout=30)
    connection.putrequest("POST", "/api/jobs")
    for name, value in {"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": "application/json",
                        "Content-Length": str(2 << 20)}.items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["type"] == "BodyTooLarge"
    # Chunked, without a Content-Length, the cap holds the same.
    connection = http.client.HTTPConnection(*host.split(":"), timeout=30)
    connection.putrequest("POST", "/api/jobs")
    for name, value in {"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": "application/json",
                        "Transfer-Encoding": "chunked"}.items():
        connection.putheader(name, value)
    connection.endheaders()
    chunk = b"x" * 65536
    for _ in range(20):
        connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    connection.send(b"0\r\n\r\n")
    assert connection.getresponse().status == 413
    # Under the cap but nested past any config's depth: refused by name, not a RecursionError's 500.
    for depth in (70, 50_000):  # past the config's bound; past the parser's stack
        nested = '{"script": "train.py", "config": {"x": ' + "[" * depth + "]" * depth + "}}"
        status, _, body = _raw(base, "POST", "/api/jobs", {"Host": host, "Authorization": f"Bearer {TEST_TOKEN}",
                                                           "Content-Type": "application/json"}, nested.encode())
        assert status in (400, 422), (depth, status, body[:300])
        assert b"deep" in body, body[:300]
    assert api.get("/api/jobs")[1] == []
    status, job, _ = api.post("/api/jobs", {"script": "train.py"})
    assert status == 201
    status, answer, _ = api.get(f"/api/attempts/{job['id']}/99999999999999999999/explain")
    assert status == 422 and answer["error"]["fields"][0]["field"] == "number"


def test_responses_carry_safe_headers_and_the_access_log_no_query_strings(server):
    base, _, process = server
    api = Api(base)
    for path in ("/", "/api/jobs?project=secret-in-url"):
        status, _, headers = api.get(path)
        assert status == 200
        lowered = {k.lower(): v for k, v in headers.items()}
        assert lowered["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in lowered["content-security-policy"]
        assert "'unsafe-inline'" not in lowered["content-security-policy"]
    process.terminate()
    process.wait(timeout=10)
    logged = "".join(process.access_log) + process.stderr.read()  # uvicorn's access log goes to stdout
    assert "/api/jobs?…" in logged and "secret-in-url" not in logged and TEST_TOKEN not in logged


def test_no_auth_is_refused_beyond_loopback_and_said_loudly_on_it(home, sqlite_url):
    env = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}
    done = subprocess.run([sys.executable, "-m", "trackway", "serve", "--host", "0.0.0.0", "--no-auth", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "--no-auth: expected a loopback --host" in done.stderr
    with serving(home, sqlite_url, "--no-auth") as (base, process):
        assert Api(base, token="").get("/api/jobs")[0] == 200
    assert "WARNING: --no-auth" in process.stderr.read()
