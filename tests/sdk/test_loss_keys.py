"""Non-finite values under any key that names a loss end the attempt as nan_loss; other keys may be anything."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trackway.sdk.exceptions import NonFiniteLoss
from trackway.sdk.run import AttemptContext, Run
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
        run.finish()


WATCHED = ["loss", "train_loss", "train/loss", "val_loss", "eval/loss", "Train/Loss", "train_loss_step", "grad_norm"]
IGNORED = ["loss_scale", "lossless_ratio", "accuracy", "lr", "train/loss/std", "grad_norm_clip"]


@pytest.mark.parametrize("key", WATCHED)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_float_under_a_loss_key_is_nan_loss(make_run, tmp_path, key, value):
    run = make_run()
    run.log({key: 0.5, "lr": 0.1}, step=0)
    with pytest.raises(NonFiniteLoss):
        run.log({key: value, "lr": 0.1}, step=1)
    note = json.loads((tmp_path / "spool" / NOTE_FILE).read_text())
    assert note["reason"] == "nan_loss" and note["key"] == key and note["message"].startswith(f"non-finite {key} = ")


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
    with pytest.raises(NonFiniteLoss):
        run.log({"Objective": math.nan}, step=1)
    run = make_run(loss_keys=r"ppl|.*_loss")  # the argument wins over the environment
    run.log({"objective": math.nan}, step=0)
    with pytest.raises(NonFiniteLoss):
        run.log({"ppl": math.inf}, step=1)


def test_a_bad_pattern_is_refused_by_name():
    with pytest.raises(ValueError, match="loss_keys: '\\(' is not a regular expression"):
        LossKeys("(")


def test_each_key_is_decided_once():
    is_loss = LossKeys()
    assert [is_loss(k) for k in WATCHED] == [True] * len(WATCHED)
    assert [is_loss(k) for k in IGNORED] == [False] * len(IGNORED)
    assert len(is_loss._known) == len(WATCHED) + len(IGNORED)
