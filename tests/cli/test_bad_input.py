"""Every bad input is refused as bad input: exit 2, one line naming the option and what it expects, nothing recorded.

Each case here once ended as `internal error` (exit 1) or was accepted and stored; the cases run
on SQLite and PostgreSQL because the two overflow and truncate differently.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PY = sys.executable
NEUTRAL = str(Path(__file__).parent / "scripts" / "neutral.py")
HUGE = str(2**63)  # one past the largest SQL BIGINT
LONG_NAME = "n" * 201  # runs.name is String(200)


def _counts(cli) -> dict:
    (row,) = cli(
        "sql",
        "select (select count(*) from runs) as runs, (select count(*) from attempts) as attempts, "
        "(select count(*) from blobs) as blobs, (select count(*) from evaluations) as evaluations",
        "--json",
    ).json()
    return row


def _refused(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def recorded(cli):
    """One run that logged `loss` in the ledger, so that 'nothing changed' has something to change."""
    result = cli("submit", "--name", "good", "--", PY, NEUTRAL, "3")
    assert result.code == 0, result.err
    return _counts(cli)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    """A valid eval spec with seeds [0, 1] (its evaluator never runs: every case is refused first)."""
    (tmp_path / "evaluator.py").write_text("")
    (tmp_path / "tasks.jsonl").write_text("")
    path = tmp_path / "toy.toml"
    path.write_text(f'name = "toy"\ncommand = ["{PY}", "evaluator.py"]\ntask_set = "tasks.jsonl"\nseeds = [0, 1]\n')
    return path


def test_a_directory_where_a_file_is_expected(cli, recorded, tmp_path):
    directory = tmp_path / "spec.toml"
    directory.mkdir()
    _refused(cli("submit", "--eval", str(directory), "--", PY, "-c", "pass"), "--eval", "directory")
    _refused(cli("eval", "good", "--spec", str(directory)), "--spec", "directory")
    _refused(cli("submit", "--config", str(directory), "--", PY, "-c", "pass"), "--config", "directory")
    assert _counts(cli) == recorded


def test_supervise_interval_out_of_range(cli, recorded):
    for interval in ("-1", "nan", "0", "1e308", "inf"):
        _refused(cli("supervise", "--once", "--interval", interval), "--interval", "0.05", "3600")
    assert _counts(cli) == recorded


def test_limits_are_checked_before_the_database_sees_them(cli, recorded):
    for value in (HUGE, "-1"):
        for command in (["runs"], ["attempts"], ["attempts", "good"], ["metrics", "good"]):
            _refused(cli(*command, "--limit", value), "--limit", value)
    assert _counts(cli) == recorded


def test_attempt_and_step_numbers_beyond_what_the_ledger_holds(cli, recorded, spec_file):
    ref = "good/99999999999999999999"
    for command in ("logs", "show", "explain"):
        _refused(cli(command, ref), ref, "from 1 to")
    step = "good@99999999999999999999"
    _refused(cli("eval", step, "--spec", str(spec_file)), step, "STEP")
    _refused(cli("eval", "compare", step, "good@1"), step, "STEP")
    assert _counts(cli) == recorded


def test_report_days_out_of_range(cli, recorded):
    for days in ("nan", "inf", "1e308", "0", "-3"):
        _refused(cli("report", "waste", "--days", days), "--days", "100 years")
    assert _counts(cli) == recorded


def test_home_that_is_a_file(cli, recorded, tmp_path):
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    _refused(cli("--home", str(file), "runs"), "--home", str(file), "expected a directory")
    _refused(cli("--home", str(file / "below"), "runs"), "--home", f"{file} is a file")
    assert file.read_text() == "x"
    assert _counts(cli) == recorded


def test_time_limit_must_be_finite_and_sane(cli, recorded):
    for limit in ("inf", "nan", "1e6", "0", "-1"):
        _refused(cli("submit", "--time-limit", limit, "--", PY, "-c", "pass"), "--time-limit", "10 years")
    assert _counts(cli) == recorded


def test_names_that_cannot_be_stored_or_printed_back(cli, recorded):
    cases = [
        ("--name", LONG_NAME, "at most 200 characters"),
        ("--project", "p" * 201, "at most 200 characters"),
        ("--model-family", "m" * 201, "at most 200 characters"),
        ("--name", "red\x1b[31mname", "U+001B"),
        ("--project", "a\x07b", "U+0007"),
        ("--model-family", "abc\u202edcba", "U+202E"),
        ("--name", "r0123456789", "look like a run or evaluation id"),
        ("--name", " padded ", "leading or trailing spaces"),
        ("--name", "a@b", "'@'"),
        ("--project", "   ", "non-empty"),
    ]
    for option, value, fragment in cases:
        _refused(cli("submit", option, value, "--", PY, "-c", "pass"), option, fragment)
    assert _counts(cli) == recorded


def test_a_name_that_is_another_runs_id(cli, recorded):
    (good,) = cli("runs", "--json").json()
    _refused(cli("submit", "--name", good["run_id"], "--", PY, "-c", "pass"), "--name", good["run_id"])
    # The run is still addressed by its id, and only by it.
    assert cli("show", good["run_id"], "--json").json()["name"] == "good"
    assert _counts(cli) == recorded


def test_a_metric_key_that_does_not_exist_names_the_ones_that_do(cli, recorded):
    _refused(cli("metrics", "good", "--key", "los"), "--key los", "good", "it has loss")
    assert len(cli("metrics", "good", "--key", "loss", "--json").json()) == 3
    assert _counts(cli) == recorded


def test_eval_seeds_beyond_the_spec_are_not_invented(cli, recorded, spec_file):
    for seeds in ("3", "99", HUGE):
        _refused(cli("eval", "good", "--spec", str(spec_file), "--seeds", seeds), f"--seeds {seeds}", "seeds 0, 1")
    assert _counts(cli) == recorded


def test_non_finite_numbers_in_files(cli, recorded, spec_file):
    spec_file.write_text(spec_file.read_text() + "time_limit_hours = inf\n")
    _refused(cli("eval", "good", "--spec", str(spec_file)), "time_limit_hours", "10 years")
    _refused(cli("submit", "--eval", str(spec_file), "--", PY, "-c", "pass"), "time_limit_hours")
    toml = Path("trackway.toml")
    for body, field in [
        ("[supervisor]\nstall_seconds = nan\n", "stall_seconds"),
        ("[resources.local]\ngrace_seconds = inf\n", "grace_seconds"),
        ("[resources.local]\ncost_per_gpu_hour = -1.0\n", "cost_per_gpu_hour"),
    ]:
        toml.write_text(body)
        _refused(cli("runs"), "trackway.toml", field)
    toml.unlink()
    assert _counts(cli) == recorded
