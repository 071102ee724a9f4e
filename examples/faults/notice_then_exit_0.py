"""Notice, then exit 0 with no note: a framework that handles SIGTERM its own way and leaves the process abruptly.

The script reads `run.should_stop`, stops its loop and ends with `os._exit(0)` (no `finish()`, no
at-exit hooks, so the SDK writes no note). The spool still holds the SDK's preemption notice: the
attempt is `preempted` and resumed, never `completed` with the work cut short.
"""

import os
import signal

from _loop import first_attempt

import trackway

run = trackway.init()
for step in range(10):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if step == 4 and first_attempt():
        os.kill(os.getpid(), signal.SIGTERM)
    if run.should_stop:
        os._exit(0)
run.finish()
