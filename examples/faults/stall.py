"""Stall: the first attempt hangs after step 3 (a deadlocked collective); the supervisor ends it and retries once."""

import time

from _loop import first_attempt, train


def fault(run, step):
    if step == 3 and first_attempt():
        while True:
            time.sleep(1)


train(at_step=fault)
