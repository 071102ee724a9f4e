"""A one-process torchrun on a port another process holds; when it fails, that other process ends.

Usage: port_held.py PORT HOLDER_PID_FILE. The first attempt meets the port taken (torch's
`EADDRINUSE`) and then, as a neighbouring job would, the holder goes away: a retry finds it free.
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

port, holder = sys.argv[1], Path(sys.argv[2])
worker = Path("rank.py")
worker.write_text(textwrap.dedent("""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} joined", flush=True)
    dist.destroy_process_group()
"""))
torchrun = str(Path(sys.executable).parent / "torchrun")
code = subprocess.call([torchrun, "--nnodes=1", "--nproc_per_node=1", f"--master_port={port}", str(worker)])
if code != 0 and holder.exists():
    os.kill(int(holder.read_text()), signal.SIGTERM)
    holder.unlink()
sys.exit(code)
