"""examples/agent_loop.py end to end: a scripted agent runs a baseline and a batch of three hypotheses over MCP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


@pytest.mark.slow  # 30 s of real runs; the agent's tools are in the suite (tests/agents/)
def test_the_example_agent_reaches_a_verdict_on_every_hypothesis_and_its_runs_are_its_own(tmp_path):
    environ = {**os.environ, "TRACKWAY_BACKGROUND_SUPERVISOR": "0", "OMP_NUM_THREADS": "1"}
    environ.pop("TRACKWAY_DB", None)
    done = subprocess.run([sys.executable, str(EXAMPLE), "--workdir", str(tmp_path / "project")],
                          capture_output=True, text=True, timeout=900, env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("x")]
    assert len(rows) == 3 and all(any(v in line for v in ("supported", "rejected", "inconclusive")) for line in rows)
    assert "next: " in done.stdout
    listed = subprocess.run([sys.executable, "-m", "trackway", "runs", "--json", "--limit", "0"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path / "project",
                            env={**environ, "TRACKWAY_HOME": str(tmp_path / "project" / ".trackway")})
    runs = json.loads(listed.stdout)
    assert len(runs) >= 7  # the baseline, and a test run and a full run per supported or rejected hypothesis
    assert all(run["submitted_by"].startswith("agent example via mcp (") for run in runs)
