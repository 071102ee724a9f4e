"""A run whose loss climbs: the loss-rising watcher should notice while it runs."""

import time

import trackway

run = trackway.init()
for step in range(400):
    run.log({"loss": 1.0 + step / 100.0}, step=step)
    time.sleep(0.01)
    if run.should_stop:
        run.exit_preempted()
run.finish()
