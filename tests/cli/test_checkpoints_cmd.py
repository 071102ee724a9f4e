"""`trackway checkpoints`, `gc`, `metrics` and `resume` over real runs that checkpoint and fail."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PY = sys.executable
SCRIPT = str(Path(__file__).parent / "scripts" / "neutral.py")


def test_checkpoints_lineage_retention_and_metrics(cli):
    result = cli("submit", "--name", "ck", "--", PY, SCRIPT, "55")
    assert result.code == 0, result.err
    held = cli("checkpoints", "ck", "--json").json()
    assert [c["step"] for c in held] == [10, 20, 30, 40, 50]
    assert all(c["state"] == "committed" for c in held)
    assert [c["parent"] for c in held] == [None, "step-00000010", "step-00000020", "step-00000030", "step-00000040"]
    mirrored = cli("sql", "select step, state from checkpoints order by step", "--json").json()
    assert mirrored == [{"step": s, "state": "committed"} for s in (10, 20, 30, 40, 50)]

    sizes = {c["step"]: c["size_bytes"] for c in held}
    dry = cli("gc", "ck", "--dry-run", "--keep-last", "2")
    assert dry.code == 0 and "would delete 10, 20, 30" in dry.out
    assert f"{sizes[10] + sizes[20] + sizes[30]:,} bytes" in dry.out
    assert [c["state"] for c in cli("checkpoints", "ck", "--json").json()] == ["committed"] * 5

    # One pass frees the disk and says how much.
    collected = cli("gc", "ck", "--keep-last", "2", "--keep-every", "20")
    assert collected.code == 0, collected.err
    assert "deleted 10, 30, freed" in collected.out and f"{sizes[10] + sizes[30]:,} bytes" in collected.out
    states = {c["step"]: c["state"] for c in cli("checkpoints", "ck", "--json").json()}
    assert states[40] == states[50] == "committed" and states[20] == "committed"  # last 2, every 20
    assert 10 not in states and 30 not in states
    gone = cli("sql", "select step from checkpoints where state = 'deleted' order by step", "--json").json()
    assert [row["step"] for row in gone] == [10, 30]

    points = cli("metrics", "ck", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(55))
    assert "loss" in cli("metrics", "ck").out


def test_keep_last_below_two_is_refused(cli):
    assert cli("submit", "--name", "ck2", "--", PY, SCRIPT, "25").code == 0
    refused = cli("gc", "ck2", "--keep-last", "1")
    assert refused.code == 2 and "keep_last" in refused.err


def test_resume_continues_from_the_last_committed_checkpoint(cli):
    failed = cli("submit", "--name", "flaky", "--", PY, SCRIPT, "40", "--fail-at", "25")
    assert failed.code == 1
    resumed = cli("resume", "flaky")
    assert resumed.code == 0, resumed.err
    assert "resuming from step-00000020" in resumed.err
    first, second = cli("attempts", "flaky", "--json").json()
    assert first["termination_reason"] == "code_error" and second["termination_reason"] == "completed"
    assert second["resumed_from_checkpoint"] == "step-00000020"
    assert (second["first_step"], second["last_step"]) == (21, 39)
    points = cli("metrics", "flaky", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(40))  # continuous: no restart at 0, no duplicates
    assert {p["attempt_number"] for p in points if p["step"] >= 21} == {2}
    again = cli("resume", "flaky")
    assert again.code == 2 and "is completed" in again.err


def test_an_ssh_runs_checkpoints_are_read_from_its_host_and_never_marked_deleted(cli_sqlite, loopback_host):
    Path("trackway.toml").write_text(
        f'[resources.box]\nexecutor = "ssh"\nhosts = ["{loopback_host.spec}"]\nkey_file = "{loopback_host.key}"\n'
        f'workdir = "{loopback_host.work}"\npython = "{PY}"\n'
        'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n')
    Path("neutral.py").write_text(Path(SCRIPT).read_text())
    done = cli_sqlite("submit", "--name", "far", "--", PY, "neutral.py", "25")
    assert done.code == 0, done.err
    # The host holds another trackway's agent (or none any more): this one's is sent to read the store.
    shutil.rmtree(loopback_host.work / ".trackway")

    held = cli_sqlite("checkpoints", "far", "--json").json()

    assert [(c["step"], c["state"]) for c in held] == [(10, "committed"), (20, "committed")]
    run_id = cli_sqlite("show", "far", "--json").json()["run_id"]
    on_host = loopback_host.work / "runs" / run_id / "checkpoints"
    assert held[1]["path"] == f"{loopback_host.spec}:{on_host / 'step-00000020'}"
    assert held[1]["parent"] == "step-00000010" and held[1]["size_bytes"] > 0
    mirrored = cli_sqlite("sql", "select step, state from checkpoints order by step", "--json").json()
    assert mirrored == [{"step": 10, "state": "committed"}, {"step": 20, "state": "committed"}]
    newest = cli_sqlite("explain", "far", "--json").json()["checkpoints"]["newest_of_run"]
    assert newest["name"] == "step-00000020"

    # A host that cannot be reached says so, and the ledger's rows stand: unseen is not deleted.
    loopback_host.stop_sshd()
    unreachable = cli_sqlite("checkpoints", "far")
    assert unreachable.code == 1 and f"host {loopback_host.spec}" in unreachable.err, unreachable.err
    mirrored = cli_sqlite("sql", "select step, state from checkpoints order by step", "--json").json()
    assert [row["state"] for row in mirrored] == ["committed", "committed"]
    loopback_host.start()

    # What the host was seen not to hold is deleted: storage is the truth.
    shutil.rmtree(on_host / "step-00000010")
    assert [c["step"] for c in cli_sqlite("checkpoints", "far", "--json").json()] == [20]
    mirrored = cli_sqlite("sql", "select step, state from checkpoints order by step", "--json").json()
    assert mirrored == [{"step": 10, "state": "deleted"}, {"step": 20, "state": "committed"}]
