"""OOM that depends on the config: batches above 8 do not fit. `trackway resume RUN --set train.batch_size=8` fixes it."""

import torch

import trackway

run = trackway.init()
batch = run.config.get("train", {}).get("batch_size", 32)
for step in range(5):
    if batch > 8:
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory at batch size {batch}. Tried to allocate 4.00 GiB")
    run.log({"loss": 1.0 / (step + 1)}, step=step)
run.finish()
