"""Notice after finish: the work is done and `run.finish()` called when a SIGTERM arrives.

The notice ends nothing and resumes nothing: the script goes on to its last line, exits 0, and the
run has one attempt, completed (a SIGTERM's default action would have read as a preemption).
"""

import os
import signal
import time

import trackway

run = trackway.init()
for step in range(10):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
run.finish()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("still running after the notice", flush=True)
