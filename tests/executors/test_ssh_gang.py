"""One attempt over two SSH hosts (a gang): the rendezvous on every node, all or none, a lost node ends it as one.

Real sshd hosts in network namespaces (tests/ssh_hosts.py). The gloo case puts two hosts (two
sshds, two ports) in one namespace: namespaces here do not route to one another (no IP forwarding
on this machine), and gloo's ranks must reach each other; the other cases use a namespace each.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from trackway.errors import ExecutorError
from trackway.executors.base import JobPhase, LaunchRequest
from trackway.executors.code_snapshot import build_snapshot
from trackway.executors.ssh import SshExecutor
from trackway.settings.resources import Resource
from ssh_hosts import SshHost

from .conftest import wait_for, wait_terminal

NO_HOST_KEYS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")
DEADLINE_S = 120.0

GLOO_NODE = """
import os
import torch
import torch.distributed as dist
names = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "RANK", "WORLD_SIZE")
print("env " + " ".join(f"{name}={os.environ.get(name)}" for name in names), flush=True)
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE as trackway set them
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank} of {dist.get_world_size()}: sum {value.item():g}", flush=True)
dist.destroy_process_group()
"""

SLEEPER = """
import os, time
print("node", os.environ["NODE_RANK"], "up", flush=True)
time.sleep(300)
"""


def gang_resource(tmp_path: Path, *hosts: SshHost, **kwargs) -> Resource:
    return Resource(name="pods", executor="ssh", hosts=tuple(h.spec for h in hosts), key_file=str(hosts[0].key),
                    workdir=str(tmp_path / "on-host" / "{host}"), ssh_options=NO_HOST_KEYS, **kwargs)


def launch(tmp_path: Path, res: Resource, script: str, nodes: int = 2) -> tuple[SshExecutor, LaunchRequest]:
    work = tmp_path / "project"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(textwrap.dedent(script))
    state = tmp_path / "state" / "run1-1"
    request = LaunchRequest(attempt_id="run1/1", command=[sys.executable, "job.py"], cwd=work,
                            env={"TRACKWAY_RUN_ID": "run1"}, state_dir=state, log_path=state / "output.log",
                            resource=res, nodes=nodes, code=build_snapshot(work, None, None))
    return SshExecutor(tmp_path / "home"), request


def out(path: Path) -> list[str]:
    return [line.split(" ", 2)[2] for line in path.read_text().splitlines() if line.split(" ", 2)[1:2] == ["out"]]


def test_two_hosts_run_one_gloo_job_as_one_attempt(tmp_path, netns_hosts):
    first = netns_hosts("a")
    # A second sshd in the first host's namespace, on its own port: a second host both ranks can reach.
    second = SshHost("a2", tmp_path / "host-a2", first.key, netns=first.netns, address=first.address)
    second.port = 2222
    second.start()
    try:
        executor, request = launch(tmp_path, gang_resource(tmp_path, first, second), GLOO_NODE)
        submission = executor.submit(request)
        status = wait_terminal(executor, submission.handle, DEADLINE_S)
    finally:
        second.close()

    node1_log = request.state_dir / "nodes" / "1" / "output.log"
    assert (status.phase, status.exit_code, status.reason) == (JobPhase.ENDED, 0, None), status
    assert submission.handle.job_id.startswith("gang:") and submission.host == first.spec
    lines = out(request.log_path) + out(node1_log)
    assert sorted(line for line in lines if line.startswith("rank ")) == ["rank 0 of 2: sum 3", "rank 1 of 2: sum 3"]
    port = status.placement["master_port"]
    assert sorted(line for line in lines if line.startswith("env ")) == [
        f"env MASTER_ADDR={first.address} MASTER_PORT={port} NODE_RANK={rank} NNODES=2 RANK={rank} WORLD_SIZE=2"
        for rank in (0, 1)]
    assert [(n["node_rank"], n["host"]) for n in status.placement["nodes"]] == [(0, first.spec), (1, second.spec)]
    assert status.evidence[0] == "all 2 nodes ended"


def test_a_host_that_cannot_start_stops_the_others_and_is_named(tmp_path, netns_hosts):
    first, second = netns_hosts("a"), netns_hosts("b")
    second.stop_sshd()
    executor, request = launch(tmp_path, gang_resource(tmp_path, first, second), SLEEPER)

    with pytest.raises(ExecutorError) as refused:
        executor.submit(request)

    message = str(refused.value)
    assert "all or none" in message and f"node 1 on {second.spec} did not start" in message, message
    assert f"stopped node 0 on {first.spec}" in message, message
    # The node that had started was stopped and its end kept, before the launch said it failed.
    stopped = json.loads((request.state_dir / "nodes" / "0" / "ssh-final.json").read_text())
    assert stopped["phase"] == "ended" and stopped["cancelled"] is True, stopped
    left = first.running("job.py")
    assert left == []


def test_a_lost_node_ends_the_gang_as_one_attempt_naming_it(tmp_path, netns_hosts):
    first, second = netns_hosts("a"), netns_hosts("b")
    res = gang_resource(tmp_path, first, second, preemptible=True, unreachable_seconds=2)
    executor, request = launch(tmp_path, res, SLEEPER)
    submission = executor.submit(request)
    node1_log = request.state_dir / "nodes" / "1" / "output.log"

    def both_up() -> bool:
        executor.poll(submission.handle)  # a poll is what brings the hosts' output here
        return (node1_log.exists() and "node 1 up" in node1_log.read_text()
                and request.log_path.exists() and "node 0 up" in request.log_path.read_text())

    wait_for(both_up, "both nodes up", DEADLINE_S, 0.2)

    second.reclaim()  # a spot pod taken back: every process in its namespace killed, sshd with them
    status = wait_terminal(executor, submission.handle, DEADLINE_S)

    assert status.phase is JobPhase.VANISHED and status.reason == "preempted", status
    assert status.evidence[0].startswith(f"the gang of 2 nodes ended with node 1 on {second.spec}:"), status.evidence
    assert any(line.startswith(f"node 0 on {first.spec}: ") for line in status.evidence)
    left = first.running("job.py")
    assert left == []  # the surviving node was stopped before the end was told
    assert executor.poll(submission.handle) == status
