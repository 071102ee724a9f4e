"""Lightning: one object that is both the logger and the callback.

    from trackway.integrations.lightning import TrackwayLightning, resume_checkpoint
    tw = TrackwayLightning()
    trainer = L.Trainer(..., logger=tw, callbacks=[tw])
    trainer.fit(model, data, ckpt_path=resume_checkpoint())

- Metrics Lightning logs (`self.log(...)`) go to `run.log` under their names at the global step.
- Checkpoints are written by `trainer.save_checkpoint` straight into the run's `step-N/` directory
  (`model.ckpt`) and committed there: stored once. They are taken at the end of a training epoch
  (the boundary Lightning resumes from exactly) when `run.checkpoints.due(step)` or a preemption
  notice arrived.
- A preemption notice stops the fit loop (`trainer.should_stop`), saves, and ends the attempt
  preempted (`run.exit_preempted()`, exit code 75). Lightning's own SIGTERM handling (fit stops,
  the process would exit 0) never turns a preemption into `completed`: the run is joined when this
  object is made, so Lightning chains trackway's handler, and the preempted note is written
  whichever way the fit loop ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from trackway.integrations._common import current_run, numeric

__all__ = ["TrackwayLightning", "resume_checkpoint", "CHECKPOINT_FILE"]

CHECKPOINT_FILE = "model.ckpt"


def resume_checkpoint(run: Any = None) -> str | None:
    """The file to hand to `trainer.fit(..., ckpt_path=...)`: the newest committed checkpoint, or None."""
    info = current_run(run).checkpoints.latest()
    return str(Path(info.path) / CHECKPOINT_FILE) if info is not None else None


class TrackwayLightning(Logger, Callback):
    def __init__(self, run: Any = None, exit_on_preemption: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        # Joined now, before fit(): Lightning then chains trackway's SIGTERM handler to its own.
        # `init_kwargs` (config=, checkpoint_every_steps=, ...) go to `trackway.init` when no run is given.
        self.run = current_run(run, **init_kwargs)
        self.exit_on_preemption = exit_on_preemption
        self._saved_step: int | None = None

    # -- Logger ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "trackway"

    @property
    def version(self) -> str:
        return str(getattr(self.run.context, "attempt", "") or "0")

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass  # the config is the run's receipt; trackway.init(config=...) records it

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        values = numeric(dict(metrics))
        values.pop("epoch", None)
        if values:
            self.run.log(values, step=step)

    # -- Callback -------------------------------------------------------------------------------
    def _preempted(self, trainer: Any) -> bool:
        return bool(self.run.should_stop or getattr(trainer, "received_sigterm", False))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._preempted(trainer):
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        step = int(trainer.global_step)
        if self._preempted(trainer) or self.run.checkpoints.due(step):
            self._save(trainer, step)
        if self._preempted(trainer):
            trainer.should_stop = True

    def _save(self, trainer: Any, step: int) -> None:
        if self._saved_step == step or step == 0:
            return
        metrics = numeric(dict(trainer.callback_metrics)) or None
        with self.run.checkpoints.writing(step, metrics=metrics) as target:
            trainer.save_checkpoint(str(Path(target) / CHECKPOINT_FILE))
        self._saved_step = step

    def on_train_end(self, trainer, pl_module) -> None:
        if self._preempted(trainer) and self.exit_on_preemption:
            self.run.exit_preempted()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Lightning raises SIGTERMException (a SystemExit with code 0) after a SIGTERM: never "completed".
        if self._preempted(trainer) and self.exit_on_preemption:
            self.run.exit_preempted()
