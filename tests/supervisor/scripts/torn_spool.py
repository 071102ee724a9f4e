"""Logs 40 steps and, half-way, appends to its own metrics spool what a full disk or a stray
writer leaves behind: a torn line, then garbage. The run itself is healthy and must complete."""

import os
import time
from pathlib import Path

import trackway

run = trackway.init()
for step in range(20):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
time.sleep(1.0)  # the writer flushes every 0.25 s: nothing of ours is in flight while we append
spool = Path(os.environ["TRACKWAY_SPOOL_DIR"])
with open(next(spool.glob("metrics-*.jsonl")), "ab") as f:
    f.write(b'{"keys": ["loss"], "steps": [20, 21\n')
    f.write(b"\x00\xff not json at all\n")
for step in range(20, 40):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
run.finish()
