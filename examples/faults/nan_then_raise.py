"""NaN, then the script's own exception: the loss goes NaN at step 7 and the script's check raises right after.

The divergence is the ending (nan_loss, stop, point at the last good checkpoint); the
FloatingPointError the script raised on seeing it is a consequence, kept in the note's message.
"""

import math

from _loop import train


def fault(run, step):
    if step == 7:
        run.log({"loss": float("nan")}, step=step)
        loss = float("nan")
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}")
    return None


train(at_step=fault)
