"""A run over several nodes on the real single-node Slurm: one task per node through srun, with the rendezvous.

The cluster here has one node. The job is rendered for two nodes exactly as for a real cluster;
only at sbatch the node count is folded onto this one node: a wrapper in front of the real sbatch
adds `--nodes=1 --ntasks-per-node=2` on its command line, which wins over the script's #SBATCH
lines, so srun (which takes its task count from the job) starts two tasks here where a cluster
would start one on each of two nodes. Everything else (srun, scontrol, the tasks, gloo) is real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from trackway.executors.slurm import render_script
from trackway.settings.resources import Resource

from .conftest import log_lines, wait_for
from .test_slurm import slurm, wait_ended  # noqa: F401  (the fixture)

JOB_DEADLINE_S = 120.0  # two torch imports and a gloo rendezvous on a loaded 2-core machine
# The cluster gives a job 256 MB a CPU unless asked: too little for torch processes (OverMemoryKill).
LAB = Resource(name="lab", executor="slurm", nodes=2, sbatch=("--mem=3G",))

# One process per node, world size 2, using only the variables trackway set.
GLOO_RANK = """
import os, sys
import torch
import torch.distributed as dist
names = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "RANK", "WORLD_SIZE")
print("env " + " ".join(f"{name}={os.environ.get(name)}" for name in names), flush=True)
dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["NODE_RANK"]),
                        world_size=int(os.environ["NNODES"]))
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank} of {dist.get_world_size()}: sum {value.item():g}", flush=True)
dist.destroy_process_group()
if os.environ.get("LINGER_ON_RANK") == str(rank):
    import time
    time.sleep(60)  # still running when another task fails: srun ends it
sys.exit(3 if os.environ.get("FAIL_ON_RANK") == str(rank) else 0)
"""


def fold_nodes_onto_this_one(tmp_path: Path, monkeypatch) -> Path:
    """The real sbatch, with two tasks on this node for the two nodes the script asks for; returns its call log."""
    bin_dir = tmp_path / "fold-bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls.log"
    real = shutil.which("sbatch")
    assert real
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(f'#!/bin/sh\necho "sbatch $*" >> {calls}\n'
                       f'exec {real} --nodes=1 --ntasks-per-node=2 "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def two_node_request(make_request, tmp_path: Path, env: dict[str, str] | None = None):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(GLOO_RANK))
    return make_request([sys.executable, str(script)], resource=LAB, nodes=2, env=env or {})


def test_two_nodes_run_one_gloo_job_as_one_attempt(slurm, make_request, tmp_path, monkeypatch):  # noqa: F811
    calls = fold_nodes_onto_this_one(tmp_path, monkeypatch)
    request = two_node_request(make_request, tmp_path)

    sub = slurm.submit(request)
    status = wait_ended(slurm, sub.handle, timeout=JOB_DEADLINE_S)

    script = (request.state_dir / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
    assert len(calls.read_text().splitlines()) == 1
    out = [text for _, tag, text in log_lines(request.log_path) if tag == "out"]
    assert (status.exit_code, status.signal, status.reason) == (0, None, None), (status, out)
    # Both tasks ran, each one process of the one world of two, with the same rendezvous.
    assert sorted(line for line in out if line.startswith("rank ")) == ["rank 0 of 2: sum 3", "rank 1 of 2: sum 3"]
    envs = sorted(line for line in out if line.startswith("env "))
    port = 20000 + int(sub.handle.job_id) % 10000
    assert envs == [f"env MASTER_ADDR=vm MASTER_PORT={port} NODE_RANK={rank} NNODES=2 RANK={rank} WORLD_SIZE=2"
                    .replace("vm", os.uname().nodename.split(".")[0]) for rank in (0, 1)]
    # The placement lists every node's task with where it ran.
    nodes = status.placement["nodes"]
    assert [(node["node_rank"], node["host"]) for node in nodes] == [(0, os.uname().nodename.split(".")[0]),
                                                                     (1, os.uname().nodename.split(".")[0])]


def test_one_node_failing_ends_the_attempt_with_the_node_named(slurm, make_request, tmp_path, monkeypatch):  # noqa: F811
    fold_nodes_onto_this_one(tmp_path, monkeypatch)
    # Rank 0 is still running when rank 1 fails, so srun ends it with SIGTERM and exits 143 itself.
    request = two_node_request(make_request, tmp_path, env={"FAIL_ON_RANK": "1", "LINGER_ON_RANK": "0"})

    sub = slurm.submit(request)
    status = wait_ended(slurm, sub.handle, timeout=JOB_DEADLINE_S)

    lines = [text for _, _, text in log_lines(request.log_path)]
    node = os.uname().nodename.split(".")[0]
    assert any(f"srun: error: {node}: task 1: Exited with exit code 3" in line for line in lines), lines
    # The attempt's exit code is the failing node's, not srun's count of the task it ended after it.
    assert (status.exit_code, status.signal) == (3, None), (status, lines)
    assert any(line.startswith(f"node {node} (task 1) failed first, with exit code 3; srun then ended")
               for line in status.evidence), status.evidence


def test_render_two_nodes_has_srun_and_the_rendezvous(make_request, tmp_path):
    request = two_node_request(make_request, tmp_path)

    script = render_script(request)

    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert "export MASTER_PORT=$((20000 + ${SLURM_JOB_ID:-0} % 10000))" in script
    chosen = render_script(two_node_request(make_request, tmp_path, env={"MASTER_PORT": "29400"}))
    assert "export MASTER_PORT=29400\n" in chosen and "SLURM_JOB_ID:-0" not in chosen
    single = render_script(make_request(["true"], resource=Resource(name="lab", executor="slurm", nodes=2)))
    assert "#SBATCH --nodes=1\n" in single and "MASTER_ADDR" not in single and "--ntasks-per-node" not in single


TORCHRUN_WORKER = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_* as torchrun set them
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"torchrun rank {rank} of {dist.get_world_size()} (group rank {os.environ['GROUP_RANK']}): sum {value.item():g}",
      flush=True)
dist.destroy_process_group()
"""


def test_torchrun_over_two_nodes_works_as_written(slurm, make_request, tmp_path, monkeypatch):  # noqa: F811
    fold_nodes_onto_this_one(tmp_path, monkeypatch)
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(TORCHRUN_WORKER))
    # The line people write in their sbatch scripts, as it is: trackway's variables fill it in.
    line = (f"exec {sys.executable} -m torch.distributed.run --nnodes=$NNODES --node_rank=$NODE_RANK "
            f"--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT --nproc_per_node=1 {worker}")
    request = make_request(["bash", "-c", line], resource=LAB, nodes=2)

    sub = slurm.submit(request)
    status = wait_ended(slurm, sub.handle, timeout=JOB_DEADLINE_S)

    out = [text for _, tag, text in log_lines(request.log_path) if tag == "out"]
    assert status.exit_code == 0, (status, [text for _, _, text in log_lines(request.log_path)])
    assert sorted(line for line in out if line.startswith("torchrun ")) == [
        "torchrun rank 0 of 2 (group rank 0): sum 3", "torchrun rank 1 of 2 (group rank 1): sum 3"]


NOTICE_TRAP = """
import os, signal, sys, time
rank = os.environ["NODE_RANK"]
def on(signum, frame):
    print("notice", rank, signal.Signals(signum).name, flush=True)
    if signum == signal.SIGTERM:
        sys.exit(75)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGTERM, on)
print("up", rank, flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_notice_reaches_every_node_and_cancel_ends_them_all(slurm, make_request, tmp_path, monkeypatch):  # noqa: F811
    fold_nodes_onto_this_one(tmp_path, monkeypatch)
    request = make_request([sys.executable, "-c", NOTICE_TRAP], resource=LAB, nodes=2)
    sub = slurm.submit(request)

    def said(*lines):
        return request.log_path.exists() and all(
            line in [text for _, _, text in log_lines(request.log_path)] for line in lines)

    wait_for(lambda: said("up 0", "up 1"), "both nodes up", JOB_DEADLINE_S, 0.2)
    # Slurm's notice before a time limit or a preemption reaches the batch step (the shim) only.
    subprocess.run(["scancel", "--signal=USR1", "--batch", sub.handle.job_id], check=True, timeout=30)
    wait_for(lambda: said("notice 0 SIGUSR1", "notice 1 SIGUSR1"), "the notice on both nodes", 30, 0.2)
    slurm.cancel(sub.handle)
    status = wait_ended(slurm, sub.handle, timeout=JOB_DEADLINE_S)

    assert status.cancelled and status.exit_code == 75, status
    assert said("notice 0 SIGTERM", "notice 1 SIGTERM")
