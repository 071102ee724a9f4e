"""Secrets never reach the ledger (issue 31), while every attempt still runs with them.

Before: `trackway submit train.py --token sk-... --api-key=abc --db postgresql://u:pw@host/db` kept the argv as
typed in `runs.command`, where `trackway sql`, `show`, `explain` and `GET /api/jobs` gave it to anyone; a script
printing `$MY_PASSWORD` put the value in the attempt's evidence although trackway holds that exact value; `show`
printed a config's `api_key` that `explain` masked; and the SSH control directory in /tmp was used whoever
owned it and whatever its mode.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from api_server import Api, serving
from trackway.errors import ExecutorError
from trackway.executors.ssh_transport import SshClient, SshTarget
from trackway.redaction import MASK, known_values, redact, redact_argv
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
SECRETS = (TOKEN, API_KEY, DB_PASSWORD, ENV_PASSWORD, CONFIG_KEY)

# Writes the arguments it got beside its spool, so the test sees what each attempt really ran with.
# FIRST_ATTEMPT says how attempt 1 ends: preempted (the policy retries it), or failing with an error
# that quotes the API key and $MY_PASSWORD (the policy stops; a person resumes).
SCRIPT = """
import json, os, signal, sys, time
from pathlib import Path

import trackway

attempt = os.environ["TRACKWAY_ATTEMPT_NUMBER"]
(Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent / "argv-seen.json").write_text(json.dumps(sys.argv[1:]))
run = trackway.init()
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
    assert "--token *** --api-key=*** --db postgresql://u:***@host/db --login *** --lr 3e-4" in submitter(
        "show", "tokened").out

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


def test_a_printed_secret_is_masked_in_the_evidence_and_a_resume_runs_the_real_argv(submitter, home, script,
                                                                                     monkeypatch):
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
