"""A training stand-in whose loss is exact arithmetic: 2·exp(-lr·step) + 0.1, so every criterion is checkable by hand.

Config (`$TRACKWAY_CONFIG`): train.steps (40), train.lr (0.1), train.delay (seconds slept per step, 0), train.mode:
ok | nan (the loss is NaN at step 3) | no_checkpoint (never saves). Checkpoints through `writing()` on `should_stop` and at the last step (`counter.txt`: the step, for the
stand-in evaluator of tests/evals).
"""

import json
import math
import os
import time

import trackway

config = json.loads(open(os.environ["TRACKWAY_CONFIG"]).read()) if os.environ.get("TRACKWAY_CONFIG") else {}
train = config.get("train", {})
steps, lr, mode = train.get("steps", 40), train.get("lr", 0.1), train.get("mode", "ok")
run = trackway.init()
for step in range(1, steps + 1):
    time.sleep(train.get("delay", 0))
    loss = 2.0 * math.exp(-lr * step) + 0.1
    if mode == "nan" and step == 3:
        loss = float("nan")
    run.log({"loss": loss}, step=step)
    if (run.should_stop or step == steps) and mode != "no_checkpoint":
        with run.checkpoints.writing(step) as directory:
            (directory / "counter.txt").write_text(str(step))  # what tests/evals/scripts/evaluator.py reads
    if run.should_stop:
        run.exit_preempted()
run.finish()
