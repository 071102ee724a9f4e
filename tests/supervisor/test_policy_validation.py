"""A retry policy is refused whole when any key or value is wrong: exit 2, one line naming file and field.

Regression for issue 9.10 (policy part) and 9.8: unknown keys and infinite, NaN or absurd values
in a `--retry-policy` file were accepted (an infinite backoff parks a run forever; a typo'd key
silently leaves the default in force), and a directory for `--retry-policy` was an internal error.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

PY = sys.executable


def _refused(cli, result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert cli("runs", "--json").json() == []  # refused before anything was recorded
    return lines[0]


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("retries = 3\n", ["retries: unknown key", "gpu_hours_budget"]),
        ("[reasons.preempted]\nbudgit = 3\n", ["[reasons.preempted] budgit: unknown key", "budget"]),
        ("[reasons.infra_transient]\nbackoff_seconds = inf\n", ["[reasons.infra_transient] backoff_seconds inf", "finite"]),
        ("[reasons.infra_transient]\nbackoff_seconds = -5\n", ["backoff_seconds -5", "from 0"]),
        ("[reasons.infra_transient]\nbackoff_factor = nan\n", ["backoff_factor nan", "finite"]),
        ("[reasons.infra_transient]\nbackoff_max_seconds = 1e308\n", ["backoff_max_seconds 1e+308", "seconds"]),
        ("[reasons.preempted]\nbudget = 1e9\n", ["budget 1000000000.0", "whole number"]),
        ("[reasons.preempted]\nbudget = 100000\n", ["budget 100000", "whole number of retries from 0 to"]),
        ("[reasons.preempted]\nbudget = true\n", ["budget true", "whole number"]),
        ("[reasons.preempted]\naction = 'resume'\nbackoff_seconds = '30'\n", ["backoff_seconds '30'", "number of seconds"]),
        ("gpu_hours_budget = inf\n", ["gpu_hours_budget inf", "finite number of GPU-hours"]),
        ("gpu_hours_budget = nan\n", ["gpu_hours_budget nan"]),
        ("gpu_hours_budget = -1\n", ["gpu_hours_budget -1", "positive"]),
        ("reasons = 3\n", ["reasons 3", "[reasons.NAME]"]),
        ("[reasons]\noom = 3\n", ["[reasons.oom]", "expected a table"]),
    ],
)
def test_each_bad_field_is_named(cli, tmp_path, text, fragments):
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    result = cli("submit", "--retry-policy", str(policy), "--", PY, "-c", "pass")
    _refused(cli, result, f"--retry-policy {policy}:", *fragments)


def test_a_directory_is_not_a_policy_file(cli, tmp_path):
    result = cli("submit", "--retry-policy", str(tmp_path), "--", PY, "-c", "pass")
    _refused(cli, result, f"--retry-policy {tmp_path}:", "found a directory")


def test_an_unreadable_policy_file_is_refused(cli, tmp_path):
    # A socket is a file that no one can read as text, whoever runs the test (root reads chmod 000 files).
    path = tmp_path / "policy.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        result = cli("submit", "--retry-policy", str(path), "--", PY, "-c", "pass")
    finally:
        server.close()
    _refused(cli, result, f"--retry-policy {path}:", "expected a readable TOML file")


def test_a_policy_file_that_is_not_text_is_refused(cli, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_bytes(b"\xff\xfe[reasons]\n")
    _refused(cli, cli("submit", "--retry-policy", str(path), "--", PY, "-c", "pass"), "UTF-8")


def test_trackway_toml_retry_is_checked_the_same_way(cli):
    Path("trackway.toml").write_text("[retry.reasons.infra_transient]\nbackoff_seconds = inf\n")
    result = cli("submit", "--", PY, "-c", "pass")
    _refused(cli, result, "trackway.toml [retry]", "backoff_seconds inf")

