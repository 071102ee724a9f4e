"""Exact resume: a run killed with SIGKILL at a random step and resumed ends with the same weights, bit for bit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trackway.checkpoints.store import CheckpointStore

SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"
STEPS = 40
EVERY = 5


def run_to_end(root: Path, out: Path, *extra: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), str(out), "--steps", str(STEPS), "--every", str(EVERY), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_and_kill_at(root: Path, out: Path, kill_step: int, *extra: str) -> None:
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(root), str(out), "--steps", str(STEPS), "--every", str(EVERY), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stdout:
            if line.strip() == f"step {kill_step}":
                os.kill(process.pid, signal.SIGKILL)
                break
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()


# The default (async, torch's format) in the suite; the other two are trials: the same kill and resume through
# the save paths tests/checkpoints/test_async_save.py and test_safetensors_payload.py hold on their own.
@pytest.mark.parametrize("mode", [
    pytest.param([], id="async"),
    pytest.param(["--sync"], id="sync", marks=pytest.mark.slow),
    pytest.param(["--format", "safetensors"], id="async-safetensors", marks=pytest.mark.slow),
])
def test_killed_and_resumed_run_ends_bit_identical(tmp_path: Path, mode: list[str]) -> None:
    seed = random.randrange(1 << 30)
    kill_step = random.Random(seed).randint(2 * EVERY + 1, STEPS - 2)
    context = f"(kill at step {kill_step}, seed {seed})"

    run_to_end(tmp_path / "straight", tmp_path / "straight.pt", *mode)
    run_and_kill_at(tmp_path / "killed", tmp_path / "unused.pt", kill_step, *mode)
    latest = CheckpointStore(tmp_path / "killed").latest_committed()
    assert latest is not None and EVERY <= latest.step <= kill_step, context
    assert not (tmp_path / "unused.pt").exists()

    stdout = run_to_end(tmp_path / "killed", tmp_path / "resumed.pt", *mode)
    assert stdout.splitlines()[0] == f"resumed {latest.step}", context

    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), f"{name} differs {context}"
