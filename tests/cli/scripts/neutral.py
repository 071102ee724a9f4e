"""A framework-neutral training stand-in: logs a step counter, checkpoints with `writing()`, resumes from `latest()`.

`python neutral.py STEPS [--fail-at STEP] [--preempt-at STEP,STEP,...]`
--fail-at: raise at STEP on attempt 1. --preempt-at: on attempt N, send itself SIGTERM at the N-th
step listed (a real preemption notice), checkpoint and exit preempted.
"""

import argparse
import os
import signal

import trackway

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--fail-at", type=int)
parser.add_argument("--preempt-at", default="")
args = parser.parse_args()
attempt = int(os.environ["TRACKWAY_ATTEMPT_NUMBER"])
preempt_steps = [int(s) for s in args.preempt_at.split(",") if s]
preempt_at = preempt_steps[attempt - 1] if attempt <= len(preempt_steps) else None

run = trackway.init(checkpoint_every_steps=10)
latest = run.checkpoints.latest()
start = 0
if latest is not None:
    start = int((latest.path / "counter.txt").read_text()) + 1
    print(f"resumed at {start} from {latest.name}", flush=True)
for step in range(start, args.steps):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if step == preempt_at:
        os.kill(os.getpid(), signal.SIGTERM)
    if (run.checkpoints.due(step) and step > 0) or run.should_stop:
        with run.checkpoints.writing(step, metrics={"loss": 1.0 / (step + 1)}) as directory:
            (directory / "counter.txt").write_text(str(step))
    if run.should_stop:
        run.exit_preempted()
    if args.fail_at is not None and step == args.fail_at and attempt == 1:
        raise RuntimeError(f"flaky node at step {step}")
run.finish()
