"""Retries by policy, end to end: real preemption notices, real failures, decisions written down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from waiting import wait_for

PY = sys.executable
SCRIPT = str(Path(__file__).parent / "scripts" / "neutral.py")


def test_a_run_preempted_three_times_completes_with_four_attempts(cli):
    result = cli("submit", "--name", "spot", "--", PY, SCRIPT, "40", "--preempt-at", "12,25,33")
    assert result.code == 0, result.err
    attempts = cli("attempts", "spot", "--json").json()
    assert [a["termination_reason"] for a in attempts] == ["preempted", "preempted", "preempted", "completed"]
    assert [a["retry_decision"] and __import__("json").loads(a["retry_decision"])["rule"] for a in attempts] == [
        "preempted: resume (1 of 10)", "preempted: resume (2 of 10)", "preempted: resume (3 of 10)", "completed: nothing to do",
    ]
    # The notice let each attempt save at the step it stopped: the next one resumes right after it.
    assert [a["resumed_from_checkpoint"] for a in attempts] == [None, "step-00000012", "step-00000025", "step-00000033"]
    assert [a["first_step"] for a in attempts] == [0, 13, 26, 34]
    points = cli("metrics", "spot", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(40))
    for a in attempts:
        assert abs(a["useful_gpu_seconds"] + a["wasted_gpu_seconds"] - a["gpu_seconds"]) < 1e-6
    # Each notice allowed a final save: only the moments between that save and the exit are waste.
    assert all(a["wasted_gpu_seconds"] < 0.5 * a["gpu_seconds"] + 1.0 for a in attempts[:3])
    assert attempts[3]["wasted_gpu_seconds"] == 0


def test_a_policy_file_sets_the_budget(cli, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.preempted]\nbudget = 1\n")
    result = cli("submit", "--name", "tight", "--retry-policy", str(policy), "--", PY, SCRIPT, "40", "--preempt-at", "12,25,33")
    assert result.code == 1
    attempts = cli("attempts", "tight", "--json").json()
    assert [a["termination_reason"] for a in attempts] == ["preempted", "preempted"]
    last = __import__("json").loads(attempts[-1]["retry_decision"])
    assert last["action"] == "stop" and last["rule"] == "preempted: budget 1 spent"


def test_a_bad_policy_file_is_refused_before_anything_is_recorded(cli, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.preempted]\naction = 'pray'\n")
    result = cli("submit", "--retry-policy", str(policy), "--", PY, "-c", "pass")
    assert result.code == 2 and "action 'pray'" in result.err and len(result.err.strip().splitlines()) == 1
    assert cli("runs", "--json").json() == []


def test_code_errors_are_not_retried(cli):
    result = cli("submit", "--name", "bug", "--", PY, SCRIPT, "40", "--fail-at", "15")
    assert result.code == 1
    (attempt,) = cli("attempts", "bug", "--json").json()
    assert attempt["termination_reason"] == "code_error"
    assert "stop" in attempt["retry_decision"]


def test_report_waste_says_which_retries_did_real_work(cli):
    assert cli("submit", "--name", "spot2", "--", PY, SCRIPT, "30", "--preempt-at", "12").code == 0
    assert cli("submit", "--name", "bug2", "--", PY, SCRIPT, "30", "--fail-at", "5").code == 1
    by_reason = {r["reason"]: r for r in cli("report", "waste", "--json").json()}
    assert set(by_reason) == {"preempted", "completed", "code_error"}
    assert by_reason["completed"]["wasted_gpu_seconds"] == 0
    # The code error committed no checkpoint: everything it did is waste.
    assert by_reason["code_error"]["wasted_gpu_seconds"] == by_reason["code_error"]["gpu_seconds"] > 0
    by_run = cli("report", "waste", "--by", "run", "--json").json()
    assert len(by_run) == 2
    table = cli("report", "waste", "--by", "run")
    # No attempt here had a GPU: their hours are CPU-hours, and said so.
    assert table.code == 0 and "wasted cpu-h" in table.out and "gpu-h" not in table.out
    assert "CPU time (no attempt had a GPU)" in " ".join(table.out.split())
    assert cli("report", "waste", "--by", "color").code == 2


def test_explain_answers_from_the_ledger_alone(cli, tmp_path):
    config = tmp_path / "cfg.toml"
    config.write_text("[train]\nbatch_size = 32\n")
    assert cli("submit", "--name", "ex", "--config", str(config), "--", PY, SCRIPT, "30", "--preempt-at", "12").code == 0
    facts = cli("explain", "ex/1", "--json").json()
    assert facts["ended_by"]["reason"] == "preempted" and facts["ended_by"]["rule"] == "sdk:note"
    assert "SIGTERM" in facts["ended_by"]["evidence"][0]
    assert facts["checkpoints"]["committed"][-1]["name"] == "step-00000012"
    assert facts["history"][0]["decision"]["rule"] == "preempted: resume (1 of 10)"
    second = cli("explain", "ex", "--json").json()
    assert second["attempt"]["attempt_id"].endswith("/2") and second["compared_with"].endswith("/1")
    assert second["checkpoints"]["resumed_from"] == "step-00000012"
    assert second["changes"]["config"] == [] and second["next"].startswith("nothing: the run is completed")
    markdown = cli("explain", "ex/1", "--markdown").out
    assert "## Attempts and decisions" in markdown and "preempted" in markdown and "**Next:**" in markdown
    assert cli("explain", "ex").code == 0


def test_explain_shows_config_changes_between_attempts(cli, tmp_path):
    from trackway.reports.explain import config_diff, data_diff

    assert config_diff({"train": {"lr": 0.1, "bs": 8}}, {"train": {"lr": 0.2, "bs": 8}, "new": 1}) == [
        'new: "<absent>" → 1',
        "train.lr: 0.1 → 0.2",
    ]
    before = {"files": [{"path": "d/a", "size": 8709, "sha256": "1" * 64}, {"path": "d/b", "size": 3, "sha256": "2" * 64}]}
    after = {"files": [{"path": "d/a", "size": 9141, "sha256": "3" * 64}, {"path": "d/c", "size": 4, "sha256": "4" * 64}]}
    # Each changed file with its old and new size and hash: what a reader needs to see it was the data.
    assert data_diff(before, after) == [
        "added d/c (4 bytes, 444444444444)", "removed d/b (was 3 bytes, 222222222222)",
        "changed d/a (8,709 bytes, 111111111111 → 9,141 bytes, 333333333333)",
    ]


def test_oom_is_retried_only_with_a_smaller_footprint(cli):
    script = str(Path(__file__).resolve().parents[2] / "examples" / "faults" / "oom_batch.py")
    failed = cli("submit", "--name", "big", "--set", "train.batch_size=32", "--", PY, script)
    assert failed.code == 1
    (first,) = cli("attempts", "big", "--json").json()
    decision = __import__("json").loads(first["retry_decision"])
    assert first["termination_reason"] == "oom" and decision["rule"] == "oom: same memory footprint"
    fixed = cli("resume", "big", "--set", "train.batch_size=8")
    assert fixed.code == 0, fixed.err
    first, second = cli("attempts", "big", "--json").json()
    assert second["termination_reason"] == "completed" and second["config_sha256"] != first["config_sha256"]
    # A person's resume is credited to the person, not to the supervisor.
    assert second["started_by"].startswith("trackway resume --set train.batch_size=8 (")
    facts = cli("explain", "big", "--json").json()
    assert facts["changes"]["config"] == ["train.batch_size: 32 → 8"]


def test_watchers_notice_a_rising_loss_while_it_runs(cli):
    script = str(Path(__file__).parent / "scripts" / "rising.py")
    result = cli("submit", "--name", "up", "--", PY, script)
    assert result.code == 0, result.err
    assert "watch: loss rising" in result.err
    facts = cli("explain", "up", "--json").json()
    assert any(line.startswith("loss rising") for line in facts["watchers"])


def test_a_watcher_listed_in_stop_on_ends_the_attempt(cli):
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["loss_rising"]\n')
    script = str(Path(__file__).parent / "scripts" / "rising.py")
    result = cli("submit", "--name", "diverging", "--", PY, script)
    assert result.code == 1
    (attempt,) = cli("attempts", "diverging", "--json").json()
    assert attempt["termination_reason"] == "watcher_stop"  # not nan_loss: the loss rose, it never went NaN
    assert attempt["termination_evidence"]["rule"] == "watcher:loss_rising"
    assert __import__("json").loads(attempt["retry_decision"])["action"] == "stop"
    assert attempt["last_step"] < 399  # ended while it ran, not after
    advice = cli("explain", "diverging", "--json").json()["next_steps"]["person"]
    assert "learning rate" in advice and "stop_on" in advice and "trackway resume diverging" in advice


def test_stop_on_names_known_watchers_only(cli):
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["vibes"]\n')
    refused = cli("runs")
    assert refused.code == 2 and "stop_on" in refused.err


def test_a_rendezvous_port_another_process_holds_is_retried_not_called_a_code_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    # Another process listens on the port torchrun's rendezvous asks for (a second job on this machine).
    holder = subprocess.Popen([PY, "-c", HOLD_A_PORT], stdout=subprocess.PIPE, text=True)
    try:
        port = holder.stdout.readline().strip()
        (tmp_path / "holder.pid").write_text(str(holder.pid))
        policy = tmp_path / "policy.toml"
        policy.write_text("[reasons.infra_transient]\nbackoff_seconds = 1\n")
        result = cli("submit", "--name", "port", "--retry-policy", str(policy), "--",
                     PY, str(Path(__file__).parent / "scripts" / "port_held.py"), port, str(tmp_path / "holder.pid"))
    finally:
        holder.kill()
        holder.wait()
    assert result.code == 0, result.err
    first, second = cli("attempts", "port", "--json").json()
    assert (first["termination_reason"], second["termination_reason"]) == ("infra_transient", "completed")
    evidence = first["termination_evidence"]
    assert evidence["rule"] == "log:port-in-use"
    assert any("EADDRINUSE" in line and port in line for line in evidence["lines"]), evidence
    assert json.loads(first["retry_decision"])["action"] == "resume"
    assert "rank 0 joined" in cli("logs", "port/2").out


HOLD_A_PORT = """
import socket, time
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(300)
"""


def test_explain_tells_how_to_get_a_free_port_once_the_retries_are_spent(cli_sqlite, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.infra_transient]\nbudget = 0\n")
    result = cli_sqlite("submit", "--name", "taken", "--retry-policy", str(policy), "--",
                        PY, "-c", "raise OSError(98, 'Address already in use')")
    assert result.code == 1
    facts = cli_sqlite("explain", "taken", "--json").json()
    assert facts["ended_by"]["reason"] == "infra_transient" and facts["ended_by"]["rule"] == "log:port-in-use"
    assert "--main_process_port 0" in facts["next_steps"]["person"], facts["next_steps"]


def test_a_run_going_again_after_a_preemption_shows_no_ending_of_its_own(cli_sqlite, tmp_path):
    # The retry waits out a backoff: the run is seen between its attempts (an immediate retry of 35 quick steps
    # could complete before the listing looks, under load).
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.preempted]\nbackoff_seconds = 600\n")
    assert cli_sqlite("submit", "--detach", "--name", "again", "--retry-policy", str(policy), "--",
                      PY, SCRIPT, "40", "--preempt-at", "5").code == 0
    # Each listing ticks: the preemption is recorded and the retry queued or started.
    wait_for(lambda: cli_sqlite("attempts", "again", "--json").json()[0]["termination_reason"], "attempt 1 to end",
             interval=0.3)
    (run,) = cli_sqlite("runs", "--json").json()
    # Going again: the preemption is attempt 1's ending, not the run's (the listing said `running  preempted`).
    assert run["state"] in ("queued", "running") and run["termination_reason"] is None, run
    assert cli_sqlite("attempts", "again", "--json").json()[0]["termination_reason"] == "preempted"
    assert cli_sqlite("cancel", "again").code == 0


def test_the_end_line_says_each_thing_once(cli_sqlite):
    done = cli_sqlite("submit", "--name", "once", "--", PY, SCRIPT, "3")
    (line,) = [text for text in done.err.splitlines() if " ended: " in text]
    assert line.endswith("ended: completed (exit code 0)"), line  # no `none: the run ended completed [...]`
    failed = cli_sqlite("submit", "--name", "bug3", "--", PY, SCRIPT, "10", "--fail-at", "2")
    (line,) = [text for text in failed.err.splitlines() if " ended: " in text]
    assert "ended: code_error (exit code 1); stop: " in line and line.endswith("[code_error: stop]"), line


def test_a_runs_own_threshold_keeps_it_running_where_the_files_would_stop_it(cli):
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["loss_rising"]\n')
    script = str(Path(__file__).parent / "scripts" / "rising.py")
    # The loss climbs 1.0 → 5.0: under trackway.toml's rule (+10 %) that is a rise; this run asks for +10000 %.
    result = cli("submit", "--name", "tolerant", "--watch", "loss_rising.min_rise=100", "--", PY, script)
    assert result.code == 0, result.err
    (attempt,) = cli("attempts", "tolerant", "--json").json()
    assert attempt["termination_reason"] == "completed" and attempt["last_step"] == 399
    explained = cli("explain", "tolerant").out
    assert "this run's own (--watch loss_rising.min_rise=100.0)" in " ".join(explained.split())


def test_a_bad_watch_is_refused_before_anything_is_recorded(cli):
    script = str(Path(__file__).parent / "scripts" / "rising.py")
    refused = cli("submit", "--name", "never", "--watch", "plateau.window=3 parsecs", "--", PY, script)
    assert refused.code == 2
    assert refused.err.strip().splitlines()[-1].endswith(
        "--watch plateau.window: expected a number of steps or a duration, such as \"500 steps\", \"90s\", \"10m\" "
        "or \"3h\", got '3 parsecs'")
    assert cli("runs", "--json").json() == []
