"""The plain SDK under DDP: every rank runs these lines, and the checkpoint calls on every rank.

    trackway submit --name ddp -- torchrun --standalone --nproc_per_node=2 examples/integrations/sdk_ddp.py

Each rank saves its own shard (`state.pt` on rank 0, `rank-00001.pt` on rank 1) of one checkpoint
that rank 0 commits; `restore_latest` gives each rank its own shard back (model, optimizer, RNG,
data position). `--rank0-only-save` shows the slip this guards against: saving on rank 0 alone
fails within $TRACKWAY_COLLECTIVE_TIMEOUT_S naming the call and the rank that did not join.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import trackway


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--rank0-only-save", action="store_true", help="the common slip: save on rank 0 only")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's environment; "nccl" on GPUs
    rank = dist.get_rank()
    run = trackway.init(checkpoint_every_steps=args.checkpoint_every)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)  # each rank its own dropout masks
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1 + rank))  # each rank its own data
    y = x.sum(dim=1, keepdim=True).sin()

    # Collective: every rank restores its own shard (rank 0 picks the checkpoint for all).
    restored = run.checkpoints.restore_latest(model=model.module, optimizer=optimizer)
    start = restored.step + 1 if restored else 1
    for step in range(start, args.steps + 1):
        batch = torch.arange(8) + 8 * (step % 8)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        run.log({"loss": loss.item()}, step=step)  # rank 0's values are kept; the others' are dropped
        print(f"step {step} loss {loss.item():.8f}", flush=True)
        time.sleep(args.step_delay)
        # The notice reaches each rank at its own step: agree on it, so that every rank saves the same step.
        stop = run.checkpoints.any_rank(run.should_stop)
        if stop or run.checkpoints.due(step):
            if not args.rank0_only_save or rank == 0:
                run.checkpoints.save(step, model=model.module, optimizer=optimizer, data_state={"step": step},
                                     metrics={"loss": loss.item()})
        if stop:
            run.exit_preempted()  # every rank: after the save is durable
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        raise SystemExit("run it under torchrun: torchrun --standalone --nproc_per_node=2 " + __file__)
    main()
