"""Preempted: a spot reclaim notice (SIGTERM) at step 7 of the first attempt; the notice allows a final save."""

import os
import signal

from _loop import first_attempt, train


def fault(run, step):
    if step == 7 and first_attempt():
        os.kill(os.getpid(), signal.SIGTERM)


train(at_step=fault)
