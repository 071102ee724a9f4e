"""Two ranks (under torchrun) making checkpoint calls right and wrong: `collective_calls.py ROOT MODE`.

restore-rank0-only: rank 0 alone calls restore_latest(), rank 1 goes on to the training's own all_reduce.
mismatch:           rank 0 calls save(5), rank 1 latest().
skew:               both save(5), rank 1 arriving 2 s late; then 20 any_rank() calls, rank 1's flag true at
                    the 12th; then a writing() whose block takes rank 1 longer than the timeout.
Prints `ok RANK STOPPED_AT` at the end of a run that went through.
"""

import sys
import time

import torch
import torch.distributed as dist

from trackway.checkpoints.manager import CheckpointManager

root, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
manager = CheckpointManager(root, async_save=False)
model = torch.nn.Linear(2, 2)
if mode == "restore-rank0-only":
    if rank == 0:
        manager.restore_latest(model=model)
    for _ in range(100):
        dist.all_reduce(torch.ones(1))
elif mode == "mismatch":
    if rank == 0:
        manager.save(5, model=model)
    else:
        manager.latest()
elif mode == "skew":
    time.sleep(2 * rank)
    manager.save(5, model=model)
    stopped = None
    for i in range(20):
        if manager.any_rank(i == 12 and rank == 1):
            stopped = i
            break
    with manager.writing(6) as directory:
        time.sleep(5 * rank)  # a long write: only the entry is time-limited
        (directory / f"rank{rank}.txt").write_text("written\n")
    # One write of the whole line: two ranks share this stdout, and with PYTHONUNBUFFERED print() writes
    # the text and its newline apart, so their lines could interleave ("ok 0 12ok 1 12").
    sys.stdout.write(f"ok {rank} {stopped}\n")
    sys.stdout.flush()
