"""Runs out of GPU memory on its first attempt (as torch says it), and completes on any later one."""

import os
import sys

if os.environ.get("TRACKWAY_ATTEMPT_NUMBER") == "1":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 15.7 GiB total)",
          file=sys.stderr, flush=True)
    sys.exit(1)
print("trained on", os.environ.get("TRACKWAY_ATTEMPT_NUMBER"), flush=True)
