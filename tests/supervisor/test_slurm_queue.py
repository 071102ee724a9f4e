"""A job Slurm holds in its queue is `queued`, with Slurm's reason; one it will never start ends at once.

Real single-node Slurm (scripts/ensure-slurm.sh), real sbatch/squeue/scancel, the CLI in this process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_job_slurm_will_never_start_ends_config_error_at_once(slurm_node, cli_sqlite):
    Path("trackway.toml").write_text(PARTITION)
    submitted = cli_sqlite("submit", "--name", "too-long", "--resource", "lab", "--time-limit", "2", "--",
                           PY, "-c", "print('ran')")
    assert submitted.code == 1, submitted.err
    (attempt,) = cli_sqlite("attempts", "too-long", "--json").json()
    evidence = attempt["termination_evidence"]
    assert (attempt["termination_reason"], evidence["rule"]) == ("config_error", "executor:config_error")
    said = " ".join(evidence["lines"])
    assert "Slurm will never start it (Partition" in said and "asks 120 min on 1 node(s)" in said
    assert "MaxTime 01:00:00" in said, said
    assert attempt["gpu_seconds"] == 0
    assert "stop" in attempt["retry_decision"]
    assert not _in_squeue(attempt["executor_job_id"])  # trackway cancelled it: it would have waited forever
