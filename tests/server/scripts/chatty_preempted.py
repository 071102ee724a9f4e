"""Twelve steps that print as they go; the first attempt gets a preemption notice (SIGTERM) at step 7."""

import os
import signal
import sys
import time

import trackway

run = trackway.init()
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
for step in range(start, 12):
    print(f"step {step} loss {1.0 / (step + 1):.4f} attempt {os.environ['TRACKWAY_ATTEMPT_NUMBER']}", flush=True)
    if step == 7 and os.environ["TRACKWAY_ATTEMPT_NUMBER"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if step % 5 == 0 or run.should_stop:
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
    if run.should_stop:
        print(f"preemption notice at step {step}", file=sys.stderr, flush=True)
        run.exit_preempted()
run.finish()
