"""Scripts without the SDK still leave checkpoints: a declared path committed from outside and restored before a retry."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from trackway.ledger import open_ledger
from trackway.ledger.records import get_attempt, resolve_run
from trackway.settings import load_settings
from trackway.supervisor.outside_checkpoints import Restored, restore_declared, substitute_command
from trackway.supervisor.outside_sdk import visibility

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nanogpt_style.py"
PATTERN = r"iter (?P<step>\d+): loss (?P<loss>\S+)"
DEADLINE_S = 300  # generous: a busy 2-core machine
ITER = re.compile(r" out iter (\d+): loss")


def _supervise_until(cli, done, deadline_s: float = DEADLINE_S):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        result = cli("supervise", "--once")
        assert result.code == 0, result.err
        value = done()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("the run did not get there before the deadline")


def _attempts(cli, run: str) -> list[dict]:
    result = cli("attempts", run, "--json")
    assert result.code == 0, result.err
    return result.json()


def _iters(log_path: str) -> list[int]:
    return [int(m.group(1)) for m in ITER.finditer(Path(log_path).read_text())]


# -- pure parts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "words"),
    [("/abs/ckpt.pt", "relative to the run's working directory"), ("../ckpt.pt", "no '..'"), ("", "expected a path")],
)
def test_bad_checkpoint_path_exits_2_naming_the_option(cli, path, words):
    result = cli("submit", "--checkpoint-path", path, "--", sys.executable, "-c", "pass")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "--checkpoint-path" in lines[0] and words in lines[0], result.err
    assert cli("runs", "--json").json() == []


def test_resume_from_placeholder():
    restored = Restored(checkpoint="step-00000020", restored=["/w/out/ckpt.pt"])
    command = ["python", "train.py", "--resume-from={resume_from}", "{resume_from}", "--x"]
    assert substitute_command(command, restored, Path("/c/step-00000020")) == [
        "python", "train.py", "--resume-from=/w/out/ckpt.pt", "/w/out/ckpt.pt", "--x"]
    # An SDK checkpoint: its directory. Nothing to resume from: each word holding it is dropped.
    assert substitute_command(command, Restored(), Path("/c/step-00000020"))[2] == "--resume-from=/c/step-00000020"
    assert substitute_command(command, None, None) == ["python", "train.py", "--x"]


def test_nothing_committed_moves_a_leftover_aside(tmp_path):
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "ckpt.pt").write_bytes(b"half a checkpoint")
    done = restore_declared(tmp_path / "checkpoints", work, ["out/ckpt.pt"], None, 2)
    assert not (work / "out" / "ckpt.pt").exists()
    assert done.moved_aside == [str(work / "out" / "ckpt.pt.trackway-aside-2")]
    assert (work / "out" / "ckpt.pt.trackway-aside-2").read_bytes() == b"half a checkpoint"


def test_a_directory_and_a_file_round_trip(tmp_path):
    from trackway.supervisor.outside_checkpoints import _commit, matches, signature

    work = tmp_path / "work"
    (work / "out" / "shards").mkdir(parents=True)
    (work / "out" / "shards" / "a.bin").write_bytes(b"a" * 100)
    (work / "out" / "shards" / "b.bin").write_bytes(b"b" * 50)
    (work / "out" / "meta.json").write_text("{}")
    globs = ["out/shards", "out/*.json"]
    rels = matches(work, globs)
    assert rels == ["out/meta.json", "out/shards"]
    sig = signature(work, rels)
    store_root = tmp_path / "checkpoints"
    from trackway.checkpoints.store import CheckpointStore

    info = _commit(CheckpointStore(store_root), work, sig, 7, "r1", "r1/1", None)
    assert info.step == 7 and info.manifest["extra"]["source"] == "checkpoint_path"
    # The script overwrites in place; the next attempt gets the committed content back, mtimes included.
    (work / "out" / "shards" / "a.bin").write_bytes(b"torn")
    done = restore_declared(store_root, work, globs, info.name, 2)
    assert sorted(done.restored) == [str(work / "out" / "meta.json"), str(work / "out" / "shards")]
    assert (work / "out" / "shards" / "a.bin").read_bytes() == b"a" * 100
    assert signature(work, rels) == sig  # recognised as already committed


def test_moved_on_means_the_script_printed_after_the_save(tmp_path):
    from trackway.supervisor.outside_checkpoints import _script_wrote_after

    log = tmp_path / "output.log"
    log.write_text(
        "2026-11-24T10:00:00.000000Z out iter 40: loss 1.0\n"
        "2026-11-24T10:00:02.000000Z err trackway: executor shim received SIGTERM: sent SIGTERM\n"
    )
    saved = datetime(2026, 11, 24, 10, 0, 1, tzinfo=timezone.utc).timestamp()
    assert not _script_wrote_after(log, saved)  # only the shim spoke after the save
    with log.open("a") as f:
        f.write("2026-11-24T10:00:03.000000Z out iter 41: loss 0.9\n")
    assert _script_wrote_after(log, saved)
    assert not _script_wrote_after(tmp_path / "missing.log", saved)


# -- through the real CLI, real processes, a real SIGTERM -----------------------------------------


def test_sigterm_resumes_from_the_last_complete_ckpt(cli):
    Path("trackway.toml").write_text("[resources.local]\ngrace_seconds = 2\n")
    submitted = cli(
        "submit", "--detach", "--name", "nano", "--metric-pattern", PATTERN, "--checkpoint-path", "out/ckpt.pt", "--",
        sys.executable, str(EXAMPLE), "--max-iters", "300", "--ckpt-every", "20", "--delay", "0.05",
        "--resume-from={resume_from}",
    )
    assert submitted.code == 0, submitted.err

    def first_commit():
        committed = [c for c in cli("checkpoints", "nano", "--json").json() if c["state"] == "committed"]
        (attempt, *rest) = _attempts(cli, "nano")
        return attempt if committed and attempt["state"] == "running" and not rest else None

    running = _supervise_until(cli, first_commit)
    os.kill(int(running["executor_job_id"]), signal.SIGTERM)  # a host shutdown, a spot reclaim

    def second_ended():
        attempts = _attempts(cli, "nano")
        return attempts if len(attempts) == 2 and attempts[1]["state"] == "ended" else None

    first, second = _supervise_until(cli, second_ended)
    assert [first["termination_reason"], second["termination_reason"]] == ["preempted", "completed"]

    # The retry resumed from the newest checkpoint committed from out/ckpt.pt, restored in place.
    checkpoints = {c["name"]: c for c in cli("checkpoints", "nano", "--json").json()}
    resumed = second["resumed_from_checkpoint"]
    assert resumed in checkpoints and checkpoints[resumed]["state"] == "committed"
    assert checkpoints[resumed]["attempt_id"] == first["attempt_id"]
    payload = Path(checkpoints[resumed]["path"]) / "payload" / "out" / "ckpt.pt"
    saved_iter = torch.load(payload, weights_only=True)["iter_num"]
    assert saved_iter > 0 and checkpoints[resumed]["step"] <= saved_iter
    # A fixed file name says nothing of the step: the label is the log's, and the manifest says so.
    manifest = json.loads((Path(checkpoints[resumed]["path"]) / "MANIFEST.json").read_text())
    assert manifest["extra"]["step_from"].startswith("the log: the last step printed before the save")

    first_log, second_log = Path(first["log_path"]).read_text(), Path(second["log_path"]).read_text()
    # Attempt 1 had nothing to resume from: the `{resume_from}` word was dropped.
    assert "Initializing a new model from scratch" in first_log
    # The retry was given the restored path, and its first iteration comes after the checkpoint's, not 0.
    assert f"Resuming training from {Path.cwd() / 'out' / 'ckpt.pt'}" in second_log
    assert _iters(second["log_path"])[0] == saved_iter + 1
    assert _iters(second["log_path"])[-1] == 300

    # Metrics from both attempts on one step axis; the redone steps are the retry's.
    points = cli("metrics", "nano", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(301))
    assert {p["attempt_number"] for p in points if p["step"] > saved_iter} == {2}
    assert second["checkpoints_committed"] >= 1 and first["checkpoints_committed"] >= 1
    # The restored file is recognised as committed already; the retry commits only what it saved itself.
    assert all(c["step"] > saved_iter for c in checkpoints.values() if c["attempt_id"] == second["attempt_id"])

    # What explain should say about a script without the SDK.
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    try:
        with ledger.read() as conn:
            lines = visibility(conn, resolve_run(conn, "nano"), get_attempt(conn, second["attempt_id"]))
    finally:
        ledger.dispose()
    text = "\n".join(lines)
    assert "no trackway SDK seen in this attempt" in text
    assert "metrics from log patterns (1 pattern(s)" in text and f"loss (steps {saved_iter + 1}..300)" in text
    assert "checkpoints from --checkpoint-path out/ckpt.pt" in text
    assert f"restored before start: {resumed} → {Path.cwd() / 'out' / 'ckpt.pt'}" in text
    explained = cli("explain", "nano")
    assert explained.code == 0, explained.err
    assert f"restored {resumed} from the declared checkpoint path" in explained.out
    # The reader is told plainly what trackway could not see, in explain itself.
    flat = " ".join(explained.out.split())
    assert "What trackway could see" in explained.out and "no trackway SDK seen in this attempt" in flat
    assert "checkpoints from --checkpoint-path out/ckpt.pt" in flat


def test_checkpoint_path_from_trackway_toml_is_stored_with_the_run(cli):
    Path("trackway.toml").write_text('[checkpoints]\npath = "out/ckpt.pt"\nkeep_last = 3\n')
    submitted = cli("submit", "--detach", "--name", "tomlpath", "--", sys.executable, "-c", "pass")
    assert submitted.code == 0, submitted.err
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    try:
        with ledger.read() as conn:
            run = resolve_run(conn, "tomlpath")
            assert json.loads(run["checkpoint_paths"]) == ["out/ckpt.pt"] and run["log_patterns"] is None
    finally:
        ledger.dispose()
    _supervise_until(cli, lambda: all(a["state"] == "ended" for a in _attempts(cli, "tomlpath")))
    assert cli("gc", "--dry-run").code == 0  # `path` is not a retention setting


STEP_FILES = Path(__file__).resolve().parent / "scripts" / "step_files.py"


def test_a_glob_over_step_numbered_files_commits_each_file_once_and_resumes_from_the_newest(cli):
    # Before issue 30: every commit copied every matching file (storage grew quadratically), `{resume_from}`
    # named the oldest file while the receipt said the newest, and the labels came from the log, not the script.
    submitted = cli(
        "submit", "--name", "steps", "--metric-pattern", PATTERN, "--checkpoint-path", "ckpts/*.pt", "--",
        sys.executable, str(STEP_FILES), "{resume_from}",
    )
    assert submitted.code == 0, submitted.err
    first, second = _attempts(cli, "steps")
    assert (first["termination_reason"], second["termination_reason"]) == ("preempted", "completed")
    committed = [c for c in cli("checkpoints", "steps", "--json").json() if c["state"] == "committed"]
    # The script's own steps, each checkpoint holding only its own file; the torn step_35 never committed.
    assert [c["step"] for c in committed] == [10, 20, 30, 40, 50]
    for checkpoint in committed:
        payload = sorted(p.name for p in (Path(checkpoint["path"]) / "payload" / "ckpts").iterdir())
        assert payload == [f"step_{checkpoint['step']}.pt"]
        manifest = json.loads((Path(checkpoint["path"]) / "MANIFEST.json").read_text())
        assert manifest["extra"]["step_from"] == "the file name: the script's own step"
    assert second["resumed_from_checkpoint"] == "step-00000030"
    work = Path.cwd()
    assert f"resuming from {work / 'ckpts' / 'step_30.pt'} at 31" in Path(second["log_path"]).read_text()
    # The file attempt 1 started and never finished was moved aside before the retry, not restored or committed.
    assert (work / "ckpts" / "step_35.pt.trackway-aside-2").exists() and not (work / "ckpts" / "step_35.pt").exists()
    explained = " ".join(cli("explain", "steps/2").out.split())
    assert "restored step-00000030 from the declared checkpoint path to" in explained
    assert "moved aside, never committed" in explained and "step_35.pt.trackway-aside-2" in explained


def test_a_retry_whose_script_starts_over_says_the_resume_was_not_taken_up(cli):
    # nanoGPT resumes only with init_from=resume: trackway restores out/ckpt.pt, the script starts from
    # scratch anyway. Before issue 30 the receipt said "resumed from step-N" and nothing more.
    Path("trackway.toml").write_text("[resources.local]\ngrace_seconds = 2\n")
    submitted = cli(
        "submit", "--detach", "--name", "scratch", "--metric-pattern", PATTERN, "--checkpoint-path", "out/ckpt.pt",
        "--", sys.executable, str(EXAMPLE), "--max-iters", "120", "--ckpt-every", "20", "--delay", "0.05",
        "--init-from", "scratch",
    )
    assert submitted.code == 0, submitted.err

    def first_commit():
        committed = [c for c in cli("checkpoints", "scratch", "--json").json() if c["state"] == "committed"]
        (attempt, *rest) = _attempts(cli, "scratch")
        return attempt if committed and attempt["state"] == "running" and not rest else None

    running = _supervise_until(cli, first_commit)
    os.kill(int(running["executor_job_id"]), signal.SIGTERM)

    def second_ended():
        attempts = _attempts(cli, "scratch")
        return attempts if len(attempts) == 2 and attempts[1]["state"] == "ended" else None

    first, second = _supervise_until(cli, second_ended)
    assert second["resumed_from_checkpoint"] and _iters(second["log_path"])[0] == 0
    facts = cli("explain", "scratch/2", "--json").json()
    said = facts["checkpoints"]["not_taken_up"]
    assert said.startswith(f"resume not taken up: trackway gave this attempt {second['resumed_from_checkpoint']}, "
                           "but the script's first logged step was 0")
    assert "init_from=resume" in said
    assert said in " ".join(cli("explain", "scratch/2").out.split())
    # An attempt that did resume says nothing of the kind.
    assert cli("explain", "scratch/1", "--json").json()["checkpoints"]["not_taken_up"] is None
