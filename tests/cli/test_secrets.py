"""Secrets a user's script prints stay out of the ledger; files that can hold credentials are private;
`trackway sql` cannot read the server's configuration and stops a query that runs too long."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

PY = sys.executable
HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
PASSWORD = "hunter2-pw"
DB_URL = f"postgresql://trainer:{PASSWORD}@db.internal/metrics"

LEAKY_SCRIPT = f"""
import sys
print("HF_TOKEN={HF}", flush=True)
print("connecting to {DB_URL}", file=sys.stderr, flush=True)
raise RuntimeError("could not log in to {DB_URL} with HF_TOKEN={HF}")
"""


def _one_line_error(result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_a_script_that_prints_its_token_does_not_publish_it_in_the_ledger(cli, tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY_SCRIPT)
    assert cli("submit", "--name", "leaky", "--", PY, str(script)).code == 1

    (row,) = cli("sql", "select termination_reason, termination_evidence from attempts", "--json").json()
    assert row["termination_reason"] == "code_error"
    evidence = row["termination_evidence"]
    assert HF not in evidence and PASSWORD not in evidence
    # The evidence is still there and still says what happened, with the secrets masked.
    lines = json.loads(evidence)["lines"]
    assert any("RuntimeError: could not log in to postgresql://trainer:***@db.internal/metrics with HF_TOKEN=***" in line
               for line in lines), lines  # fmt: skip

    for args in (("explain", "leaky"), ("explain", "leaky", "--json"), ("explain", "leaky", "--markdown")):
        shown = cli(*args)
        assert shown.code == 0, shown.err
        assert HF not in shown.out and PASSWORD not in shown.out
        assert "trainer:***@db.internal" in shown.out


STANDALONE_SCRIPT = """
import trackway
run = trackway.init(config={"lr": 0.1, "wandb_api_key": "0123456789abcdef"}, name="alone")
run.log({"loss": 1.0}, step=1)
run.finish()
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_a_standalone_script_leaves_under_home_are_private(home, tmp_path):
    """A script run alone writes its receipt (config, command, git diff) to a pending file while the
    ledger is away; that file and the run's config.json may hold credentials."""
    script = tmp_path / "alone.py"
    script.write_text(STANDALONE_SCRIPT)
    env = {
        **os.environ,
        "TRACKWAY_DB": "postgresql+psycopg://trainer:pw@127.0.0.1:1/nowhere",  # nothing listens: the ledger is away
        "TRACKWAY_LEDGER_PATIENCE_S": "0.5",
    }
    done = subprocess.run(
        [PY, str(script)], env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.umask(0o022),  # the usual umask, under which a plain open() makes 0644
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "could not reach the ledger" in done.stderr
    (pending,) = (home / "pending").glob("*.json")
    (config,) = (home / "runs").glob("*/config.json")
    assert "wandb_api_key" in config.read_text()
    assert _mode(pending) == 0o600, oct(_mode(pending))
    assert _mode(config) == 0o600, oct(_mode(config))


def test_sql_refuses_the_servers_configuration_and_credentials(cli):
    for query, named in [
        ("select * from pg_file_settings", "pg_file_settings"),
        ("select * from pg_hba_file_rules", "pg_hba_file_rules"),
        ("select name, setting from pg_catalog.pg_settings", "pg_settings"),
        ("select current_setting('primary_conninfo')", "current_setting('primary_conninfo')"),
        ("select rolpassword from pg_authid", "pg_authid"),
        ("select pg_read_file('/etc/passwd')", "pg_read_file"),
    ]:
        _one_line_error(cli("sql", query), named, "configuration, files or credentials")


@pytest.mark.parametrize("bad", ["nan", "inf", "-1", "0", "1e308", "86401"])
def test_sql_timeout_must_be_a_finite_positive_number_of_seconds(cli, bad):
    _one_line_error(cli("sql", "select 1", "--timeout", bad), "--timeout", "above 0")


def test_a_query_longer_than_the_timeout_is_stopped_with_one_line(cli, ledger_url):
    if ledger_url.startswith("sqlite"):
        slow = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 1000000000) select count(*) from c"
    else:
        slow = "select pg_sleep(5)"
    _one_line_error(cli("sql", slow, "--timeout", "1"), "longer than --timeout 1s")
    # The ledger is unharmed and answers the next query.
    assert cli("sql", "select count(*) as n from runs", "--json").json() == [{"n": 0}]
