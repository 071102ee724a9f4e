"""Bad input is answered with one line and exit code 2, and nothing is recorded half-way."""

from __future__ import annotations

import sys

import pytest

PY = sys.executable


def _counts(cli) -> dict:
    (row,) = cli(
        "sql",
        "select (select count(*) from runs) as runs, (select count(*) from attempts) as attempts, "
        "(select count(*) from blobs) as blobs",
        "--json",
    ).json()
    return row


def _one_line_error(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def recorded(cli):
    """One good run in the ledger, so that 'nothing lost' has something to lose."""
    assert cli("submit", "--name", "good", "--set", "lr=0.1", "--", PY, "-c", "pass").code == 0
    return _counts(cli)


def test_unknown_run_id(cli, recorded):
    _one_line_error(cli("show", "r_nope"), "r_nope", "trackway runs")
    _one_line_error(cli("attempts", "r_nope"), "r_nope")
    _one_line_error(cli("logs", "good/7"), "good/7", "1 attempt")
    _one_line_error(cli("cancel", "r_nope"), "r_nope")
    assert _counts(cli) == recorded


@pytest.mark.parametrize("bad", ["lr", "=3", "a..b=1", ".a=1"])
def test_malformed_set(cli, recorded, bad):
    _one_line_error(cli("submit", "--set", bad, "--", PY, "-c", "pass"), "--set")
    assert _counts(cli) == recorded


def test_missing_data_path(cli, recorded, tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    _one_line_error(cli("submit", "--data", str(missing), "--", PY, "-c", "pass"), "--data", "nowhere.jsonl")
    assert _counts(cli) == recorded


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [("cfg.toml", "[train\nlr = 1", "TOML"), ("cfg.yaml", "a: [1, 2", "YAML"), ("cfg.json", "{'a': 1}", "JSON")],
)
def test_config_that_does_not_parse(cli, recorded, tmp_path, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    _one_line_error(cli("submit", "--config", str(path), "--", PY, "-c", "pass"), "--config", fragment)
    assert _counts(cli) == recorded


def test_duplicate_name_and_bad_numbers(cli, recorded):
    _one_line_error(cli("submit", "--name", "good", "--", PY, "-c", "pass"), "--name", "good")
    _one_line_error(cli("submit", "--kind", "huge", "--", PY, "-c", "pass"), "--kind")
    _one_line_error(cli("submit", "--time-limit", "-1", "--", PY, "-c", "pass"), "--time-limit")
    _one_line_error(cli("submit", "--repo", "x", "--", PY, "-c", "pass"), "--repo")
    _one_line_error(cli("submit"), "COMMAND")
    _one_line_error(cli("submit", "--gpus", "1", "--", PY, "-c", "pass"), "--gpus")
    assert _counts(cli) == recorded


@pytest.mark.parametrize(
    "query",
    [
        "delete from runs",
        "insert into blobs (sha256, kind, size, compression, content, created_at) values ('x','x',0,'none','', now())",
        "drop view training_attempts",
        "update attempts set termination_reason = 'completed'",
    ],
)
def test_non_read_only_sql(cli, recorded, query):
    _one_line_error(cli("sql", query), "read-only")
    assert _counts(cli) == recorded


def test_unexpected_errors_show_no_traceback_unless_debug(cli_process, tmp_path):
    # A ledger path that is a directory cannot be opened: one line, no traceback.
    bad = tmp_path / "dir.db"
    bad.mkdir()
    result = cli_process("--db", f"sqlite:///{bad}", "runs")
    assert result.code != 0 and "Traceback" not in result.err
    assert len([line for line in result.err.splitlines() if line.strip()]) == 1
    debug = cli_process("--debug", "--db", f"sqlite:///{bad}", "runs")
    assert "Traceback" in debug.err


def test_usage_errors_exit_2(cli_process):
    result = cli_process("runs", "--no-such-flag")
    assert result.code == 2 and "--no-such-flag" in result.err
