"""A PostgreSQL ledger read through libpq alone gives what psycopg gives, and the read commands import neither
psycopg nor SQLAlchemy."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timezone

import pytest

from trackway.errors import LedgerUnavailable
from trackway.ledger import libpq
from trackway.ledger.reader import open_reader, plain_postgres, postgres_conninfo

VALUES = (
    "SELECT true AS yes, false AS no, 7::int2 AS small, 70000::int4 AS mid, 9007199254740993::int8 AS big,"
    " 0.1::float8 AS tenth, 1e-300::float8 AS tiny, 0.1::float4 AS single, 'NaN'::float8 AS nan,"
    " 'café ☃'::text AS word, 'x'::varchar(8) AS short, '\\x00ff10'::bytea AS raw,"
    " '2026-11-01 12:30:15.123456+00'::timestamptz AS stamp, '2026-11-01 12:30:15+05:30'::timestamptz AS east,"
    " 1.50::numeric AS exact, NULL::text AS nothing, (SELECT count(*) FROM generate_series(1, 3)) AS counted,"
    " CAST(:a AS text) AS a_as_text, :a AS a_again, :flag AS flag, :n + 1 AS n_plus_one, :x * 2 AS x_twice,"
    " '50%' AS percent, 'a:b' AS colon"
)
PARAMS = {"a": "it's", "flag": True, "n": 41, "x": 0.25}


def test_values_read_through_libpq_equal_what_psycopg_reads(pg_url):
    import psycopg

    conninfo = postgres_conninfo(pg_url)
    assert conninfo is not None
    conn = libpq.connect(conninfo)
    try:
        columns, rows = conn.execute(VALUES, PARAMS)
    finally:
        conn.close()
    psycopg_sql = VALUES.replace("%", "%%")
    for name in PARAMS:
        psycopg_sql = psycopg_sql.replace(f":{name} ", f"%({name})s ")
    with psycopg.connect(conninfo) as reference:
        cursor = reference.execute(psycopg_sql, PARAMS)
        expected = cursor.fetchone()
        assert columns == [d.name for d in cursor.description]
    got = rows[0]
    for name, mine, theirs in zip(columns, got, expected):
        if name == "nan":
            assert mine != mine and theirs != theirs
            continue
        assert type(mine) is type(theirs) and mine == theirs, name
    stamp = dict(zip(columns, got))["stamp"]
    assert stamp.tzinfo is not None and stamp.astimezone(timezone.utc).microsecond == 123456


def test_a_failed_statement_is_named_as_the_drivers_name_it(pg_url):
    conn = libpq.connect(postgres_conninfo(pg_url))
    try:
        with pytest.raises(libpq.ProgrammingError) as missing:
            conn.execute("SELECT * FROM no_such_table")
        assert missing.value.sqlstate == "42P01" and "no_such_table" in str(missing.value)
    finally:
        conn.close()


def test_an_unreachable_server_gives_the_ledger_error_every_command_gives():
    with pytest.raises(LedgerUnavailable, match="cannot open the ledger"):
        with open_reader("postgresql+psycopg://postgres@127.0.0.1:1/nothing_here"):
            pass


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:5432/ledger",
    "postgresql://alice:s3cret@db.example.org/ml_runs",
    "postgresql+psycopg://bob:@10.0.0.7:6543/x-y.z",
])
def test_a_plain_server_url_is_named_as_sqlalchemy_names_it(url):
    from sqlalchemy.engine import make_url

    from trackway.supervisor.lock_file import _identity

    parsed = make_url(url)
    assert plain_postgres(url) is not None
    assert _identity(url) == parsed.set(drivername="postgresql", password=None).render_as_string(hide_password=False)


def test_runs_show_and_explain_read_postgresql_without_psycopg_or_sqlalchemy(pg_url, tmp_path):
    env = {**os.environ, "TRACKWAY_HOME": str(tmp_path / "home"), "TRACKWAY_DB": pg_url,
           "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    done = subprocess.run([sys.executable, "-m", "trackway", "submit", "--name", "quick", "--", sys.executable, "-c",
                           "pass"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = (
        "import sys; from trackway.cli.errors import run_app; from trackway.cli.main import app; "
        "code = run_app(app, sys.argv[1:]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic', 'psycopg'}), file=sys.stderr)"
    )
    for command in (["runs", "--json"], ["show", "quick"], ["explain", "quick"]):
        shown = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, env=env,
                               cwd=tmp_path, timeout=120)
        assert shown.returncode == 0 and "quick" in shown.stdout, (command, shown.stderr)
        assert shown.stderr.strip().splitlines()[-1] == "[]", (command, shown.stderr)
