"""A run that waits for a file `go` beside it, logs a flat loss, then a loss that climbs far above its noise."""

import sys
import time
from pathlib import Path

import trackway

cue = Path(sys.argv[1])
run = trackway.init()
deadline = time.time() + 60
while not cue.exists() and time.time() < deadline:
    time.sleep(0.05)
for step in range(160):
    loss = 1.0 + 0.01 * (step % 3) if step < 60 else 1.0 + (step - 60) / 20
    run.log({"loss": loss}, step=step)
    time.sleep(0.04)
    if run.should_stop:
        run.exit_preempted()
run.finish()
