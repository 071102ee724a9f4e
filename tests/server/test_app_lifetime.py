"""What the API server starts for itself ends with it: the SQL worker processes behind /api/sql."""

from __future__ import annotations

from pathlib import Path

import psutil
from fastapi.testclient import TestClient

from trackway.server.app import create_app
from trackway.server.auth import Access
from trackway.server.guard import allowed_hosts
from trackway.settings import load_settings

TOKEN = "lifetime-token-0123456789"


def test_the_sql_workers_end_when_the_server_shuts_down(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    app = create_app(load_settings(), Access(TOKEN), Path.cwd(), hosts=allowed_hosts("127.0.0.1", ["testserver"]))
    before = {child.pid for child in psutil.Process().children()}
    with TestClient(app) as client:
        answer = client.post("/api/sql", json={"query": "select 1 as one"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200 and answer.json()["rows"] == [[1]], answer.text
        workers = [child for child in psutil.Process().children() if child.pid not in before
                   and "trackway.ledger.sql.worker" in " ".join(child.cmdline())]
        assert workers, "/api/sql answered without a worker process"
    # Shut down, the server stopped them: none waits on for a socket's end that this (still running) process holds.
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [p.pid for p in alive]
