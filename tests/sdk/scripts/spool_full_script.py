"""A training loop for the full-disk tests: `python spool_full_script.py STEPS_BEFORE STEPS_AFTER [GO_FILE]`.

Joins the attempt named by the TRACKWAY_* environment, logs STEPS_BEFORE steps of two metrics,
prints `logged`, and, given GO_FILE, waits until the test creates it (the test frees the disk
first) before logging STEPS_AFTER more steps and calling `run.finish()`.
"""

import os
import sys
import time

import trackway

before, after = int(sys.argv[1]), int(sys.argv[2])
go = sys.argv[3] if len(sys.argv) > 3 else None
run = trackway.init()
for step in range(before):
    run.log({"loss": 1.0 / (step + 1), "acc": step / 1000.0}, step=step)
print("logged", flush=True)
if go:
    deadline = time.time() + 60
    while not os.path.exists(go):
        if time.time() > deadline:  # nobody freed the disk: do not linger after a failed test
            raise SystemExit(3)
        time.sleep(0.05)
for step in range(before, before + after):
    run.log({"loss": 1.0 / (step + 1), "acc": step / 1000.0}, step=step)
run.finish()
