"""Agents over MCP's streamable HTTP under a real `trackway serve`: the token names the agent, people's tokens are refused."""

from __future__ import annotations

import asyncio
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from api_server import serving

TRAIN = """
import time, trackway
run = trackway.init()
for step in range(10):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(0.02)
run.finish()
"""


def token_add(name: str, role: str) -> str:
    import subprocess

    made = subprocess.run([sys.executable, "-m", "trackway", "token", "add", name, "--role", role],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().split()[-1]


def call_as(base: str, token: str, *steps: tuple[str, dict]) -> list:
    # mcp is imported here, not at the top: every worker collects this file, and only the one that runs it needs it.
    import mcp
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def go():
        answers = []
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with mcp.Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
                for name, arguments in steps:
                    result = await client.call_tool(name, arguments)
                    answers.append((result.is_error, result.structured_content))
        return answers

    return asyncio.run(go())


@pytest.fixture
def project(home: Path, sqlite_url: str, monkeypatch) -> str:
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    Path("trackway.toml").write_text("[agents.night]\nmax_running = 2\n")
    Path("train.py").write_text(TRAIN)
    return sqlite_url


def test_an_agents_token_drives_the_loop_over_http_and_a_persons_token_is_refused(home, project):
    agent_token = token_add("night", "submit")
    reader_token = token_add("ana", "read")
    with serving(home, project) as (base, _):
        (e1, submitted), (e2, ended), (e3, standing) = call_as(
            base, agent_token, ("submit", {"script": "train.py", "name": "h1"}),
            ("wait", {"run": "h1", "timeout_s": 120}), ("budget", {}))
        assert not e1 and not e2 and not e3
        assert ended["state"] == "completed" and standing["agent"] == "night"
        for token, status, said in ((None, 401, "a bearer token is required"),
                                    (reader_token, 403, "token 'ana' is not an agent's"),
                                    ("not-a-token", 401, "a bearer token is required")):
            request = urllib.request.Request(f"{base}/mcp", data=b"{}", method="POST",
                                             headers={"Content-Type": "application/json",
                                                      **({"Authorization": f"Bearer {token}"} if token else {})})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == status and said in refused.value.read().decode()
    import json
    import subprocess

    shown = json.loads(subprocess.run([sys.executable, "-m", "trackway", "attempts", "h1", "--json"],
                                      capture_output=True, text=True, timeout=60).stdout)
    assert shown[0]["started_by"].startswith("agent night via mcp (")
