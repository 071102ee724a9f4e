"""The training-loop stand-in every fault scenario shares: steps, a loss, a checkpoint every 5 steps."""

from __future__ import annotations

import os
from collections.abc import Callable

import trackway


def first_attempt() -> bool:
    return os.environ.get("TRACKWAY_ATTEMPT_NUMBER", "1") == "1"


def train(steps: int = 12, at_step: Callable[[trackway.Run, int], float | None] | None = None) -> None:
    """Run `steps` steps; `at_step(run, step)` injects the fault (it may return a loss to log instead)."""
    run = trackway.init(checkpoint_every_steps=5)
    latest = run.checkpoints.latest()
    start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
    for step in range(start, steps):
        loss = 1.0 / (step + 1)
        if at_step is not None:
            injected = at_step(run, step)
            loss = loss if injected is None else injected
        run.log({"loss": loss}, step=step)
        if (run.checkpoints.due(step) and step > 0) or run.should_stop:
            with run.checkpoints.writing(step, metrics={"loss": loss}) as directory:
                (directory / "step.txt").write_text(str(step))
        if run.should_stop:
            run.exit_preempted()
    run.finish()
