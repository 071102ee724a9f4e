"""A Slurm job over several nodes: the batch script's rendezvous, each node's task, where each one ran.

The batch step exports what `torchrun --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR
--master_port=$MASTER_PORT` reads (rendezvous_lines); its shim runs `srun`, one task a node, each
setting its NODE_RANK and writing node-RANK.json before the command (node_command); the placement
lists every node from those files (node_placements).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from trackway.executors.base import LaunchRequest
from trackway.executors.local_shim import read_json


def rendezvous_lines(request: LaunchRequest) -> list[str]:
    """Over several nodes: the variables `torchrun --nnodes=$NNODES --node_rank=$NODE_RANK
    --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT` reads, the same on every node but NODE_RANK
    (set per task by node_command)."""
    if request.nodes <= 1:
        return []
    log_q = shlex.quote(str(request.log_path))
    # A port of the job's own (20000-29999, below the ephemeral range), unless the run chose one.
    port = ('export MASTER_PORT=${MASTER_PORT:?}' if "MASTER_PORT" in request.env
            else 'export MASTER_PORT=$((20000 + ${SLURM_JOB_ID:-0} % 10000))')
    return [
        "",
        f"# A run over {request.nodes} nodes: srun starts one task per node (--ntasks-per-node=1) and the",
        "# command on each sees the same rendezvous; NODE_RANK is the task's (= SLURM_NODEID, one task a node).",
        f"export NNODES=${{SLURM_NTASKS:-{request.nodes}}}",
        "export WORLD_SIZE=$NNODES  # one process per node without torchrun; torchrun sets its own",
        "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "[ -n \"$MASTER_ADDR\" ] || {",
        f"  mkdir -p {shlex.quote(str(Path(request.log_path).parent))}",
        "  printf '%s err trackway: scontrol show hostnames %s named no first node for MASTER_ADDR\\n' \\",
        f"    \"$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)\" \"$SLURM_JOB_NODELIST\" >>{log_q}",
        "  exit 1",
        "}",
        "export MASTER_ADDR",
        port,
    ]


# Each task, before the command: its NODE_RANK (RANK for one process a node), and where it runs,
# written beside the attempt's other files so that the placement lists every node with its GPUs.
_NODE_PROLOGUE = """\
export NODE_RANK="$SLURM_PROCID" RANK="$SLURM_PROCID" LOCAL_RANK=0
trackway_node=${{SLURMD_NODENAME:-$(hostname)}}
printf '{{"node_rank": %s, "slurm_nodeid": %s, "host": "%s", "cuda_visible_devices": "%s"}}\\n' \\
  "$NODE_RANK" "${{SLURM_NODEID:-null}}" "$trackway_node" "${{CUDA_VISIBLE_DEVICES-}}" \\
  >{state}/.node-"$NODE_RANK".json.tmp && mv -f {state}/.node-"$NODE_RANK".json.tmp {state}/node-"$NODE_RANK".json
unset trackway_node
exec "$@"
"""


def node_command(request: LaunchRequest) -> list[str]:
    """What the batch step's shim runs over several nodes: srun, one task per node, each running the command.

    srun takes its task count from the job (--nodes, --ntasks-per-node=1); --kill-on-bad-exit ends
    every task once one fails, so a lost node ends the whole attempt, and srun's own line
    (`srun: error: NODE: task 1: Exited with exit code 3`) names the node in output.log.
    """
    prologue = _NODE_PROLOGUE.format(state=shlex.quote(str(request.state_dir)))
    return ["srun", "--kill-on-bad-exit=1", "bash", "-c", prologue, "trackway-node", *request.command]


# srun's own line when a task ends badly: `srun: error: node3: task 1: Exited with exit code 3`
# (`tasks 0-1:` when several ended alike). Tasks it ends itself afterwards say `Terminated` or `Killed`.
_TASK_EXITED = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): Exited with exit code (?P<code>\d+)")


@dataclass(frozen=True)
class FailedTask:
    """The first task srun saw exit non-zero: the node's failure, before --kill-on-bad-exit ended the rest."""

    node: str
    tasks: str
    exit_code: int

    def line(self, srun_exit_code: int | None) -> str:
        return (f"node {self.node} (task {self.tasks}) failed first, with exit code {self.exit_code}; srun then ended "
                f"the other tasks, and its own exit code ({srun_exit_code}) counts those it ended")


def first_failed_task(log_lines: list[str]) -> FailedTask | None:
    """The first task that exited non-zero by itself, from srun's lines in the attempt's log (None if none said so).

    srun exits with the highest code of all its tasks, so once --kill-on-bad-exit has ended the others
    with SIGTERM, a node's `exit 3` comes back as 143 unless they had all finished first: srun's first
    `Exited with exit code` line is the failure itself.
    """
    for line in log_lines:
        match = _TASK_EXITED.search(line)
        if match and int(match["code"]) != 0:
            return FailedTask(match["node"], match["tasks"], int(match["code"]))
    return None


def node_placements(state_dir: Path) -> list[dict]:
    """Every node's task as it said where it runs (node_command's node-RANK.json), by node rank."""
    nodes = []
    for path in state_dir.glob("node-*.json"):
        try:
            said = read_json(path)
        except ValueError:
            continue  # written by rename: a torn file is not ours
        if not isinstance(said, dict) or not isinstance(said.get("node_rank"), int):
            continue
        visible = str(said.get("cuda_visible_devices") or "")
        gpu_ids = [int(part) for part in visible.split(",") if part.strip().isdigit()]
        nodes.append({"node_rank": said["node_rank"], "host": said.get("host"), "gpu_ids": gpu_ids,
                      **({"cuda_visible_devices": visible} if visible else {})})
    return sorted(nodes, key=lambda node: node["node_rank"])
