"""NaN loss: the loss diverges at step 6."""

from _loop import train


def fault(run, step):
    return float("nan") if step == 6 else None


train(at_step=fault)
