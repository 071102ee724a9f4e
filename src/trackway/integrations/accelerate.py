"""Hugging Face `accelerate`: one object that is accelerate's tracker and saves through trackway.

    from trackway.integrations.accelerate import TrackwayAccelerate
    tw = TrackwayAccelerate(checkpoint_every_steps=20)
    accelerator = Accelerator(log_with=tw)
    accelerator.init_trackers("my-project", config=config)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start = tw.resume(accelerator)             # the newest committed checkpoint's step, 0 on a fresh start
    for step in range(start + 1, steps + 1):
        ...                                    # forward, accelerator.backward(loss), optimizer.step()
        accelerator.log({"loss": loss.item()}, step=step)
        tw.step_end(step)                      # saves when due or on a notice; then ends preempted
    accelerator.end_training()                 # finishes the run

- `accelerator.log(...)` goes to `run.log` under the same names, from the main process.
- A save is `accelerator.save_state()` written straight into the run's `step-N/` directory and
  committed there (model, optimizer, scheduler, every process's RNG, samplers, registered
  objects): stored once. `resume()` hands that directory to `accelerator.load_state()`.
- A preemption notice, agreed across processes at `step_end`, saves that step and ends the
  attempt preempted (`run.exit_preempted()`, exit code 75) on every process.
- `end_training()` finishes the run on every process (the tracker is not main-process-only): a
  notice after it ends nothing and resumes nothing.

Under `accelerate launch` (or `torchrun`) every process runs these lines: `resume()` and
`step_end()` are collective (every process calls them at the same step), as `save_state` is.
Where the data loop resumes is the script's: `step` is what `resume()` returned, and a loader
resumed mid-epoch skips what it already served (`accelerator.skip_first_batches`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker

from trackway.integrations._common import current_run, numeric

__all__ = ["TrackwayAccelerate"]


class TrackwayAccelerate(GeneralTracker):
    name = "trackway"
    requires_logging_directory = False
    # Every process: finish() must reach every rank's run, or a notice after the end would resume it.
    main_process_only = False

    def __init__(self, run: Any = None, exit_on_preemption: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        # Joined now: the notice handlers are in place before the first step. `init_kwargs`
        # (config=, checkpoint_every_steps=, checkpoint_every_minutes=, ...) go to `trackway.init`.
        self.run = current_run(run, **init_kwargs)
        self.exit_on_preemption = exit_on_preemption
        self.accelerator: Any = None

    # -- accelerate's tracker API ------------------------------------------------------------------
    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        pass  # the config is the run's receipt: trackway.init(config=...) or `trackway submit --config`

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        found = numeric(values)
        if found:
            self.run.log(found, step=step)

    def finish(self) -> None:
        self.run.finish()

    # -- checkpoints ---------------------------------------------------------------------------------
    def resume(self, accelerator: Any) -> int:
        """Load the newest committed checkpoint into `accelerator` (every process); its step, 0 on a fresh start."""
        self.accelerator = accelerator
        info = self.run.checkpoints.latest()  # collective: rank 0 picks, every process gets the same one
        if info is None:
            return 0
        accelerator.load_state(str(info.path))
        return int(info.step)

    def save(self, step: int, accelerator: Any = None) -> None:
        """`accelerator.save_state()` into the run's `step-N/`, committed once every process wrote its part."""
        accelerator = accelerator or self.accelerator
        if accelerator is None:
            raise ValueError("TrackwayAccelerate.save: no accelerator (pass it, or call resume(accelerator) first)")
        self.accelerator = accelerator
        with self.run.checkpoints.writing(step, metrics=None) as target:
            accelerator.save_state(str(Path(target)))

    def step_end(self, step: int, accelerator: Any = None) -> bool:
        """After each optimizer step, on every process: save when due or after a notice; True if it saved.

        After a notice the save is followed by `run.exit_preempted()` (unless `exit_on_preemption`
        is off: then it returns True and `run.should_stop` tells the loop to stop).
        """
        checkpoints = self.run.checkpoints
        stop = checkpoints.any_rank(self.run.should_stop)
        if not (stop or checkpoints.due(step)):
            return False
        self.save(step, accelerator)
        if stop and self.exit_on_preemption:
            self.run.exit_preempted()
        return True
