"""Non-finite values under any key that names a loss end the attempt as nan_loss; other keys may be anything."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from waiting import wait_for

from trackway.sdk.exceptions import NonFiniteLoss
from trackway.sdk.context import AttemptContext
from trackway.sdk.run import Run
from trackway.sdk.writer import LossKeys
from trackway.spool import NOTE_FILE


@pytest.fixture
def make_run(tmp_path):
    made = []

    def make(**kwargs) -> Run:
        context = AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1,
                                 spool_dir=tmp_path / "spool", checkpoint_dir=tmp_path / "ckpt")
        made.append(Run(context, {}, install_hooks=False, **kwargs))
        return made[-1]

    yield make
    for run in made:
        run.finish()  # after a NonFiniteLoss it was told: it completes what is left


WATCHED = ["loss", "train_loss", "train/loss", "val_loss", "eval/loss", "Train/Loss", "train_loss_step", "grad_norm"]
IGNORED = ["loss_scale", "lossless_ratio", "accuracy", "lr", "train/loss/std", "grad_norm_clip"]


def _note(tmp_path) -> dict:
    return json.loads((tmp_path / "spool" / NOTE_FILE).read_text())


@pytest.mark.parametrize("key", WATCHED)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_float_under_a_loss_key_is_nan_loss(make_run, tmp_path, key, value):
    run = make_run()
    run.log({key: 0.5, "lr": 0.1}, step=0)
    run.log({key: value, "lr": 0.1}, step=1)
    run.log({key: 0.5, "lr": 0.1}, step=2)
    with pytest.raises(NonFiniteLoss, match="at step 1$"):
        run.finish()  # checks everything logged before it: never a completed attempt
    note = _note(tmp_path)
    assert note["reason"] == "nan_loss" and note["key"] == key and note["step"] == 1
    assert note["message"].startswith(f"non-finite {key} = ")


def test_the_training_loop_is_stopped_by_its_next_log_once_the_writer_met_the_value(make_run, tmp_path):
    run = make_run()
    run.log({"loss": math.nan}, step=0)
    steps = itertools.count(1)

    def next_step_logged() -> bool:  # the training loop goes on, step by step, until a log call raises
        run.log({"loss": 0.5}, step=next(steps))
        return False

    with pytest.raises(NonFiniteLoss, match="non-finite loss = nan at step 0"):
        wait_for(next_step_logged, "a log call to raise NonFiniteLoss", timeout=30, interval=0.01)
    assert _note(tmp_path)["message"] == "non-finite loss = nan at step 0; no checkpoint committed yet"


@pytest.mark.parametrize("value", [math.nan, np.float32("inf")], ids=["float", "numpy scalar"])
def test_no_checkpoint_saved_after_a_non_finite_loss_is_committed(make_run, tmp_path, value):
    run = make_run()
    run.log({"loss": 0.5}, step=2)
    with run.checkpoints.writing(2) as directory:
        (directory / "weights.bin").write_bytes(b"good")
    run.log({"loss": value}, step=3)
    with pytest.raises(NonFiniteLoss, match="at step 3"):
        with run.checkpoints.writing(3) as directory:
            (directory / "weights.bin").write_bytes(b"diverged")
    assert [info.step for info in run.checkpoints.list()] == [2]
    assert _note(tmp_path)["message"].endswith("at step 3; last good checkpoint: step-00000002")


def test_a_torch_save_after_a_non_finite_loss_is_refused_before_writing(make_run, tmp_path):
    torch = pytest.importorskip("torch")
    run = make_run()
    run.log({"loss": torch.tensor(float("nan"))}, step=4)
    with pytest.raises(NonFiniteLoss, match="at step 4"):
        run.checkpoints.save(4, model=torch.nn.Linear(2, 2), blocking=True)
    assert run.checkpoints.list() == []


def test_a_script_that_exits_without_finish_after_a_non_finite_loss_ends_as_nan_loss(tmp_path):
    script = f"""
from pathlib import Path
from trackway.sdk.context import AttemptContext
from trackway.sdk.run import Run
context = AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1,
                         spool_dir=Path({str(tmp_path / "spool")!r}), checkpoint_dir=Path({str(tmp_path / "ckpt")!r}))
run = Run(context, {{}}, install_hooks=False)
for step in range(5):
    run.log({{"train/loss": float("inf") if step == 4 else 1.0}}, step=step)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "non-finite train/loss = inf at step 4: ending the attempt as nan_loss" in done.stderr, done.stderr
    note = _note(tmp_path)
    assert note["reason"] == "nan_loss" and note["step"] == 4


@pytest.mark.parametrize("key", IGNORED)
def test_other_keys_may_hold_any_value(make_run, key):
    run = make_run()
    run.log({key: math.inf, "loss": 0.5}, step=0)
    run.log({key: math.nan, "loss": 0.4}, step=1)


def test_a_non_float_value_is_checked_by_the_writer_and_raised_at_the_next_log(make_run):
    run = make_run()
    run.log({"train/loss": np.float32("nan")}, step=0)  # a scalar the training thread does not inspect
    run._writer.flush()
    with pytest.raises(NonFiniteLoss, match="train/loss"):
        run.log({"train/loss": np.float32(0.5)}, step=1)


def test_the_pattern_is_configurable_by_argument_and_environment(make_run, monkeypatch):
    monkeypatch.setenv("TRACKWAY_LOSS_KEYS", r"objective")
    run = make_run()
    run.log({"loss": math.nan}, step=0)  # the pattern replaces the default
    run.log({"Objective": math.nan}, step=1)
    with pytest.raises(NonFiniteLoss, match="non-finite Objective = nan at step 1"):
        run.finish()
    run = make_run(loss_keys=r"ppl|.*_loss")  # the argument wins over the environment
    run.log({"objective": math.nan}, step=0)
    run.log({"ppl": math.inf}, step=1)
    with pytest.raises(NonFiniteLoss, match="non-finite ppl = inf at step 1"):
        run.finish()


def test_a_bad_pattern_is_refused_by_name():
    with pytest.raises(ValueError, match="loss_keys: '\\(' is not a regular expression"):
        LossKeys("(")


def test_each_key_is_decided_once():
    is_loss = LossKeys()
    assert [is_loss(k) for k in WATCHED] == [True] * len(WATCHED)
    assert [is_loss(k) for k in IGNORED] == [False] * len(IGNORED)
    assert len(is_loss._known) == len(WATCHED) + len(IGNORED)
