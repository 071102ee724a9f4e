"""OOM: CUDA runs out of memory at step 3 (raised on CPU, as torch raises it on a GPU)."""

import torch

from _loop import train


def fault(run, step):
    if step == 3:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)")


train(at_step=fault)
