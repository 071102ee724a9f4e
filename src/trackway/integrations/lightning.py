"""Lightning: one object that is both the logger and the callback, on one process or on every DDP rank.

    from trackway.integrations.lightning import TrackwayLightning, resume_checkpoint
    tw = TrackwayLightning()                      # on every rank, before the Trainer
    trainer = L.Trainer(..., logger=tw, callbacks=[tw])
    trainer.fit(model, data, ckpt_path=resume_checkpoint())

- Metrics Lightning logs (`self.log(...)`) go to `run.log` under their names at the global step,
  from global rank 0 (Lightning's `rank_zero_only`).
- Checkpoints are written by `trainer.save_checkpoint` straight into the run's `step-N/` directory
  (`model.ckpt`) and committed there: stored once. They are taken after the optimizer step the
  policy names (`run.checkpoints.due(step)`), mid-epoch included, and after the step under way when
  a preemption notice came, with Lightning's loop state (fit loop and batch progress; the dataloader
  position too when the loader is stateful, e.g. torchdata's `StatefulDataLoader`).
- A save due on an epoch's last batch is taken at that epoch's end (`on_train_epoch_end`): taken in
  the batch hook, a stateful loader's saved position is "exhausted" and Lightning 2.6 resumes into an
  empty epoch (measured: the resumed run ended one epoch short).
- A notice stops the fit loop (`trainer.should_stop`) after that save and ends the attempt
  preempted (`run.exit_preempted()`, exit code 75).

Several ranks (Lightning's own `devices=N, strategy="ddp"` launch, or torchrun):

    every rank, after each optimizer step (on_train_batch_end):
        notice? = any rank read `run.should_stop`     (strategy.reduce_boolean_decision: one all-reduce)
        due?    = run.checkpoints.due(step)          (by minutes: rank 0's clock, told to all)
        due or notice ─► run.checkpoints.writing(step) on every rank (collective: one shared directory)
                           trainer.save_checkpoint(...)  (Lightning writes on rank 0, then a barrier)
                         ─► rank 0 commits what is in the directory
        notice ─► every rank stops the loop, then exit_preempted() in on_train_end

  So ranks never disagree about saving or stopping, whichever of them the signal reached.

- Lightning's own SIGTERM handler is taken back once training starts (trackway's stays): under DDP it
  runs a `dist.broadcast` inside the signal handler and forwards the signal to the other ranks,
  and a SIGTERM to the process group then hung 2-rank gloo training in our runs (both ranks alive
  60 s after it). trackway's handler only notes the notice; the decision above acts on it.
- A rank Lightning's launcher started (LOCAL_RANK set, RANK not) learns its global rank here, so
  its events and heartbeats are not told as rank 0's.
- Exit codes: every rank ends with exit_preempted(). Under Lightning's own launcher, ranks > 0 exit 0
  after writing their note: that launcher SIGKILLs rank 0 (the process trackway watches) as soon as
  a child exits non-zero, which would turn rank 0's preempted ending into a kill.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from trackway.integrations._common import current_run, numeric

__all__ = ["TrackwayLightning", "resume_checkpoint", "CHECKPOINT_FILE"]

CHECKPOINT_FILE = "model.ckpt"


def resume_checkpoint(run: Any = None) -> str | None:
    """The file to hand to `trainer.fit(..., ckpt_path=...)`: the newest committed checkpoint, or None.

    Call it on every rank (Lightning loads the file on each): before `fit()` the ranks are not
    connected yet, so each reads the same newest committed checkpoint from the shared directory.
    """
    info = current_run(run).checkpoints.latest()
    return str(Path(info.path) / CHECKPOINT_FILE) if info is not None else None


def _rank_from_lightning_launcher() -> None:
    """Export RANK in a process Lightning's launcher started on this node, before trackway reads it.

    Lightning's launcher gives its children LOCAL_RANK, NODE_RANK and WORLD_SIZE but not RANK, which
    is what trackway (and torchrun) use for the global rank. On node 0 the global rank is the local
    one; on other nodes the per-node count is not in the environment, so nothing is guessed.
    """
    env = os.environ
    if "RANK" in env or "LOCAL_RANK" not in env or "WORLD_SIZE" not in env:
        return
    if env.get("NODE_RANK", "0") == "0" and env.get("GROUP_RANK", "0") == "0":
        env["RANK"] = env["LOCAL_RANK"]


class TrackwayLightning(Logger, Callback):
    def __init__(self, run: Any = None, exit_on_preemption: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        _rank_from_lightning_launcher()
        # Joined now, before fit(): trackway's notice handler is installed before Lightning's.
        # `init_kwargs` (config=, checkpoint_every_steps=, ...) go to `trackway.init` when no run is given.
        self.run = current_run(run, **init_kwargs)
        self.exit_on_preemption = exit_on_preemption
        self._notice_handler = signal.getsignal(signal.SIGTERM)
        self._saved_step: int | None = None
        self._stopping = False  # the ranks agreed to stop on a notice
        self._exiting = False
        self._due_at_epoch_end: int | None = None

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
    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning registered its SIGTERM handler just before this hook (see the module docstring).
        if callable(self._notice_handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._notice_handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._stopping:
            return
        # Every rank asks, every time: the answers are collectives, and an all-reduce of "any rank
        # got a notice" is the same on every rank, where each rank's own flag would not be.
        noticed = trainer.strategy.reduce_boolean_decision(bool(self.run.should_stop), all=False)
        step = int(trainer.global_step)
        if noticed:
            self._stopping = True
            trainer.should_stop = True
        if self.run.checkpoints.due(step) or noticed:
            if batch_idx + 1 >= trainer.num_training_batches:
                # The epoch's last batch: saved at the epoch's end instead. Saved here, a stateful loader's
                # state is "exhausted" and Lightning resumes into an empty epoch (one epoch short).
                self._due_at_epoch_end = step
            else:
                self._save(trainer, step)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        step, self._due_at_epoch_end = self._due_at_epoch_end, None
        if step is not None:
            self._save(trainer, step)

    def _save(self, trainer: Any, step: int) -> None:
        if self._saved_step == step or step == 0:
            return
        metrics = numeric(dict(trainer.callback_metrics)) or None
        # Collective: every rank enters it and gets the same directory; Lightning writes the file on
        # rank 0 and waits for every rank at its barrier; rank 0 then commits the directory.
        with self.run.checkpoints.writing(step, metrics=metrics) as target:
            trainer.save_checkpoint(str(Path(target) / CHECKPOINT_FILE))
        self._saved_step = step

    def on_train_end(self, trainer, pl_module) -> None:
        if self._stopping and self.exit_on_preemption:
            self._exit_preempted(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # After a notice, any ending of fit() (Lightning's SIGTERMException is a SystemExit with code 0)
        # is a preemption, never "completed".
        if (self._stopping or self.run.should_stop) and self.exit_on_preemption and not self._exiting:
            self._exit_preempted(trainer)

    def _exit_preempted(self, trainer: Any) -> None:
        self._exiting = True  # the SystemExit raised here comes back through on_exception
        code = 0 if trainer.global_rank != 0 and _launched_by_lightning(trainer) else 75
        self.run.exit_preempted(code)


def _launched_by_lightning(trainer: Any) -> bool:
    """Whether Lightning's own launcher started the ranks (not torchrun, Slurm or another launcher)."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    return isinstance(getattr(trainer.strategy, "cluster_environment", None), LightningEnvironment)
