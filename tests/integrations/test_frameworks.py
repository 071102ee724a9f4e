"""Hugging Face Trainer and Lightning under trackway, for real: SIGTERM mid-run → attempt 1 `preempted`
→ the supervisor resumes from the framework's own checkpoint, committed in place → attempt 2 completes
with the same final loss as an uninterrupted run; each checkpoint is stored once; metrics by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from preempted_runs import drive_preempted

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrations"


def _scenario(home, sqlite_url, monkeypatch, command, notice_after: str):
    """Submit a reference run and one that gets a SIGTERM once its log shows `notice_after`; drive both."""
    driven = drive_preempted(sqlite_url, monkeypatch, command, notice_after, deadline_s=400)
    settings, runs, states, keys = driven.settings, driven.runs, driven.states, driven.keys
    reference, preempted = runs
    attempts, losses = driven.attempts[preempted], driven.losses
    assert states == {reference: "completed", preempted: "completed"}, attempts
    assert [a["termination_reason"] for a in attempts] == ["preempted", "completed"]
    assert attempts[0]["exit_code"] == 75  # run.exit_preempted(): never a clean exit 0
    assert json.loads(attempts[0]["retry_decision"])["action"] == "resume"
    assert attempts[1]["resumed_from_checkpoint"]
    # What a person reads: `trackway metrics RUN --json`, the metrics under their own names, both attempts.
    shown = json.loads(subprocess.run([sys.executable, "-m", "trackway", "metrics", preempted, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    assert {p["key"] for p in shown} == keys and {p["attempt_number"] for p in shown} == {1, 2}
    return settings, runs, attempts, losses, keys


def _committed(settings, run_id: str) -> list[Path]:
    root = settings.runs_dir / run_id / "checkpoints"
    return sorted(p for p in root.iterdir() if (p / "COMMITTED").exists())


@pytest.mark.slow
def test_hf_trainer_preempted_resumes_same_loss(home, sqlite_url, monkeypatch, tmp_path):
    pytest.importorskip("transformers", reason="the `frameworks` extra is not installed")
    pytest.importorskip("accelerate", reason="the `frameworks` extra is not installed")

    def command(i):
        return [sys.executable, str(EXAMPLES / "hf_trainer.py"), "--output-dir", str(tmp_path / f"out{i}"),
                "--steps", "30", "--save-steps", "10", "--step-delay", "0.15"]

    settings, runs, attempts, losses, keys = _scenario(home, sqlite_url, monkeypatch, command, "step 14\n")
    reference, preempted = runs
    assert {"loss", "grad_norm", "learning_rate"} <= keys
    assert losses[preempted][-1]["step"] == losses[reference][-1]["step"] == 30
    # Seeded and resumed from HF's own state (model, optimizer, scheduler, RNG): the same final loss.
    assert losses[preempted][-1]["value"] == pytest.approx(losses[reference][-1]["value"], rel=0, abs=0)
    committed = _committed(settings, preempted)
    steps = [int(p.name.split("-")[1]) for p in committed]
    assert 10 in steps and 30 in steps and any(10 < s < 30 for s in steps)  # the notice's own save among them
    for path in committed:  # HF's files are the payload, beside MANIFEST and COMMITTED
        assert (path / "model.safetensors").exists() and (path / "trainer_state.json").exists()
        assert (path / "MANIFEST.json").exists()
    # Stored once: no `checkpoint-N` copy left in HF's output_dir.
    assert not list((tmp_path / "out1").glob("checkpoint-*"))


@pytest.mark.slow
def test_lightning_preempted_resumes_same_loss(home, sqlite_url, monkeypatch):
    pytest.importorskip("lightning", reason="the `frameworks` extra is not installed")

    def command(i):
        return [sys.executable, str(EXAMPLES / "lightning_module.py"), "--epochs", "15",
                "--checkpoint-every", "16", "--step-delay", "0.1", "--stateful-loader"]

    # 4 steps per epoch: the first checkpoint is at step 16; the notice comes after step 26 and is saved
    # there, mid-epoch; the stateful loader's position is in it, so the resume is exact.
    settings, runs, attempts, losses, keys = _scenario(home, sqlite_url, monkeypatch, command, "step 26\n")
    reference, preempted = runs
    assert "loss" in keys
    assert losses[preempted][-1]["step"] == losses[reference][-1]["step"]
    assert losses[preempted][-1]["value"] == pytest.approx(losses[reference][-1]["value"], rel=0, abs=0)
    committed = _committed(settings, preempted)
    assert len(committed) >= 2
    for path in committed:  # Lightning's checkpoint file is the payload, written once, in place
        assert [p.name for p in path.glob("*.ckpt")] == ["model.ckpt"]
        assert (path / "MANIFEST.json").exists()
