"""A framework-neutral training stand-in: logs a step counter, checkpoints with `writing()`, resumes from `latest()`.

`python neutral.py STEPS [FAIL_AT_STEP_ON_ATTEMPT_1]`
"""

import os
import sys

import trackway

steps = int(sys.argv[1])
fail_at = int(sys.argv[2]) if len(sys.argv) > 2 else None
run = trackway.init(checkpoint_every_steps=10)
latest = run.checkpoints.latest()
start = 0
if latest is not None:
    start = int((latest.path / "counter.txt").read_text()) + 1
    print(f"resumed at {start} from {latest.name}", flush=True)
for step in range(start, steps):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if run.checkpoints.due(step) and step > 0:
        with run.checkpoints.writing(step, metrics={"loss": 1.0 / (step + 1)}) as directory:
            (directory / "counter.txt").write_text(str(step))
    if fail_at is not None and step == fail_at and os.environ["TRACKWAY_ATTEMPT_NUMBER"] == "1":
        raise RuntimeError(f"flaky node at step {step}")
run.finish()
