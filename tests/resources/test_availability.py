"""Live availability read from a real Slurm controller and this machine; an unreachable cluster is a row, not a hang."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from trackway.resources.availability import availability, gres_gpus, look_up
from trackway.settings.resources import Resource


def test_a_slurm_partition_shows_its_gpus_and_jobs(slurm_node):
    test = Resource("cluster", "slurm", partition="test")
    before = availability(test)
    assert before.reachable, before.error
    assert before.total_gpus == 2  # the single node's two fake GPUs (scripts/ensure-slurm.sh)

    job = subprocess.run(["sbatch", "--parsable", "--partition=test", "--gres=gpu:1", "--time=2",
                          "--output=/dev/null", "--wrap=sleep 60"], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    try:
        # The GPU is taken from the moment Slurm allocates it; the job reads as pending (CONFIGURING) until its
        # node is ready, and sinfo and squeue are two calls: wait until both say it runs.
        deadline = time.monotonic() + 30
        while True:
            during = availability(test)
            if (during.free_gpus == before.free_gpus - 1 and during.running_jobs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert during.free_gpus == before.free_gpus - 1
        assert during.running_jobs >= 1
    finally:
        subprocess.run(["scancel", job_id], check=False)


def test_a_partition_that_does_not_exist_says_so(slurm_cluster):
    row = availability(Resource("typo", "slurm", partition="no-such-partition"))
    assert not row.reachable
    assert row.error == "sinfo lists no node in partition 'no-such-partition'"


def test_a_controller_that_does_not_answer_is_reported_within_the_timeout(tmp_path, monkeypatch):
    # A real sinfo that hangs: what a login node shows when slurmctld is down or the network is partitioned.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sinfo", "squeue"):
        (bin_dir / name).write_text("#!/bin/sh\nexec sleep 30\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    found = look_up([Resource("hung", "slurm", partition="x"), Resource("local", "local")], timeout_s=1.0)

    # Given up on after the 1 s timeout, not waited for (sleep 30).
    assert not found["hung"].reachable
    assert found["hung"].error == "sinfo did not answer within 1 s"
    assert found["local"].reachable  # the other resource is still listed


def test_no_slurm_client_is_said_in_words(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    row = availability(Resource("cluster", "slurm"))
    assert not row.reachable
    assert row.error == "sinfo not found: is the Slurm client installed here?"


@pytest.mark.parametrize("text, gpus", [
    ("gpu:2", 2), ("gpu:b200:8(S:0-1)", 8), ("gpu:(null):1(IDX:0)", 1), ("gpu:a100:2,gpu:h100:4", 6),
    ("(null)", 0), ("gpu:0", 0), ("gpu:tesla:0(IDX:N/A)", 0),
])
def test_gres_strings_as_slurm_prints_them(text, gpus):
    assert gres_gpus(text) == gpus


def test_trackway_resources_lists_each_with_what_it_can_take_now(slurm_cluster, tmp_path, cli_process, monkeypatch):
    (tmp_path / "trackway.toml").write_text(
        '[resources.cluster]\nexecutor = "slurm"\npartition = "test"\ngpu = "fake"\ncost_per_gpu_hour = 1.25\n'
        '[[resources.cluster.qos]]\nname = "normal"\nmax_hours = 24\n'
        '[resources.gone]\nexecutor = "slurm"\npartition = "retired"\n'
        '[resources.desk]\nexecutor = "local"\nuse_for = ["test"]\n'
    )
    monkeypatch.chdir(tmp_path)

    listed = cli_process("resources", "--json")

    assert listed.code == 0, listed.err
    rows = {row["resource"]: row for row in listed.json()}
    assert list(rows) == ["cluster", "gone", "desk"]  # as trackway.toml declares them
    assert rows["cluster"]["reachable"] and rows["cluster"]["total_gpus"] == 2
    assert rows["cluster"]["qos"] == [{"name": "normal", "max_hours": 24.0}]
    # The partition's own limits (scontrol show partition): test runs nothing past an hour, on its one node.
    assert (rows["cluster"]["partition_max_time"], rows["cluster"]["partition_max_nodes"]) == ("01:00:00", 1)
    assert rows["cluster"]["lookup_ms"] > 0
    assert rows["gone"]["reachable"] is False
    assert rows["gone"]["error"] == "sinfo lists no node in partition 'retired'"
    assert rows["desk"]["use_for"] == ["test"]

    monkeypatch.setenv("COLUMNS", "200")
    shown = cli_process("resources")
    assert shown.code == 0
    assert "unreachable" in shown.out and "normal≤24h" in shown.out
    assert "gone: sinfo lists no node in partition 'retired'" in shown.err
