"""The same "transient" error at the same step in every attempt: it is not transient, and is not retried twice.

Every attempt resumes from the checkpoint at step 5 and raises the same NCCL error at step 6.
The first is `infra_transient` and resumed (budget 3); the second has the same signature
(exception, message shape, file and line, step), so the policy stops: "the same failure at step
5 in 2 attempts", instead of spending the whole budget on it.
"""

from _loop import train


def fault(run, step):
    if step == 6:
        raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, "
                           "NCCL version 2.19.3: Connection reset by peer")


train(at_step=fault)
