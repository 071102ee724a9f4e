"""A tiny deterministic CPU training run that checkpoints and resumes through CheckpointManager.

    train_tiny.py ROOT OUT --steps N --every K [--sync] [--format F] [--stop-after S] [--files-at S]

Prints `step S` after each step and `resumed S` when it resumed; writes the final weights to OUT.
Draws from python `random`, numpy and torch (dropout) every step, and walks the data in a
per-epoch shuffled order, so a resume that misses any RNG state or the data cursor diverges.
Under torchrun (WORLD_SIZE > 1) it joins a gloo group, averages gradients across ranks with
the training's own collectives, gives each rank its own RNG streams and data order, and
writes OUT.rank<r>. `--stop-after S` ends the process abruptly after step S, without waiting
for a save in flight, the way a crash would. `--files-at S` finally commits a text file per
rank as step S through the framework-neutral `writing()`.
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import torch

from trackway.checkpoints.manager import CheckpointManager

SAMPLES = 48
BATCH = 8


class Cursor:
    """Where the loader is in its shuffled pass over the data."""

    def __init__(self, epoch: int = 0, index: int = 0, rank: int = 0) -> None:
        self.epoch = epoch
        self.index = index
        self.rank = rank

    def next_batch(self) -> torch.Tensor:
        seed = 1000 + self.epoch + 100 * self.rank
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(seed))
        batch = order[self.index : self.index + BATCH]
        self.index += BATCH
        if self.index >= SAMPLES:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "rank": self.rank}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--format", default="torch", help="the checkpoints' payload: torch or safetensors")
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--files-at", type=int, default=None, help="then commit plain files through writing()")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rank, world_size = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(0)
    data = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
    target = data.sum(dim=1, keepdim=True).sin()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    torch.manual_seed(100 + rank)

    manager = CheckpointManager(args.root, every_steps=args.every, async_save=not args.sync, format=args.format)
    restored = manager.restore_latest(model=model, optimizer=optimizer, scheduler=scheduler)
    start, cursor = 1, Cursor(rank=rank)
    if restored is not None:
        start, cursor = restored.step + 1, Cursor(**restored.data_state)
        print(f"resumed {restored.step}", flush=True)

    for step in range(start, args.steps + 1):
        batch = cursor.next_batch()
        noise = torch.from_numpy(np.random.randn(BATCH, 8).astype(np.float32)) * 0.01
        scale = 1.0 + random.gauss(0.0, 0.01)
        loss = (model(data[batch] * scale + noise) - target[batch]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if world_size > 1:
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world_size
        optimizer.step()
        scheduler.step()
        if manager.due(step):
            manager.save(
                step,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                data_state=cursor.state_dict(),
                metrics={"loss": loss.item()},
            )
        print(f"step {step}", flush=True)
        if step == args.stop_after:
            os._exit(0)
    if args.files_at is not None:
        with manager.writing(args.files_at, metrics={"final": True}) as directory:
            (directory / f"notes-rank{rank}.txt").write_text(f"rank {rank} finished {args.steps} steps\n")
    manager.close()
    torch.save(model.state_dict(), f"{args.out}.rank{rank}" if world_size > 1 else args.out)
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
