"""A collective's error inside a script that uses the SDK: the same ending as a plain script's log line.

Attempt 1 raises the RuntimeError an NCCL all-reduce raises when a peer's socket resets; the SDK
notes it as an exception, and trackway reads it as `infra_transient` (retried with backoff),
exactly as examples/faults/infra_transient.py, which prints the same line without the SDK.
"""

from _loop import first_attempt, train


def fault(run, step):
    if step == 4 and first_attempt():
        raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, "
                           "NCCL version 2.19.3: Connection reset by peer")


train(at_step=fault)
