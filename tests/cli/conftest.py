"""Run the real `trackway` CLI: in-process for speed, or as a subprocess where exit codes and output streams matter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trackway.cli.errors import run_app
from trackway.cli.main import app


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def _in_process(capsys):
    def invoke(*args: str) -> Result:
        capsys.readouterr()
        code = run_app(app, list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def cli(home: Path, capsys, ledger_url: str, monkeypatch):
    """`cli("runs", "--json")` runs trackway in this process against a fresh ledger on each backend."""
    monkeypatch.setenv("TRACKWAY_DB", ledger_url)
    return _in_process(capsys)


@pytest.fixture
def cli_process(home: Path):
    """`cli_process(...)` runs `python -m trackway ...` as a user would, in the test's working directory."""

    def invoke(*args: str, timeout: float = 120) -> Result:
        done = subprocess.run(
            [sys.executable, "-m", "trackway", *args],
            capture_output=True, text=True, timeout=timeout, env=dict(os.environ), cwd=os.getcwd(),
        )
        return Result(done.returncode, done.stdout, done.stderr)

    return invoke

