"""Infra transient under torchrun: rank 1 of two (gloo, CPU) is SIGKILLed mid-run on the first attempt.

Run as the command itself, it launches `torchrun --nproc_per_node=2` on this same file. The
surviving rank meets a dead peer (a gloo error, or the agent's SIGTERM) and torchrun's summary
names rank 1, `Signal 9 (SIGKILL)`, as the first failure: trackway must read that, not the survivor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def launch() -> int:
    with socket.socket() as s:  # a free port for the rendezvous: tests run side by side
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", __file__]
    return subprocess.call(command)


def worker() -> None:
    import torch
    import torch.distributed as dist

    import trackway

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = trackway.init()
    first = os.environ.get("TRACKWAY_ATTEMPT_NUMBER", "1") == "1"
    total = torch.ones(4)
    for step in range(12):
        dist.all_reduce(total)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        if first and rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    dist.barrier()
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:
        worker()
    else:
        sys.exit(launch())
