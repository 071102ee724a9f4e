"""Logs steps until it is killed: `python log_forever.py`, in the attempt the TRACKWAY_* environment names.

Each step logs `loss` and `lr`; every 50 steps it pauses 5 ms (about 10k steps a second), so the
spool writer flushes many times while the test waits to kill it, and the backlog the ingester has
left to ingest after the kill stays small on a busy machine.
"""

import time

import trackway

run = trackway.init(install_hooks=False)
step = 0
while True:
    run.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
    step += 1
    if step % 50 == 0:
        time.sleep(0.005)
