"""`trackway explain` answers the seven questions for five real failures, read at 80 columns.

Issue 11: a reader who had never seen trackway got only the text of `explain` for five failures
(an OOM retried by hand with a smaller batch, bad data, a NaN with `lr` in the config, a missing
import, a run preempted twice) and could not tell which config, data, machine or checkpoint,
who retried what, what the evaluations said or what happens next. Each story here is made by the
real `trackway submit`/`resume` in subprocesses (real scripts, real signals, real checkpoints),
once per ledger backend, and `explain` is read as a person reads it: `COLUMNS=80`, piped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
FAULTS = ROOT / "examples" / "faults"
NEUTRAL = ROOT / "tests" / "cli" / "scripts" / "neutral.py"
EVALUATOR = ROOT / "tests" / "evals" / "scripts" / "evaluator.py"
PG_ADMIN_URL = os.environ.get("TRACKWAY_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
WIDTH = 80


class Stories:
    """A ledger holding the five stories, and `trackway` run against it as a user runs it."""

    def __init__(self, work: Path, db_url: str):
        self.work = work
        self.env = {**os.environ, "TRACKWAY_HOME": str(work / "home"), "TRACKWAY_DB": db_url, "COLUMNS": str(WIDTH)}

    def trackway(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "trackway", *args], cwd=self.work, env=self.env, capture_output=True,
                              text=True, timeout=120)

    def submit(self, *args: str, code: int) -> None:
        done = self.trackway("submit", "--data", "data", *args)
        assert done.returncode == code, done.stderr

    def explain(self, ref: str, *flags: str) -> str:
        done = self.trackway("explain", ref, *flags)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def attempts(self, run: str) -> list[dict]:
        return sorted(json.loads(self.trackway("attempts", run, "--json").stdout), key=lambda a: a["attempt_number"])


def _data(work: Path) -> None:
    """Two JSONL shards; the second holds a record without `text` (what the bad-data story trips on)."""
    shards = work / "data"
    shards.mkdir()
    (shards / "part-0.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    (shards / "part-1.jsonl").write_text('{"text": "c"}\n{"txt": "d"}\n')


def _eval_spec(work: Path) -> Path:
    """A one-seed spec around the stand-in evaluator, triggered by every committed checkpoint."""
    evals = work / "evals"
    evals.mkdir()
    (evals / "evaluator.py").write_text(EVALUATOR.read_text())
    (evals / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    spec = evals / "toy.toml"
    spec.write_text(f'name = "toy"\ncommand = {json.dumps([PY, "evaluator.py"])}\ntask_set = "tasks.jsonl"\n'
                    'seeds = [0]\nmetrics = ["pass@1"]\n[decoding]\nsamples = 1\n')
    return spec


def _tell(stories: Stories) -> None:
    """The five stories, each as a newcomer would have lived it."""
    stories.submit("--name", "oom", "--set", "train.batch_size=32", "--set", "optim.lr=0.0003", "--", PY,
                   str(FAULTS / "oom_batch.py"), code=1)
    done = stories.trackway("resume", "oom", "--set", "train.batch_size=8")
    assert done.returncode == 0, done.stderr
    stories.submit("--name", "baddata", "--", PY, str(SCRIPTS / "story_bad_data.py"), "data", code=1)
    stories.submit("--name", "nan", "--set", "optim.lr=10", "--set", "train.batch_size=32", "--", PY,
                   str(FAULTS / "nan_loss.py"), code=1)
    stories.submit("--name", "import", "--", PY, str(SCRIPTS / "story_missing_import.py"), code=1)
    stories.submit("--name", "spot", "--eval", str(_eval_spec(stories.work)), "--", PY, str(NEUTRAL), "30",
                   "--preempt-at", "12,25", code=0)
    # The evaluations a submit leaves in flight are finished by the next supervisor pass.
    for _ in range(50):
        listed = json.loads(stories.trackway("evals", "spot", "--json").stdout)["evaluations"]
        if listed and all(e["state"] != "running" for e in listed):
            break
        stories.trackway("supervise", "--once")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def stories(request, tmp_path_factory, pg_template):
    """The five stories told once per backend (they take seconds; every test below only reads them)."""
    work = tmp_path_factory.mktemp(f"stories-{request.param}")
    _data(work)
    if request.param == "sqlite":
        yield _told(work, f"sqlite:///{work / 'ledger.db'}")
        return
    name = f"trackway_st_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield _told(work, make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _told(work: Path, db_url: str) -> Stories:
    stories = Stories(work, db_url)
    _tell(stories)
    return stories


def _read(out: str) -> str:
    """What a person reads at 80 columns, checked for what must never be there; wrapped lines joined again."""
    for line in out.splitlines():
        # Only a path or hash longer than the room beside its label runs past the width: it is never broken.
        words = line.split()
        unbreakable = bool(words) and len(words[-1]) > WIDTH // 2 and len(line) - len(words[-1]) < WIDTH // 2
        assert len(line) <= WIDTH or unbreakable, f"wider than {WIDTH} columns: {line!r}"
        assert line == line.rstrip(), f"padded with spaces: {line!r}"
    assert "None" not in out and "null" not in out, out
    assert not re.search(r"\b[0-9a-f]{64}\b", out), "a 64-hex hash would wrap: short hashes only"
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", out), "times to the second, without microseconds"
    return " ".join(out.split())


def _placement(stories: Stories, run: str, text: str) -> None:
    for attempt in stories.attempts(run):
        assert f"{attempt['executor']} job {attempt['executor_job_id']} on {attempt['host']}" in text


def _once(text: str, advice: str) -> None:
    assert text.count(advice) == 1, f"{advice!r} said {text.count(advice)} times"


def test_an_oom_retried_by_hand_with_a_smaller_batch(stories):
    text = _read(stories.explain("oom"))
    _placement(stories, "oom", text)
    # Who retried: the policy stopped, a person resumed with a smaller batch.
    assert "1 oom → stop (retry policy: `oom: same memory footprint`)" in text
    assert "2 completed → nothing to do" in text
    assert "started by a person: trackway resume --set train.batch_size=8 (" in text
    assert "evidence: OutOfMemoryError: CUDA out of memory at batch size 32" in text
    # Which config: its values, and what differs from the attempt that ran out of memory.
    assert "optim.lr = 0.0003" in text and "train.batch_size = 8" in text
    assert "differs from" in text and "(the previous and the first): - train.batch_size: 32 → 8" in text
    assert "data/part-0.jsonl 28 bytes" in text and "since " in text and ": no file changed" in text
    assert "no evaluation configured for this run" in text
    assert "Next: nothing: the run is completed" in text
    # The attempt that failed, in full: the batch it ran with and what to change.
    first = _read(stories.explain("oom/1"))
    assert "train.batch_size = 32" in first and "Ended: oom (rule `sdk:note`)" in first


def test_bad_data_names_the_files_and_says_to_fix_them_and_resume(stories):
    text = _read(stories.explain("baddata"))
    _placement(stories, "baddata", text)
    assert "2 files, 55 bytes" in text
    assert "data/part-0.jsonl 28 bytes" in text and "data/part-1.jsonl 27 bytes" in text
    assert "BadData: part-1.jsonl line 2: no 'text' field" in text
    assert "bad_data → stop (retry policy: `bad_data: stop`)" in text
    assert "no config declared" in text and "code: not a git repository" in text
    assert "no evaluation configured for this run" in text
    # A resume hashes the data again at its launch (issue 30): fixing the files and resuming is honest now.
    _once(text, "fix or exclude the input the evidence names, then `trackway resume baddata`: the data is hashed "
                "again when the attempt launches")


def test_a_nan_shows_the_learning_rate_and_resumes_from_the_checkpoint_before_it(stories):
    text = _read(stories.explain("nan"))
    _placement(stories, "nan", text)
    assert "optim.lr = 10" in text and "train.batch_size = 32" in text
    assert "non-finite loss = nan at step 6; last good checkpoint: step-00000005" in text
    # The script ran on until the writer met the NaN or its next save (step 10) checked what had
    # been logged first and refused: either way nothing past the NaN was committed.
    assert "committed step-00000005" in text and "step-00000010" not in text
    assert "newest committed of the run: step-00000005 (step 5" in text
    _once(text, "lower the learning rate (optim.lr is 10)")
    assert "`trackway resume nan --set optim.lr=...`; it resumes from step-00000005" in text
    assert "no evaluation configured for this run" in text
    assert "CPU-hours" in text and "GPU-hours" not in text  # no GPU was used


def test_a_missing_import_gives_no_advice_that_cannot_apply(stories):
    text = _read(stories.explain("import"))
    _placement(stories, "import", text)
    assert "ModuleNotFoundError: No module named 'flash_attn_kernels_v9'" in text
    assert "code_error → stop (retry policy: `code_error: stop`)" in text
    assert "committed none" in text and "none: the run has no committed checkpoint" in text
    # No checkpoint exists: nothing may send the reader to one.
    assert "last good checkpoint" not in text
    _once(text, "fix the exception the evidence shows, then `trackway resume import`")
    assert "it resumes from the start: no checkpoint was committed" in text
    assert "data/part-1.jsonl 27 bytes" in text and "no evaluation configured for this run" in text


def test_a_run_preempted_twice_shows_every_attempts_checkpoints_and_its_evaluations(stories):
    text = _read(stories.explain("spot"))
    _placement(stories, "spot", text)
    # Progress was never lost: each attempt resumed from what the one before committed.
    assert "resumed from the start; committed step-00000010, step-00000012" in text
    assert "resumed from step-00000012; committed step-00000020, step-00000025" in text
    assert "resumed from step-00000025; committed none" in text
    assert "steps 0..12" in text and "steps 13..25" in text and "steps 26..29" in text
    # The supervisor decided and started each retry, by rule.
    for n in (1, 2):
        assert f"preempted → resume (retry policy: `preempted: resume ({n} of 10)`)" in text
        assert f"attempt {n + 1} was started by the supervisor (preempted: resume ({n} of 10))" in text
    assert "newest committed of the run: step-00000025" in text
    # Each committed checkpoint's evaluation, in the state the ledger holds, with its headline metric.
    evaluations = json.loads(stories.trackway("evals", "spot", "--json").stdout)["evaluations"]
    assert [e["checkpoint"] for e in evaluations] == [f"step-{s:08d}" for s in (10, 12, 20, 25)]
    for e in evaluations:
        version = e["evaluator_version"].rpartition(":")[2][:12]
        assert f"{e['checkpoint']} by toy (evaluator {version}): {e['state']}" in text
    assert "completed, pass@1 " in text
    assert "Next: nothing: the run is completed" in text


def test_markdown_and_json_carry_the_same_story(stories):
    markdown = stories.explain("nan", "--markdown")
    assert "None" not in markdown and "| # | started by | placement |" in markdown
    assert "- optim.lr = 10" in markdown and "**Next:**" in markdown
    facts = json.loads(stories.explain("oom", "--json"))
    assert facts["config"]["values"] == {"optim.lr": 0.0003, "train.batch_size": 8}
    assert len(facts["config"]["sha256"]) == 64  # full hashes in --json
    assert [row["started_by"].split(" (")[0] for row in facts["history"]] == [
        "trackway submit", "trackway resume --set train.batch_size=8"]
    assert [f["path"] for f in facts["data"]["files"]] == ["data/part-0.jsonl", "data/part-1.jsonl"]


def test_gpus_and_gpu_hours_are_said_together(cli, ledger_url):
    """What a GPU host records (placement, GPU-seconds) reads as GPUs and GPU-hours, never as `0 GPU(s)`."""
    from trackway.ledger import open_ledger
    from trackway.ledger.schema import attempts

    assert cli("submit", "--name", "gpu", "--", PY, "-c", "pass").code == 0
    ledger = open_ledger(ledger_url)
    with ledger.write() as conn:
        conn.execute(attempts.update().values(gpu_count=2, gpu_model="NVIDIA H100 80GB HBM3", gpu_ids="0,1",
                                              gpu_seconds=7200.0, useful_gpu_seconds=5400.0, wasted_gpu_seconds=1800.0))
    ledger.dispose()
    text = " ".join(cli("explain", "gpu").out.split())
    assert "GPUs: 2 × NVIDIA H100 80GB HBM3 (ids 0,1)" in text
    assert "2.00 GPU-hours (2 h 0 min); useful 1 h 30 min, wasted 30 min 0 s" in text
    assert "CPU-hours" not in text and "no GPU" not in text
