"""Secrets never reach the ledger (issue 31), while every attempt still runs with them.

Before: `trackway submit train.py --token sk-... --api-key=abc --db postgresql://u:pw@host/db` kept the argv as
typed in `runs.command`, where `trackway sql`, `show`, `explain` and `GET /api/jobs` gave it to anyone; a script
printing `$MY_PASSWORD` put the value in the attempt's evidence although trackway holds that exact value; `show`
printed a config's `api_key` that `explain` masked; and the SSH control directory in /tmp was used whoever
owned it and whatever its mode. Then: a config's `api_key` was stored as given in the ledger's blobs (`show` and
`explain` only masked it when printing), and `GET /api/jobs/{id}/logs` streamed the raw output to any `read` token.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
import zlib
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import pytest

from api_server import Api, serving
from trackway.errors import ExecutorError
from trackway.executors.ssh_transport import SshClient, SshTarget
from trackway.ledger import open_ledger
from trackway.ledger.registration import register_pending
from trackway.pending import write_pending
from trackway.receipts.canonical import canonical_json
from trackway.redaction import MASK, LogRedactor, known_values, redact, redact_argv
from trackway.supervisor.classify import Signature

PY = sys.executable
TOKEN = "sk-proj-" + "abcdefghijklmnopqrstuvwx"
API_KEY = "abc123"
DB_PASSWORD = "pass-9f3e"
DB = f"postgresql://u:{DB_PASSWORD}@host/db"
ENV_PASSWORD = "hunter2-very-secret"
CONFIG_KEY = "abcdef-config-secret"
# As typed after `--`, with a word the shell expanded from $MY_PASSWORD: it has no shape, only its value gives it away.
ARGS = ["--token", TOKEN, f"--api-key={API_KEY}", "--db", DB, "--login", ENV_PASSWORD, "--lr", "3e-4"]
RECORDED_ARGS = ["--token", MASK, f"--api-key={MASK}", "--db", f"postgresql://u:{MASK}@host/db", "--login", MASK,
                 "--lr", "3e-4"]
CONFIG_TOKEN = "sk-proj-" + "configtokenabcdefghijkl"
NEW_TOKEN = "hf_" + "newtokenabcdefghijklmnopqrstuvwxyz"
SECRETS = (TOKEN, API_KEY, DB_PASSWORD, ENV_PASSWORD, CONFIG_KEY, CONFIG_TOKEN, NEW_TOKEN)

# A config with a secret by shape (an OpenAI-style key, a URL's password) and one by name only.
CONFIG_TEXT = (f"api_key: {CONFIG_TOKEN}\nlr: 0.1\nwandb:\n  token: {CONFIG_KEY}\n  project: demo\n"
               f"logging:\n  url: {DB}\n")
GIVEN_CONFIG = {"api_key": CONFIG_TOKEN, "lr": 0.1, "wandb": {"token": CONFIG_KEY, "project": "demo"},
                "logging": {"url": DB}}
RECORDED_CONFIG = {"api_key": MASK, "lr": 0.1, "wandb": {"token": MASK, "project": "demo"},
                   "logging": {"url": f"postgresql://u:{MASK}@host/db"}}

# Writes the arguments it got beside its spool, so the test sees what each attempt really ran with.
# FIRST_ATTEMPT says how attempt 1 ends: preempted (the policy retries it), failing with an error
# that quotes the API key and $MY_PASSWORD, or failing with one that quotes nothing (the policy
# stops; a person resumes). It writes the config it got from `trackway.init()` there too.
SCRIPT = """
import json, os, signal, sys, time
from pathlib import Path

import trackway

attempt = os.environ["TRACKWAY_ATTEMPT_NUMBER"]
(Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent / "argv-seen.json").write_text(json.dumps(sys.argv[1:]))
run = trackway.init(config=json.loads(os.environ["SCRIPT_CONFIG"]) if "SCRIPT_CONFIG" in os.environ else None)
(Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent / "config-seen.json").write_text(json.dumps(run.config))
run.log({"loss": 1.0}, step=0)
if attempt == "1" and os.environ.get("FIRST_ATTEMPT") == "preempted":
    os.kill(os.getpid(), signal.SIGTERM)
    while not run.should_stop:
        time.sleep(0.01)
    run.exit_preempted()
if attempt == "1" and os.environ.get("FIRST_ATTEMPT") == "fails":
    api_key = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--api-key="))
    print("MY_PASSWORD is", os.environ["MY_PASSWORD"], flush=True)
    raise RuntimeError(f"login as {api_key} with {os.environ['MY_PASSWORD']} refused")
if attempt == "1" and os.environ.get("FIRST_ATTEMPT") == "crashes":
    raise RuntimeError("out of patience")
run.finish()
"""


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.fixture
def submitter(cli_sqlite, monkeypatch):
    """The CLI, run by someone with a secret variable exported in their shell."""
    monkeypatch.setenv("MY_PASSWORD", ENV_PASSWORD)
    return cli_sqlite


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def _seen(home: Path, run_id: str) -> list[list[str]]:
    """The arguments each attempt's process got, attempt 1 first."""
    attempts = sorted((home / "runs" / run_id / "attempts").iterdir(), key=lambda p: int(p.name))
    return [json.loads((a / "argv-seen.json").read_text()) for a in attempts]


def test_argv_secrets_are_masked_everywhere_a_reader_looks_while_every_attempt_runs_with_them(
        submitter, home, sqlite_url, script, monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "preempted")
    submitted = submitter("submit", "--name", "tokened", "--", PY, script, *ARGS)
    assert submitted.code == 0, submitted.err
    run_id = submitted.out.split()[0]

    # Both attempts, the first and the policy's retry, ran with the arguments as typed.
    assert _seen(home, run_id) == [ARGS, ARGS]
    attempts = submitter("attempts", "tokened", "--json").json()
    assert [a["termination_reason"] for a in attempts] == ["preempted", "completed"]

    # The ledger holds the masked form, and only it.
    (row,) = submitter("sql", "select command from runs", "--json").json()
    assert json.loads(row["command"]) == [PY, script, *RECORDED_ARGS]
    for args in (("sql", "select * from runs", "--json"), ("sql", "select * from attempts", "--json"),
                 ("runs", "--json"), ("show", "tokened"), ("show", "tokened", "--json"), ("explain", "tokened"),
                 ("explain", "tokened", "--json"), ("explain", "tokened", "--markdown")):
        shown = submitter(*args)
        assert shown.code == 0, (args, shown.err)
        assert not _leaks(shown.out), (args, _leaks(shown.out))
    # Whitespace-insensitive: on a narrow terminal `show` wraps the command over lines.
    assert "--token *** --api-key=*** --db postgresql://u:***@host/db --login *** --lr 3e-4" in " ".join(submitter(
        "show", "tokened").out.split())

    # The words as typed are kept beside the run, readable by its owner only.
    kept = home / "runs" / run_id / "secret-argv.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text())["argv"] == [PY, script, *ARGS]

    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        for path in ("/api/jobs", f"/api/jobs/{run_id}", f"/api/runs/{run_id}/explain"):
            status, body, _ = api.get(path)
            assert status == 200, (path, body)
            assert not _leaks(json.dumps(body)), (path, _leaks(json.dumps(body)))
        (job,) = api.get("/api/jobs")[1]
        assert job["command"] == [PY, script, *RECORDED_ARGS]


def test_a_printed_secret_is_masked_in_the_evidence_and_a_resume_runs_the_real_argv(submitter, home, sqlite_url,
                                                                                     script, monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "fails")
    failed = submitter("submit", "--name", "leaky", "--", PY, script, *ARGS)
    assert failed.code == 1, failed.err
    run_id = failed.out.split()[0]

    (row,) = submitter("sql", "select termination_reason, termination_evidence from attempts", "--json").json()
    assert row["termination_reason"] == "code_error"
    assert not _leaks(row["termination_evidence"]), row["termination_evidence"]
    evidence = json.loads(row["termination_evidence"])
    # Masked, not removed: the evidence still says what happened. The API key has no shape in the
    # message; it is masked because redaction hid it from the command.
    assert any("RuntimeError: login as *** with *** refused" in line for line in evidence["lines"]), evidence
    assert evidence["signature"]["message"] == "login as *** with *** refused"
    # Nowhere else either: the SDK's own note of the exception (an event) repeats the message.
    assert not _leaks(_ledger_text(sqlite_url)), _leaks(_ledger_text(sqlite_url))

    # Resumed from a shell without MY_PASSWORD: the attempt gets the submitted argv and environment.
    monkeypatch.delenv("MY_PASSWORD")
    resumed = submitter("resume", "leaky")
    assert resumed.code == 0, resumed.err
    assert _seen(home, run_id) == [ARGS, ARGS]
    for args in (("explain", "leaky/1"), ("explain", "leaky/1", "--json"), ("show", "leaky/1"),
                 ("sql", "select * from attempts", "--json")):
        shown = submitter(*args)
        assert not _leaks(shown.out), (args, _leaks(shown.out))


def test_a_masked_command_whose_words_are_gone_is_not_run_with_the_mask(submitter, home, script, monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "fails")
    failed = submitter("submit", "--name", "lost", "--", PY, script, *ARGS)
    run_id = failed.out.split()[0]
    (home / "runs" / run_id / "secret-argv.json").unlink()

    resumed = submitter("resume", "lost")
    assert resumed.code != 0
    assert "secret-argv.json" in resumed.err and "submit the run again" in resumed.err
    assert not (home / "runs" / run_id / "attempts" / "2" / "argv-seen.json").exists()  # no process was started
    second = submitter("attempts", "lost", "--json").json()[-1]
    assert second["termination_reason"] == "config_error"


def test_show_and_explain_mask_the_same_config_values(submitter, script, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"api_key: {CONFIG_KEY}\nlr: 0.1\nlogging:\n  url: postgresql://u:{DB_PASSWORD}@host/db\n")
    done = submitter("submit", "--name", "configured", "--config", str(config), "--", PY, script)
    assert done.code == 0, done.err

    for args in (("show", "configured"), ("show", "configured", "--json"), ("explain", "configured"),
                 ("explain", "configured", "--json"), ("explain", "configured", "--markdown")):
        shown = submitter(*args)
        assert shown.code == 0, shown.err
        assert not _leaks(shown.out), (args, _leaks(shown.out))
    assert 'api_key = "***"' in submitter("show", "configured").out
    shown = submitter("show", "configured", "--json").json()["config"]
    explained = submitter("explain", "configured", "--json").json()["config"]["values"]
    assert shown == {"api_key": MASK, "lr": 0.1, "logging": {"url": f"postgresql://u:{MASK}@host/db"}}
    assert explained == {"api_key": MASK, "lr": 0.1, "logging.url": f"postgresql://u:{MASK}@host/db"}


def test_an_experiment_on_a_baseline_with_argv_secrets_runs_them_and_records_them_masked(submitter, home, script):
    baseline = submitter("submit", "--name", "base", "--", PY, script, *ARGS)
    assert baseline.code == 0, baseline.err
    created = submitter("experiment", "new", "--title", "lower lr", "--hypothesis", "a lower lr trains as well",
                        "--baseline", "base", "--set", "lr=0.05", "--expect", "final.loss <= baseline.final.loss")
    assert created.code == 0, created.err
    experiment = created.out.strip()
    submitter("experiment", "start", experiment)

    shown = submitter("experiment", "show", experiment, "--json").json()
    assert shown["command"] == [PY, script, *RECORDED_ARGS]
    test_run = shown["test_run"]["run_id"]
    assert _seen(home, test_run)[0] == ARGS  # the baseline's real arguments, not the masked ones
    for args in (("sql", "select * from experiments", "--json"), ("sql", "select * from runs", "--json"),
                 ("experiment", "report", experiment)):
        out = submitter(*args).out
        assert not _leaks(out), (args, _leaks(out))


@pytest.mark.parametrize(("argv", "recorded"), [
    (["train.py", "--token", TOKEN], ["train.py", "--token", MASK]),
    (["train.py", "-password", "x1"], ["train.py", "-password", MASK]),
    (["train.py", "--hf-token=abc", "--lr", "3e-4"], ["train.py", f"--hf-token={MASK}", "--lr", "3e-4"]),
    (["train.py", "--token", "--verbose"], ["train.py", "--token", "--verbose"]),  # a flag, not a value
    (["train.py", "--max-new-tokens", "128", "--eos-token-id", "2"],
     ["train.py", "--max-new-tokens", "128", "--eos-token-id", "2"]),
    (["train.py", f"--db={DB}"], ["train.py", f"--db=postgresql://u:{MASK}@host/db"]),
])
def test_argv_is_redacted_word_for_word(argv, recorded):
    assert redact_argv(argv) == recorded


def test_known_values_are_masked_wherever_they_appear_but_short_ones_are_not():
    known = known_values([ENV_PASSWORD, "hunter2", "1", "12345"])
    assert redact(f"step 1: logged in with {ENV_PASSWORD}!", known) == "step 1: logged in with ***!"
    assert redact("hunter2 and 12345 at step 1", known) == "*** and 12345 at step 1"


def test_a_failures_signature_key_does_not_depend_on_the_secret_in_its_message():
    """The key is a digest the redaction cannot reach: over a message holding the password, anyone reading the
    ledger could test guesses against it."""
    def key(password: str) -> str:
        signature = Signature(exception="RuntimeError", shape=f"login with {password} refused", where="train.py:3",
                              step=None)
        return signature.key_with(known_values([password]))

    assert key(ENV_PASSWORD) == key("another-password-value")


# -- config values ---------------------------------------------------------------------------------


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG_TEXT)
    return path


def _configs_seen(home: Path, run_id: str) -> list[dict]:
    """The config each attempt's script got from `trackway.init().config`, attempt 1 first."""
    attempts = sorted((home / "runs" / run_id / "attempts").iterdir(), key=lambda p: int(p.name))
    return [json.loads((a / "config-seen.json").read_text()) for a in attempts if (a / "config-seen.json").exists()]


def _ledger_rows(sqlite_url: str) -> dict[str, list[dict]]:
    """Every row of every table, blobs decompressed: what anyone who can read the ledger's file can read."""
    with closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db:
        db.row_factory = sqlite3.Row
        names = [r[0] for r in db.execute("select name from sqlite_master where type = 'table'")]
        rows = {name: [dict(r) for r in db.execute(f'select * from "{name}"')] for name in names}
    for blob in rows.get("blobs", []):
        blob["content"] = zlib.decompress(blob["content"]) if blob["compression"] == "zlib" else blob["content"]
    return rows


def _ledger_text(sqlite_url: str) -> str:
    return json.dumps(_ledger_rows(sqlite_url), default=lambda b: b.decode("utf-8", "replace"))


def _blob(sqlite_url: str, sha: str) -> bytes:
    return next(b["content"] for b in _ledger_rows(sqlite_url)["blobs"] if b["sha256"] == sha)


def test_config_secrets_are_masked_in_the_ledger_while_every_attempt_reads_them_as_given(
        submitter, home, sqlite_url, script, config_file, monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "preempted")
    done = submitter("submit", "--name", "keyed", "--config", str(config_file), "--", PY, script)
    assert done.code == 0, done.err
    run_id = done.out.split()[0]

    # The first attempt and the policy's retry both read the config as given.
    assert _configs_seen(home, run_id) == [GIVEN_CONFIG, GIVEN_CONFIG]
    assert [a["termination_reason"] for a in submitter("attempts", "keyed", "--json").json()] == ["preempted",
                                                                                                   "completed"]

    # The ledger holds the masked config, and its digest is over that form.
    assert not _leaks(_ledger_text(sqlite_url))
    (run,) = submitter("sql", "select config_sha256 from runs", "--json").json()
    recorded = canonical_json(RECORDED_CONFIG)
    assert run["config_sha256"] == hashlib.sha256(recorded).hexdigest()
    assert _blob(sqlite_url, run["config_sha256"]) == recorded
    for args in (("sql", "select * from blobs", "--json"), ("sql", "select * from attempts", "--json"),
                 ("show", "keyed", "--json"), ("explain", "keyed", "--json"), ("explain", "keyed", "--markdown")):
        shown = submitter(*args)
        assert shown.code == 0, (args, shown.err)
        assert not _leaks(shown.out), (args, _leaks(shown.out))
    # explain says what it cannot compare.
    assert "secret, kept outside the ledger as `***`: api_key, logging.url, wandb.token" in submitter(
        "explain", "keyed").out

    # The config as given is kept beside the run, readable by its owner only.
    kept = home / "runs" / run_id / "config.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and json.loads(kept.read_text()) == GIVEN_CONFIG

    with serving(home, sqlite_url) as (base, _):
        api = Api(base)
        for path in (f"/api/jobs/{run_id}", f"/api/runs/{run_id}/explain", f"/api/attempts/{run_id}/1/explain"):
            status, body, _ = api.get(path)
            assert status == 200, (path, body)
            assert not _leaks(json.dumps(body)), (path, _leaks(json.dumps(body)))
        explained = api.get(f"/api/runs/{run_id}/explain")[1]["config"]
        assert explained["values"]["api_key"] == MASK and explained["secret_keys"] == ["api_key", "logging.url",
                                                                                       "wandb.token"]


def test_resume_set_gives_the_script_the_config_as_given_and_records_it_masked(submitter, home, sqlite_url, script,
                                                                                config_file, monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "crashes")
    failed = submitter("submit", "--name", "reset", "--config", str(config_file), "--", PY, script)
    assert failed.code == 1, failed.err
    run_id = failed.out.split()[0]

    resumed = submitter("resume", "reset", "--set", "lr=0.05", "--set", f"hf_token={NEW_TOKEN}")
    assert resumed.code == 0, resumed.err
    assert _configs_seen(home, run_id) == [GIVEN_CONFIG, {**GIVEN_CONFIG, "lr": 0.05, "hf_token": NEW_TOKEN}]
    kept = home / "runs" / run_id / "attempts" / "2" / "config.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    assert not _leaks(_ledger_text(sqlite_url))
    second = submitter("attempts", "reset", "--json").json()[-1]
    assert "--set 'hf_token=***'" in second["started_by"]  # who resumed it, and how, without the token
    changed = submitter("explain", "reset/2", "--json").json()["config"]["differs_from_previous"]["keys"]
    assert changed == ['hf_token: "<absent>" → "***"', "lr: 0.1 → 0.05"]


def test_a_masked_config_whose_file_is_gone_is_not_run_with_the_mask(submitter, home, script, config_file,
                                                                     monkeypatch):
    monkeypatch.setenv("FIRST_ATTEMPT", "crashes")
    failed = submitter("submit", "--name", "lost-config", "--config", str(config_file), "--", PY, script)
    run_id = failed.out.split()[0]
    (home / "runs" / run_id / "config.json").unlink()

    resumed = submitter("resume", "lost-config", "--set", "lr=0.2")  # not a config of `lr` alone either
    assert resumed.code != 0
    assert "config.json" in resumed.err and "submit the run again" in resumed.err
    assert len(_configs_seen(home, run_id)) == 1  # no process was started
    assert submitter("attempts", "lost-config", "--json").json()[-1]["termination_reason"] == "config_error"


def test_an_experiment_on_a_baseline_with_config_secrets_runs_them_and_records_them_masked(
        submitter, home, sqlite_url, script, config_file):
    baseline = submitter("submit", "--name", "cbase", "--config", str(config_file), "--", PY, script)
    assert baseline.code == 0, baseline.err
    created = submitter("experiment", "new", "--title", "lower lr", "--hypothesis", "a lower lr trains as well",
                        "--baseline", "cbase", "--set", "lr=0.05", "--expect", "final.loss <= baseline.final.loss")
    assert created.code == 0, created.err
    experiment = created.out.strip()
    submitter("experiment", "start", experiment)  # the gate stops it (this script logs one loss): the test run ran

    shown = submitter("experiment", "show", experiment, "--json").json()
    assert shown["changes"] == [{"key": "lr", "before": 0.1, "after": 0.05}]
    assert _configs_seen(home, shown["test_run"]["run_id"])[0] == {**GIVEN_CONFIG, "lr": 0.05}
    kept = home / "experiments" / shown["experiment_id"] / "config.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    # A new key, changed only in its secret: a change all the same, said as the ledger shows it.
    rotated = submitter("experiment", "new", "--title", "new key", "--hypothesis", "the key does not matter",
                        "--baseline", "cbase", "--set", f"api_key={NEW_TOKEN}", "--expect",
                        "final.loss <= baseline.final.loss")
    assert rotated.code == 0, rotated.err
    assert submitter("experiment", "show", rotated.out.strip(), "--json").json()["changes"] == [
        {"key": "api_key", "before": MASK, "after": MASK}]
    assert not _leaks(_ledger_text(sqlite_url))
    for args in (("sql", "select * from experiments", "--json"), ("experiment", "report", experiment)):
        out = submitter(*args).out
        assert not _leaks(out), (args, _leaks(out))


def test_the_config_a_script_hands_init_is_merged_masked(submitter, home, sqlite_url, script, monkeypatch):
    monkeypatch.setenv("SCRIPT_CONFIG", json.dumps({"hf_token": NEW_TOKEN, "batch_size": 8}))
    done = submitter("submit", "--name", "said", "--", PY, script)
    assert done.code == 0, done.err
    (attempt,) = submitter("sql", "select config_sha256 from attempts", "--json").json()
    assert json.loads(_blob(sqlite_url, attempt["config_sha256"])) == {"hf_token": MASK, "batch_size": 8}
    assert not _leaks(_ledger_text(sqlite_url))


def test_a_standalone_scripts_config_is_registered_masked(home, sqlite_url):
    now = datetime.now(timezone.utc)
    run = dict(run_id="ralone", name=None, project="default", model_family=None, kind="full", state="running",
               command="[]", workdir="/w", resource="local", executor="inline", gpus=0, code_repo=None,
               code_branch=None, code_commit=None, created_at=now)
    attempt = dict(run_id="ralone", attempt_number=1, state="running", executor="inline", executor_job_id="1@0",
                   state_dir="/w/s", log_path="/w/s/output.log", host="h", gpu_count=0, code_commit=None,
                   started_at=now)
    given = canonical_json({"api_key": CONFIG_TOKEN, "lr": 0.1})
    ledger = open_ledger(sqlite_url)
    try:
        assert register_pending(ledger, write_pending(home, run, attempt, {"config": given, "environment": b"{}"}))
    finally:
        ledger.dispose()
    (row,) = _ledger_rows(sqlite_url)["runs"]
    assert json.loads(_blob(sqlite_url, row["config_sha256"])) == {"api_key": MASK, "lr": 0.1}


# -- the log stream --------------------------------------------------------------------------------

# Prints its loss, $MY_PASSWORD, a token cut in two by a pause (a follower reads between the halves),
# and a last line with no newline.
PRINTER = f"""
import json, os, sys, time
from pathlib import Path

import trackway

run = trackway.init()
(Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent / "config-seen.json").write_text(json.dumps(run.config))
for step in range(3):
    print(f"step {{step}} loss {{1.0 / (step + 1):.4f}}", flush=True)
print("MY_PASSWORD is", os.environ["MY_PASSWORD"], flush=True)
sys.stdout.write("token {TOKEN[:12]}")
sys.stdout.flush()
time.sleep(1.5)
print("{TOKEN[12:]} used", flush=True)
sys.stdout.write("last words {TOKEN}")
sys.stdout.flush()
run.finish()
"""
PRINTED = ["step 0 loss 1.0000", "step 1 loss 0.5000", "step 2 loss 0.3333", f"MY_PASSWORD is {MASK}",
           f"token sk-{MASK} used", f"last words sk-{MASK}"]


def _printed(log: str) -> list[str]:
    """What the script printed, line by line, without the shim's time and stream words or the separators."""
    return [line.split(" ", 2)[-1] for line in log.splitlines() if line.strip() and not line.startswith("=== ")]


def test_the_log_stream_is_redacted_followed_tailed_and_read_whole(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("MY_PASSWORD", ENV_PASSWORD)  # the server's, so the job's: a secret variable it keeps
    Path("printer.py").write_text(PRINTER)
    env = {"TRACKWAY_BACKGROUND_SUPERVISOR": "1"}  # the server hands its jobs to a background supervisor
    try:
        with serving(home, sqlite_url, env=env) as (base, _):
            api = Api(base)
            status, job, _ = api.post("/api/jobs", {"script": "printer.py", "name": "printer",
                                                    "config": {"api_key": CONFIG_TOKEN, "lr": 0.1}})
            assert status == 201, job
            status, followed, _ = api.get(f"/api/jobs/{job['id']}/logs?follow=true", timeout=120)
            assert status == 200
            assert followed.startswith(f"=== {job['id']}/1 ===\n") and _printed(followed) == PRINTED, followed
            whole = api.get(f"/api/jobs/{job['id']}/logs")[1]
            assert whole == followed
            tail = api.get(f"/api/jobs/{job['id']}/logs?tail=3")[1]
            assert _printed(tail) == PRINTED[-3:], tail
            tail_followed = api.get(f"/api/jobs/{job['id']}/logs?tail=2&follow=true")[1]
            assert _printed(tail_followed) == PRINTED[-2:], tail_followed
            for text in (followed, whole, tail, tail_followed):
                assert not _leaks(text) and TOKEN[:12] not in text, text
            # The job's config went to the script as given, and to the ledger masked.
            assert _configs_seen(home, job["id"]) == [{"api_key": CONFIG_TOKEN, "lr": 0.1}]
            assert not _leaks(_ledger_text(sqlite_url))
    finally:
        subprocess.run([sys.executable, "-m", "trackway", "supervise", "--stop"], capture_output=True,
                       env={**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}, timeout=60)


def _fed(redactor: LogRedactor, data: bytes, size: int) -> list[bytes]:
    """What `redactor` lets out for `data` read `size` bytes at a time, chunk by chunk."""
    return [redactor.feed(data[i:i + size]) for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 5, 64])
def test_a_log_read_in_any_chunks_lets_out_whole_lines_redacted(size):
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1c7\nq9o6TkCpV0Ah\n-----END RSA PRIVATE KEY-----\n"
    data = (f"loss 0.25 lr 3e-4\r\n{key}token {TOKEN}\nlogin {ENV_PASSWORD}\n10%|#  \r20%|## \rtail {TOKEN}").encode()
    redactor = LogRedactor(known_values([ENV_PASSWORD]))
    out = _fed(redactor, data, size)
    assert all(not _leaks(part.decode()) and TOKEN[:12].encode() not in part for part in out)
    assert b"".join(out).decode() == (
        f"loss 0.25 lr 3e-4\r\n-----BEGIN RSA PRIVATE KEY-----{MASK}{MASK}\n{MASK}\n{MASK}\n"
        f"{MASK}-----END RSA PRIVATE KEY-----\ntoken sk-{MASK}\nlogin {MASK}\n10%|#  \r20%|## \r")
    assert redactor.held == len(f"tail {TOKEN}") and redactor.end() == f"tail sk-{MASK}".encode()


def test_a_log_line_that_never_ends_is_let_out_in_bounded_pieces_and_other_bytes_pass():
    redactor = LogRedactor()
    assert redactor.feed(b"\xff\xfe not utf-8\n") == b"\xff\xfe not utf-8\n"
    out = redactor.feed(b"x" * (LogRedactor.MAX_LINE_BYTES + 10))
    assert len(out) == LogRedactor.MAX_LINE_BYTES + 10 and redactor.held == 0


# -- the SSH control directory ---------------------------------------------------------------------


@pytest.fixture
def control_dir(tmp_path, monkeypatch) -> Path:
    """Where the SSH control directory goes, under a temporary directory of this test's own (as $TMPDIR)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared / f"trackway-ssh-{os.getuid()}"


def _ssh_command(client: SshClient) -> str:
    return " ".join(client.argv("true"))


def test_the_ssh_control_directory_is_made_private(control_dir):
    client = SshClient(SshTarget.parse("trainer@gpu1"))
    assert f"ControlPath={control_dir}/" in _ssh_command(client)
    assert stat.S_IMODE(control_dir.stat().st_mode) == 0o700


def test_an_ssh_control_directory_others_can_write_is_refused(control_dir):
    control_dir.mkdir()
    control_dir.chmod(0o777)
    with pytest.raises(ExecutorError) as refused:
        _ssh_command(SshClient(SshTarget.parse("trainer@gpu1")))
    message = str(refused.value)
    assert "\n" not in message
    assert str(control_dir) in message and "can be written by other users (mode 0777)" in message
    assert "remove it" in message and "TMPDIR" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the directory to another user needs root")
def test_an_ssh_control_directory_another_user_owns_is_refused(control_dir):
    control_dir.mkdir(mode=0o700)
    os.chown(control_dir, 65534, 65534)  # nobody
    with pytest.raises(ExecutorError) as refused:
        _ssh_command(SshClient(SshTarget.parse("trainer@gpu1")))
    assert str(control_dir) in str(refused.value) and "owned by uid 65534" in str(refused.value)
