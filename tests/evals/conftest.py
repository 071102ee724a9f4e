"""Evaluation fixtures: a task set and an eval spec file around the stand-in evaluator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    """A directory holding a copy of the evaluator, a task set of 20 tasks and nothing else."""
    directory = tmp_path / "evals"
    directory.mkdir()
    (directory / "evaluator.py").write_text((SCRIPTS / "evaluator.py").read_text())
    tasks = [{"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    (directory / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return directory


@pytest.fixture
def write_spec(eval_dir: Path):
    """`write_spec(name, extra_args=[...], **toml_overrides)` writes an eval spec and returns its path."""

    def write(name: str = "toy", args: list[str] | None = None, body: str = "") -> Path:
        command = [sys.executable, "evaluator.py", *(args or [])]
        text = (
            f'name = "{name}"\ncommand = {json.dumps(command)}\ntask_set = "tasks.jsonl"\n'
            + (body or 'seeds = [0, 1]\nmetrics = ["pass@1", "pass@2"]\n\n[decoding]\nsamples = 4\ntemperature = 0.8\n')
        )
        path = eval_dir / f"{name}.toml"
        path.write_text(text)
        return path

    return write
