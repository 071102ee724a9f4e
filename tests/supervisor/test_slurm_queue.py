"""A job Slurm holds in its queue is `queued`, with Slurm's reason; one it will never start ends at once.

Real single-node Slurm (scripts/ensure-slurm.sh), real sbatch/squeue/scancel, the CLI in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from waiting import wait_for

PY = sys.executable
# `--begin` an hour from now: Slurm holds the job PENDING (BeginTime), as it would behind a busy queue.
LATER = ('[resources.lab]\nexecutor = "slurm"\npartition = "test"\ngpus_per_node = 2\n'
         'sbatch = ["--mem=1G", "--begin=now+3600"]\n')
# The partition `test` allows 1 h (MaxTime=01:00:00).
PARTITION = '[resources.lab]\nexecutor = "slurm"\npartition = "test"\ngpus_per_node = 2\nsbatch = ["--mem=1G"]\n'


def _in_squeue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True,
                         timeout=30).stdout
    return bool(out.strip()) and "CANCELLED" not in out


def test_a_job_slurm_holds_is_queued_with_its_reason_and_costs_nothing_once_cancelled(slurm_node, cli_sqlite):
    Path("trackway.toml").write_text(LATER)
    assert cli_sqlite("submit", "--detach", "--name", "later", "--resource", "lab", "--",
                      PY, "-c", "print('ran')").code == 0
    (run,) = cli_sqlite("runs", "--json").json()  # the listing's tick asks squeue
    assert run["state"] == "queued"
    (attempt,) = cli_sqlite("attempts", "later", "--json").json()
    assert attempt["state"] == "queued" and attempt["executor_job_id"]
    facts = cli_sqlite("explain", "later", "--json").json()
    said = facts["next_steps"]["trackway"]
    assert f"waits in slurm's queue (slurm job {attempt['executor_job_id']}: PENDING (BeginTime))" in said, said

    assert cli_sqlite("cancel", "later").code == 0
    wait_for(lambda: cli_sqlite("show", "later", "--json").json()["state"] == "cancelled", "the cancel to be recorded",
             interval=0.5)
    (ended,) = cli_sqlite("attempts", "later", "--json").json()
    assert ended["termination_reason"] == "user_cancelled"
    # It never ran: the hour it might have waited is no compute.
    assert ended["gpu_seconds"] == 0 and ended["cost_usd"] == 0
    assert not _in_squeue(attempt["executor_job_id"])


def test_a_job_slurm_will_never_start_ends_config_error_at_once(slurm_node, cli_sqlite, tmp_path, monkeypatch):
    # Submit refuses a run its partition can never take (the test below), when it can read the partition: here
    # `scontrol` fails while the run is submitted (a controller that did not answer it), so Slurm is the one to say.
    silent, real = tmp_path / "silent", shutil.which("scontrol")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\nif [ -e {silent} ]; then echo 'slurm_load_partitions: Socket "
                                      f"timed out on send/recv operation' >&2; exit 1; fi\nexec {real} \"$@\"\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    silent.touch()
    Path("trackway.toml").write_text(PARTITION)
    submitted = cli_sqlite("submit", "--detach", "--name", "too-long", "--resource", "lab", "--time-limit", "2", "--",
                           PY, "-c", "print('ran')")
    assert submitted.code == 0, submitted.err
    silent.unlink()

    def ended():
        (attempt,) = cli_sqlite("attempts", "too-long", "--json").json()  # the listing's tick asks squeue
        return attempt if attempt["state"] == "ended" else None

    attempt = wait_for(ended, "Slurm's PartitionTimeLimit to end the attempt", interval=0.5)
    evidence = attempt["termination_evidence"]
    assert (attempt["termination_reason"], evidence["rule"]) == ("config_error", "executor:config_error")
    said = " ".join(evidence["lines"])
    assert "Slurm will never start it (Partition" in said and "asks 120 min on 1 node(s)" in said
    assert "MaxTime 01:00:00" in said, said
    assert attempt["gpu_seconds"] == 0
    assert "stop" in attempt["retry_decision"]
    assert not _in_squeue(attempt["executor_job_id"])  # trackway cancelled it: it would have waited forever


def test_a_run_longer_than_the_partition_allows_is_refused_at_submit_naming_the_limit(slurm_node, cli_sqlite):
    Path("trackway.toml").write_text(PARTITION)
    queue = subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, timeout=30).stdout
    for asked in (["--resource", "lab"], []):  # by name, or chosen: refused the same, before anything is recorded
        refused = cli_sqlite("submit", "--name", "too-long", *asked, "--time-limit", "2", "--", PY, "-c", "pass")
        assert refused.code == 2
        (line,) = refused.err.strip().splitlines()
        assert line.endswith("lab: 2 h asked, partition test allows 1 h (MaxTime 01:00:00); --in-pieces runs it "
                             "in pieces"), line
    assert cli_sqlite("runs", "--json").json() == []
    assert subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, timeout=30).stdout == queue


# Checkpoints every 5 steps of 0.5 s; a stop notice (the time limit's SIGUSR1, Slurm's SIGTERM) checkpoints and exits.
STEPS = """
import os, time
import trackway
run = trackway.init()
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
print(f"attempt {os.environ['TRACKWAY_ATTEMPT_NUMBER']} from step {start}", flush=True)
for step in range(start, 300):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(0.5)
    if step % 5 == 4 or run.should_stop:
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
    if run.should_stop:
        run.exit_preempted()
run.finish()
"""
# A one-minute QoS tier (a QoS unknown to a cluster without accounting is accepted as it is).
MINUTE = ('[resources.lab]\nexecutor = "slurm"\npartition = "test"\ngpus_per_node = 2\ngrace_seconds = 10\n'
          'sbatch = ["--mem=1G"]\n[[resources.lab.qos]]\nname = "minute"\nmax_hours = 0.0166\n')


@pytest.mark.slow  # whole-minute Slurm limits: about 2.5 min of waiting (`make trials`)
def test_a_run_in_pieces_runs_each_on_the_longest_tier_and_resumes_from_its_checkpoint_to_the_end(slurm_node,
                                                                                                     cli_sqlite, home):
    Path("trackway.toml").write_text(MINUTE)
    Path("steps.py").write_text(STEPS)
    refused = cli_sqlite("submit", "--name", "whole", "--time-limit", "0.0996", "--", PY, "steps.py")
    assert refused.code == 2 and "its longest QoS (minute) allows 0.0166 h; --in-pieces" in refused.err

    done = cli_sqlite("submit", "--name", "long", "--time-limit", "0.0996", "--in-pieces", "--", PY, "steps.py")

    assert done.code == 0, done.err
    tried = cli_sqlite("attempts", "long", "--json").json()
    assert len(tried) >= 2 and tried[-1]["termination_reason"] == "completed"
    planned = 6  # 0.0996 h in pieces of 0.0166 h (a minute, less a fraction)
    for number, attempt in enumerate(tried, 1):
        # Each attempt's receipt says which piece it was, and the one Slurm job it was ran for at most the tier.
        said = json.dumps(attempt["selection"])
        assert f"piece {number} of {planned} (--in-pieces)" in said, said
        assert attempt["qos"] == "minute"
        run_id = attempt["attempt_id"].split("/")[0]
        script = home / "runs" / run_id / "attempts" / str(number) / "slurm.sbatch"
        assert "#SBATCH --time=1\n" in script.read_text()
    for number, attempt in enumerate(tried[:-1], 1):
        assert attempt["termination_reason"] == "timeout", attempt
        decision = json.loads(attempt["retry_decision"])
        assert decision["rule"] == f"timeout: in pieces, piece {number + 1} of {planned}"
        assert decision["message"].startswith(f"piece {number} of {planned} reached its 0.0166 h limit as planned")
    steps = [p["step"] for p in cli_sqlite("metrics", "long", "--key", "loss", "--json").json()]
    assert steps == list(range(300))  # resumed from each piece's checkpoint: no step lost, none twice
