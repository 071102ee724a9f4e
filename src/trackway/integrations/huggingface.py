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
        if self.run.should_stop:
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        step = int(state.global_step)
        source = Path(args.output_dir) / f"checkpoint-{step}"
        if state.is_world_process_zero and source.is_dir():
            metrics = numeric(state.log_history[-1]) if state.log_history else None
            with self.run.checkpoints.writing(step, metrics=metrics) as target:
                adopt_into(source, Path(target))
        if self.preempted and self.exit_on_preemption:
            self.run.exit_preempted()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.run.should_stop and self.exit_on_preemption:
            self.run.exit_preempted()
        return control
