"""Notice ignored: a loop that only logs (an HF callback calling `run.log`) never reads `run.should_stop`.

A SIGTERM at step 7 of the first attempt. The script logs step 8 without having looked, so the SDK
ends the attempt itself as preempted (exit code 75) instead of training on until the grace period's
SIGKILL; the next attempt resumes from step 5's checkpoint and completes.
"""

import os
import signal

from _loop import first_attempt

import trackway

run = trackway.init(checkpoint_every_steps=5)
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
for step in range(start, 12):
    if step == 7 and first_attempt():
        os.kill(os.getpid(), signal.SIGTERM)
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if run.checkpoints.due(step):
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
run.finish()
