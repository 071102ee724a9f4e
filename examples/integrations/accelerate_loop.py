"""A small regression trained with Hugging Face `accelerate` under trackway: one object, three calls.

    trackway submit --name acc -- accelerate launch --cpu --num_processes 2 examples/integrations/accelerate_loop.py
    trackway submit --name acc1 -- python examples/integrations/accelerate_loop.py

The data are seeded random numbers, shuffled each epoch by accelerate's seedable sampler (its order
depends on the seed and the epoch only), so a resume mid-epoch skips the batches already served and
continues exactly: same final loss as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed

from trackway.integrations.accelerate import TrackwayAccelerate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.0)
    args = p.parse_args()

    tw = TrackwayAccelerate(checkpoint_every_steps=args.checkpoint_every)          # <- trackway
    accelerator = Accelerator(cpu=True, log_with=tw, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    accelerator.init_trackers("accelerate-demo")
    set_seed(0)
    x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True).sin()
    data = torch.utils.data.TensorDataset(x, y)
    # A generator of its own: starting an epoch (or the resumed part of one) then draws nothing from the
    # global RNG that dropout uses, so a resume mid-epoch sees the same dropout masks.
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start = tw.resume(accelerator)                                               # <- 0 on a fresh start
    per_epoch = len(loader)
    step = start
    while step < args.steps:
        epoch, served = divmod(step, per_epoch)
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, served) if served else loader
        for inputs, target in batches:
            step += 1
            loss = torch.nn.functional.mse_loss(model(inputs), target)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            accelerator.log({"loss": loss.item()}, step=step)
            print(f"step {step} loss {loss.item():.8f}", flush=True)
            time.sleep(args.step_delay)
            tw.step_end(step)                                                    # <- saves when due or on a notice
            if step >= args.steps:
                break
    accelerator.end_training()                                                   # <- finishes the run


if __name__ == "__main__":
    main()
