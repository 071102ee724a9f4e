"""Transient infrastructure error: an NCCL failure on the first attempt (no SDK involved); the retry succeeds."""

import os
import sys

if os.environ.get("TRACKWAY_ATTEMPT_NUMBER", "1") == "1":
    print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, "
          "NCCL version 2.19.3: Connection reset by peer", file=sys.stderr)
    sys.exit(1)
print("all ranks healthy; training done")
