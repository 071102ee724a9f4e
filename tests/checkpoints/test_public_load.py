"""`trackway.checkpoints.load(path)`: what an evaluator calls on $TRACKWAY_CHECKPOINT, verified first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trackway.checkpoints
from trackway.errors import TrackwayError

TRAIN = """\
import torch
import trackway
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = trackway.init(config={"width": 3})
for step in (1, 2):
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    run.checkpoints.save(step, model=model, optimizer=opt, data_state={"cursor": step}, blocking=True)
torch.save(model.state_dict(), "expected.pt")
run.finish()
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of TRAIN, submitted as a user would: its working directory (expected.pt) and its home."""
    root = tmp_path_factory.mktemp("trained")
    work = root / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    env = {**os.environ, "TRACKWAY_HOME": str(root / "home"), "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    env.pop("TRACKWAY_DB", None)
    done = subprocess.run([sys.executable, "-m", "trackway", "submit", "--", sys.executable, "train.py"],
                          capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def checkpoints(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """This test's own copy of the run's two committed checkpoints (a test may damage its copy), beside expected.pt."""
    found = sorted(trained.glob("home/runs/*/checkpoints/step-*"))
    assert [p.name for p in found] == ["step-00000001", "step-00000002"]
    for path in found:
        shutil.copytree(path, tmp_path / path.name, symlinks=True)
    shutil.copy2(trained / "work" / "expected.pt", tmp_path / "expected.pt")
    monkeypatch.chdir(tmp_path)
    return [tmp_path / path.name for path in found]


def test_load_returns_the_saved_state(checkpoints: list[Path]) -> None:
    state = trackway.checkpoints.load(checkpoints[-1])
    expected = torch.load("expected.pt", weights_only=True)
    assert set(state["model"]) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(state["model"][key], tensor)
    assert state["data_state"] == {"cursor": 2} and state["optimizer"] is not None
    # The state file itself works too, and a model takes the weights as they are.
    same = trackway.checkpoints.load(checkpoints[-1] / "state.pt")
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(same["model"])


def test_a_changed_file_is_refused_and_nothing_is_loaded(checkpoints: list[Path]) -> None:
    state_file = checkpoints[0] / "state.pt"
    data = bytearray(state_file.read_bytes())
    data[-20] ^= 0xFF
    state_file.write_bytes(bytes(data))
    with pytest.raises(TrackwayError, match="does not match its manifest"):
        trackway.checkpoints.load(checkpoints[0])


def test_an_uncommitted_checkpoint_is_refused(checkpoints: list[Path]) -> None:
    (checkpoints[1] / "COMMITTED").unlink()
    with pytest.raises(TrackwayError, match="not committed"):
        trackway.checkpoints.load(checkpoints[1])


def test_a_path_that_is_no_checkpoint_says_so(tmp_path: Path) -> None:
    with pytest.raises(TrackwayError, match="expected a checkpoint directory"):
        trackway.checkpoints.load(tmp_path)
