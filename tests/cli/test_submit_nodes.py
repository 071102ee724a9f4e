"""`submit --nodes N`: a run over several nodes, refused as bad input where no resource has that many.

The end-to-end case runs on the real single-node Slurm: a wrapper in front of the real sbatch folds
the script's two nodes onto this one node (`--nodes=1 --ntasks-per-node=2` on sbatch's command line
wins over the #SBATCH lines), so srun starts two tasks where a cluster would start one a node; and
one in front of scontrol says the partition has the two nodes (submit checks a run's nodes against it).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path


PY = sys.executable
TOML = """
[resources.lab]
executor = "slurm"
nodes = 2
gpus_per_node = 2
sbatch = ["--mem=3G"]   # torch processes need more than the cluster's 256 MB a CPU

[resources.box]
executor = "local"
"""


def _counts(cli) -> dict:
    (row,) = cli("sql", "select (select count(*) from runs) as runs, (select count(*) from attempts) as attempts",
                 "--json").json()
    return row


def _refused(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_nodes_beyond_what_a_resource_has_are_refused_and_nothing_recorded(cli):
    Path("trackway.toml").write_text(TOML)
    before = _counts(cli)

    _refused(cli("submit", "--nodes", "0", "--", PY, "-c", "pass"), "--nodes 0", "expected a whole number from 1")
    _refused(cli("submit", "--resource", "lab", "--nodes", "3", "--", PY, "-c", "pass"),
             "--nodes 3: expected 1 to 2", "resource 'lab' declares nodes = 2")
    _refused(cli("submit", "--resource", "box", "--nodes", "2", "--", PY, "-c", "pass"),
             "--nodes 2: expected 1 to 1", "resource 'box' is one machine")
    _refused(cli("submit", "--nodes", "3", "--", PY, "-c", "pass"), "--nodes 3: expected 1 to 2", "'lab'")
    # More GPUs than the nodes asked for hold: said with the way out.
    _refused(cli("submit", "--resource", "lab", "--gpus", "4", "--", PY, "-c", "pass"),
             "4 GPU(s) asked on 1 node(s) of 2 GPU(s)", "--nodes")

    assert _counts(cli) == before


def test_nodes_on_this_machine_without_resources_is_refused(cli):
    _refused(cli("submit", "--nodes", "2", "--", PY, "-c", "pass"), "--nodes 2: expected 1 to 1", "one machine")
    assert _counts(cli)["runs"] == 0


RANK = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE as trackway set them
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"node {os.environ['NODE_RANK']} of {os.environ['NNODES']}: sum {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_run_over_two_nodes_is_one_attempt_placed_on_both(cli_sqlite, slurm_node, tmp_path, monkeypatch):
    cli = cli_sqlite
    Path("trackway.toml").write_text(TOML)
    Path("rank.py").write_text(textwrap.dedent(RANK))
    bin_dir = tmp_path / "fold-bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nexec {shutil.which("sbatch")} --nodes=1 --ntasks-per-node=2 "$@"\n')
    (bin_dir / "sbatch").chmod(0o755)
    # The partition, as submit reads it, has the two nodes the folded job stands for (it checks MaxNodes/TotalNodes).
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\n{shutil.which("scontrol")} "$@" | sed "s/TotalNodes=1 /TotalNodes=2 /"\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    result = cli("submit", "--name", "two", "--resource", "lab", "--nodes", "2", "--time-limit", "0.1",
                 "--", PY, "rank.py")

    assert result.code == 0, result.err
    (run,) = cli("sql", "select nodes, state from runs", "--json").json()
    assert run == {"nodes": 2, "state": "completed"}
    attempts = cli("sql", "select attempt_number, exit_code from attempts", "--json").json()
    assert attempts == [{"attempt_number": 1, "exit_code": 0}]
    logs = cli("logs", "two").out
    assert "node 0 of 2: sum 3" in logs and "node 1 of 2: sum 3" in logs
    explained = cli("explain", "two").out
    host = os.uname().nodename.split(".")[0]
    assert f"    node 0: {host}, GPUs none\n    node 1: {host}, GPUs none\n" in explained, explained
    assert "lab (slurm), gpus 0 over 2 nodes" in cli("show", "two").out
    assert cli("show", "two", "--json").json()["nodes"] == 2
    placed = cli("explain", "two", "--json").json()
    nodes = placed["placement"]["scheduler"]["nodes"]
    assert [(node["node_rank"], node["host"]) for node in nodes] == [(0, host), (1, host)]


def test_a_run_over_two_ssh_hosts_is_one_attempt_placed_on_both(cli_sqlite, netns_hosts, tmp_path):
    cli = cli_sqlite
    first, second = netns_hosts("a"), netns_hosts("b")
    Path("trackway.toml").write_text(textwrap.dedent(f"""
        [resources.pods]
        executor = "ssh"
        hosts = ["{first.spec}", "{second.spec}"]
        key_file = "{first.key}"
        workdir = "{tmp_path / 'on-host' / '{host}'}"
        ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    """))
    Path("node.py").write_text("import os\nprint('node', os.environ['NODE_RANK'], 'of', os.environ['NNODES'], "
                               "'master', os.environ['MASTER_ADDR'])\n")

    result = cli("submit", "--name", "gang", "--resource", "pods", "--nodes", "2", "--", PY, "node.py")

    assert result.code == 0, result.err
    (run,) = cli("sql", "select nodes, state from runs", "--json").json()
    assert run == {"nodes": 2, "state": "completed"}
    assert cli("sql", "select count(*) as n from attempts", "--json").json() == [{"n": 1}]
    assert f"node 0 of 2 master {first.address}" in cli("logs", "gang").out
    explained = cli("explain", "gang").out
    assert f"    node 0: {first.spec}, GPUs none\n    node 1: {second.spec}, GPUs none\n" in explained, explained
