"""Hugging Face `Trainer`: `callbacks=[TrackwayCallback()]`.

    from trackway.integrations.huggingface import TrackwayCallback, resume_checkpoint
    trainer = Trainer(..., callbacks=[TrackwayCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint())

- `on_log`: the Trainer's logs go to `run.log` under their names, at the global step.
- A preemption notice (`run.should_stop`) becomes a save and a clean stop; after that save the
  attempt ends preempted (`run.exit_preempted()`, exit code 75).
- HF's own `checkpoint-N` directory is committed through trackway's protocol *in place*: its files
  are moved (renamed, not copied) into the run's `step-N/` directory, which gets MANIFEST.json and
  COMMITTED beside them. Each checkpoint is stored once.
- `resume_checkpoint()` names the newest committed checkpoint (None on a fresh start); HF loads
  model, optimizer, scheduler, RNG and trainer state from it.
- Training that ends on its own (`on_train_end`, no notice) finishes the run: a SIGTERM after it
  (a pod deleted once done) ends nothing and resumes nothing.

Under DDP (`torchrun`, `accelerate launch`) the same line on every rank. Each save is collective:
every rank enters `run.checkpoints.writing(step)` after HF wrote its own files (rank 0 the model,
optimizer and trainer state, every rank its `rng_state_N.pth`); rank 0 moves the whole
`checkpoint-N` into `step-N/` only once every rank is in, and every rank goes on training only
once the commit is durable. A notice is agreed across ranks at each step (`any_rank`), so every
rank stops and saves at the same step even when the launcher's SIGTERM reaches them apart.
`resume_checkpoint()` is collective too: call it on every rank (as `trainer.train(...)` is).
HF's `output_dir` must be one directory every rank sees (one node, or a shared filesystem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trackway.integrations._common import adopt_into, current_run, numeric

__all__ = ["TrackwayCallback", "resume_checkpoint"]


def resume_checkpoint(run: Any = None) -> str | None:
    """The committed checkpoint to hand to `trainer.train(resume_from_checkpoint=...)`; None on a fresh start."""
    info = current_run(run).checkpoints.latest()
    return str(info.path) if info is not None else None


class TrackwayCallback(TrainerCallback):
    def __init__(self, run: Any = None, exit_on_preemption: bool = True, **init_kwargs: Any) -> None:
        # `init_kwargs` (config=, ...) go to `trackway.init` when no run is given; HF's save_steps decide saves.
        self._run_arg = run
        self._init_kwargs = init_kwargs
        self.exit_on_preemption = exit_on_preemption
        self.preempted = False

    @property
    def run(self) -> Any:
        return current_run(self._run_arg, **self._init_kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        self.run  # join the attempt (installs the notice handlers) before the first step
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            values = numeric(logs)
            if values:
                self.run.log(values, step=int(state.global_step))
        return control

    def on_step_end(self, args, state, control, **kwargs):
        # Agreed across ranks: a save that only the ranks which saw the notice start is a hang.
        if self.run.checkpoints.any_rank(self.run.should_stop):
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        step = int(state.global_step)
        source = Path(args.output_dir) / f"checkpoint-{step}"
        # Every rank checks before any rank enters writing(), so none can see it after rank 0 moved it.
        if source.is_dir():
            metrics = numeric(state.log_history[-1]) if state.log_history else None
            # Collective: it returns on each rank once every rank is in (so every rank's HF files are
            # complete), and leaves it once the commit is durable.
            with self.run.checkpoints.writing(step, metrics=metrics) as target:
                if state.is_world_process_zero:
                    adopt_into(source, Path(target))
        if self.preempted and self.exit_on_preemption:
            self.run.exit_preempted()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.run.should_stop and self.exit_on_preemption:
            self.run.exit_preempted()
        elif not self.preempted:
            # Trained to the end: finished, so a notice from here on (the pod deleted once done) is ignored.
            self.run.finish()
        return control
