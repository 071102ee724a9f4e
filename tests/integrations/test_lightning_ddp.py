"""Lightning × launchers, for real (2 ranks on CPU, gloo): a preemption notice mid-epoch → attempt 1 saves
Lightning's checkpoint at that step on every rank and ends `preempted` → attempt 2 resumes from it →
the final loss equals an uninterrupted run's; each checkpoint is one non-empty `model.ckpt`, committed
once; the policy's steps (`checkpoint_every_steps`) are saved mid-epoch; nothing hangs (each test has
its own deadline, after which every process it started is killed and the test fails).

Data order: the example shuffles every epoch. With torchdata's StatefulDataLoader (and, under DDP, a
StatefulDistributedSampler told the epoch) Lightning restores the loader's position, so the order is
deterministic across the resume and the final loss is asserted bit-identical. With a plain DataLoader
Lightning starts the interrupted epoch's batches again: the run resumes and completes, and its loss is
not the reference's (test_plain_loader_resumes_but_not_exactly says by how much it may differ: any).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from preempted_runs import drive_preempted

# Only the scripts import Lightning (5 s of CPU): a worker collecting this file looks for it without importing it.
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("lightning", "torchdata")),
    reason="the `frameworks` extra is not installed",
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "integrations" / "lightning_module.py"
EVERY = 5  # checkpoint_every_steps
SAMPLES = 256  # batches of 16: 16 steps per epoch on one process, 8 per rank on two
EPOCHS = 3


def _command(launcher: str, stateful: bool = True, port: int = 29561) -> list[str]:
    args = [str(EXAMPLE), "--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--checkpoint-every", str(EVERY),
            "--step-delay", "0.15", "--shuffle", *(["--stateful-loader"] if stateful else [])]
    if launcher == "single":
        return [sys.executable, *args]
    if launcher == "lightning":  # Lightning's own launcher starts the script again for rank 1
        return [sys.executable, *args, "--devices", "2", "--strategy", "ddp"]
    # torchrun: one process per rank; a port per run, as the reference and the preempted run train at once
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", *args,
            "--devices", "2", "--strategy", "ddp"]


def _drive(home, sqlite_url, monkeypatch, command, notice_after: int, to_group: bool, deadline_s: float):
    """A reference run and one SIGTERMed once its log shows `step {notice_after}`; both driven to their end.

    To the whole group every rank gets it, as on a cancel or a host shutdown. To the launcher only, rank 1
    hears of it from the agreement alone (Lightning's launcher) or from torchrun.
    """
    driven = drive_preempted(sqlite_url, monkeypatch, command, f"step {notice_after}\n", deadline_s,
                             to_launcher_only=not to_group)
    reference, preempted = driven.runs
    assert driven.states == {reference: "completed", preempted: "completed"}, driven.attempts[preempted]
    return driven.settings, driven.runs, driven.attempts, driven.losses


def _check_resumed(settings, runs, attempts, losses, steps_per_epoch: int, notice_after: int) -> list[int]:
    reference, preempted = runs
    first, second = attempts[preempted]
    assert first["termination_reason"] == "preempted" and second["termination_reason"] == "completed"
    assert json.loads(first["retry_decision"])["action"] == "resume"
    assert second["resumed_from_checkpoint"]
    last = EPOCHS * steps_per_epoch - 1  # the step of the last optimizer step's log line
    assert losses[reference][-1]["step"] == losses[preempted][-1]["step"] == last
    root = settings.runs_dir / preempted / "checkpoints"
    committed = sorted(p for p in root.iterdir() if (p / "COMMITTED").exists())
    steps = [int(p.name.split("-")[1]) for p in committed]
    for path in committed:  # Lightning's checkpoint is the payload, one file, written once, in place
        assert sorted(p.name for p in path.iterdir()) == ["COMMITTED", "MANIFEST.json", "model.ckpt"]
        files = json.loads((path / "MANIFEST.json").read_text())["files"]
        assert files["model.ckpt"]["size"] == (path / "model.ckpt").stat().st_size > 1000
    # The policy's steps, mid-epoch or not, and the notice's own save: the step under way when it came.
    assert {s for s in steps if s % EVERY == 0} == set(range(EVERY, last + 2, EVERY))
    assert len([s for s in steps if s % EVERY]) <= 1
    # Attempt 2 continued right after the notice's save, in the middle of an epoch.
    resumed = min(p["step"] for p in losses[preempted] if p["attempt_number"] == 2)
    assert resumed == max(s for s in steps if s <= resumed) and notice_after < resumed <= notice_after + 8
    assert resumed % steps_per_epoch
    return steps


def test_lightning_ddp_preempted_mid_epoch_resumes_bit_identical(home, sqlite_url, monkeypatch):
    """Lightning's own launcher, 2 ranks, SIGTERM to the whole group mid-epoch (the case in which plain
    Lightning's own handler hangs): saved there, resumed there, the same final loss to the bit."""
    out = _drive(home, sqlite_url, monkeypatch, lambda i: _command("lightning"), notice_after=11, to_group=True,
                 deadline_s=240)
    settings, runs, attempts, losses = out
    _check_resumed(*out, steps_per_epoch=8, notice_after=11)
    reference, preempted = runs
    assert losses[preempted][-1]["value"] == pytest.approx(losses[reference][-1]["value"], rel=0, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "steps_per_epoch", "to_group"), [
    ("single", 16, False),
    ("lightning", 8, False),  # only rank 0 gets the SIGTERM: rank 1 stops and saves by the agreement
    ("torchrun", 8, False),  # torchrun passes its SIGTERM on to both ranks
])
def test_lightning_launchers_preempted_mid_epoch_resume_bit_identical(
    home, sqlite_url, monkeypatch, launcher, steps_per_epoch, to_group
):
    out = _drive(home, sqlite_url, monkeypatch, lambda i: _command(launcher, port=29561 + i), notice_after=11,
                 to_group=to_group, deadline_s=300)
    settings, runs, attempts, losses = out
    _check_resumed(*out, steps_per_epoch=steps_per_epoch, notice_after=11)
    reference, preempted = runs
    assert losses[preempted][-1]["value"] == pytest.approx(losses[reference][-1]["value"], rel=0, abs=0)


@pytest.mark.slow
def test_plain_loader_resumes_but_not_exactly(home, sqlite_url, monkeypatch):
    """A plain DataLoader under DDP: the resume works (Lightning's state, the committed file loads, the run
    completes) but the interrupted epoch's batches start again, so the loss is not the reference's."""
    out = _drive(home, sqlite_url, monkeypatch, lambda i: _command("lightning", stateful=False), notice_after=11,
                 to_group=True, deadline_s=300)
    settings, runs, attempts, losses = out
    _check_resumed(*out, steps_per_epoch=8, notice_after=11)
    reference, preempted = runs
    assert losses[preempted][-1]["value"] != losses[reference][-1]["value"]
