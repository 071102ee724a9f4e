"""Code error: an uncaught exception in the training step."""

from _loop import train


def fault(run, step):
    if step == 4:
        return 1.0 / (step - 4)


train(at_step=fault)
