"""The config a script hands `trackway.init(config=...)` under `trackway submit` lands in its attempt's receipt."""

from __future__ import annotations

import math
import sys

from trackway.ledger.script_config import _storable, merge

PY = sys.executable
SCRIPT = """
import trackway
run = trackway.init(config={"optim": {"lr": 0.01, "betas": [0.9, 0.95]}, "batch_size": 8, "seed": 0})
run.log({"loss": 1.0}, step=0)
run.finish()
"""


def test_the_scripts_values_win_and_each_disagreement_is_kept():
    submitted = {"optim": {"lr": 0.1, "wd": 0.0}, "steps": 100, "flag": 1}
    said = {"optim": {"lr": 0.01}, "batch_size": 8, "steps": 100.0, "flag": True}
    merged, conflicts = merge(submitted, said)
    assert merged == {"optim": {"lr": 0.01, "wd": 0.0}, "steps": 100.0, "flag": True, "batch_size": 8}
    # 100 and 100.0 are one setting; a flag is not a count.
    assert conflicts == [
        {"key": "optim.lr", "submitted": 0.1, "script": 0.01},
        {"key": "flag", "submitted": 1, "script": True},
    ]


def test_values_json_cannot_hold_are_stored_as_text():
    stored = _storable({"lr": math.inf, 3: {"path": object}, "ok": [1, None]})
    assert stored["lr"] == "inf" and stored["3"]["path"].startswith("<class") and stored["ok"] == [1, None]


def test_init_config_is_merged_into_the_attempt_receipt_with_conflicts_shown(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = cli("submit", "--name", "said", "--set", "optim.lr=0.1", "--set", "steps=10", "--", PY, str(script))
    assert result.code == 0, result.err

    shown = cli("show", "said/1", "--json").json()
    # Submitted keys the script did not mention stay; the script's own keys are added; its lr is what ran.
    assert shown["config"] == {"optim": {"lr": 0.01, "betas": [0.9, 0.95]}, "steps": 10, "batch_size": 8, "seed": 0}

    text = " ".join(cli("explain", "said").out.split())
    assert "includes what the script passed to trackway.init(config=...)" in text
    assert "optim.lr: submitted 0.1, script 0.01" in text
    assert "batch_size = 8" in text


def test_a_script_config_without_a_submitted_one_is_the_receipt(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert cli("submit", "--name", "alone", "--", PY, str(script)).code == 0
    shown = cli("show", "alone/1", "--json").json()
    assert shown["config"] == {"optim": {"lr": 0.01, "betas": [0.9, 0.95]}, "batch_size": 8, "seed": 0}
    text = " ".join(cli("explain", "alone").out.split())
    assert "no key conflicts with the submitted config" in text
