"""`trackway sql`'s boundary, tried as someone allowed to query the ledger would try to cross it (issue 31).

Before: on PostgreSQL the guard was a list of names, so `table_to_xml('pg_authid', …)`,
`database_to_xml(…)`, pg_settings and pg_hba_file_rules answered, and pg_stat_activity showed other
sessions' SQL; on SQLite `'aaaa…!' ~ '(a+)+$'` ran Python's `re` for 44 s in one step that no time
limit stops; results had no row cap; and a remembered query was run without being checked again.
Now the database enforces it: on PostgreSQL the query runs as a role that may read the ledger only.
Every attempt below is refused and leaves the ledger as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from api_server import Api, serving
from ledger_state import ledger_state
from waiting import wait_for
from trackway.errors import InputError, LedgerError, ReadOnlyViolation
from trackway.ledger import Ledger, open_ledger
from trackway.ledger.sql.readonly import _execute, reader_role_names, run_readonly_query
from trackway.ledger.sql.remembered import entry_path
from trackway.ledger.records import insert_attempt, insert_run

SECRET_MARKER = "trackway_boundary_marker_7f3a"

BYPASSES = {  # id: a query that tries to cross the boundary
    "table-to-xml-pg-authid": "select table_to_xml('pg_authid', true, false, '')",
    "table-to-xml-qualified": "select table_to_xml('pg_catalog.pg_authid', true, false, '')",
    "table-to-xmlschema": "select table_to_xmlschema('pg_authid', true, false, '')",
    "query-to-xml": "select query_to_xml('select rolpassword from pg_authid', true, false, '')",
    "query-to-xml-dollar-quoted": "select query_to_xml($q$select rolpassword from pg_authid$q$, true, false, '')",
    "database-to-xml": "select database_to_xml(true, false, '')",
    "schema-to-xml": "select schema_to_xml('pg_catalog', true, false, '')",
    "cursor-to-xml": "select cursor_to_xml('c', 10, false, false, '')",
    "pg-read-file": "select pg_read_file('/etc/passwd')",
    "pg-read-binary-file": "select pg_read_binary_file('postgresql.conf')",
    "pg-ls-dir": "select * from pg_ls_dir('.')",
    "pg-stat-file": "select (pg_stat_file('pg_hba.conf')).size",
    "lo-import": "select lo_import('/etc/hostname')",
    "lo-get": "select lo_get(1)",
    "lo-export": "select lo_export(1, '{tmp}/exported')",
    "pg-largeobject": "select * from pg_largeobject",
    "copy-to-program": "copy (select 1) to program 'touch {tmp}/pwned'",
    "copy-to-file": "copy runs to '{tmp}/runs.csv'",
    "dblink": "select * from dblink('dbname=postgres', 'select rolpassword from pg_authid') as t(p text)",
    "pg-authid": "select rolname, rolpassword from pg_authid",
    "pg-authid-qualified": "select rolpassword from pg_catalog.pg_authid",
    "pg-authid-quoted-upper": 'select * from "PG_AUTHID"',
    "pg-authid-unicode-escape": 'select * from U&"\\0070g_authid"',
    "pg-authid-in-a-subquery": "select (select rolpassword from pg_authid limit 1)",
    "pg-shadow-in-values": "values ((select passwd from pg_shadow limit 1))",
    "pg-settings-data-directory": "select setting from pg_settings where name = 'data_directory'",
    "pg-settings-hba-file": "select setting from pg_catalog.pg_settings where name = 'hba_file'",
    "current-setting-data-directory": "select current_setting('data_directory')",
    "pg-hba-file-rules": "select * from pg_hba_file_rules",
    "pg-file-settings": "select * from pg_file_settings",
    "writable-cte": "with x as (delete from runs returning *) select * from x",
    "writable-cte-update": "with x as (update runs set state = 'failed' returning 1) select count(*) from x",
    "comment-then-delete": "select 1; -- \n delete from runs",
    "dollar-quote-then-delete": "select $$a$$; delete from runs",
    "set-role": "set role postgres",
    "reset-role": "reset role",
    "set-session-authorization": "set session authorization postgres",
    "set-config-role": "select set_config('role', 'postgres', true)",
    "set-config-qualified": "select pg_catalog.set_config('role', 'postgres', true)",
    "set-config-timeout": "select set_config('statement_timeout', '0', true)",
    "explain-analyze-delete": "explain analyze delete from runs",
    "explain-analyze-writable-cte": "explain analyze with x as (delete from runs returning 1) select * from x",
    "prepare": "prepare p as delete from runs",
    "execute": "execute p",
    "do-block": "do $$ begin delete from runs; end $$",
    "do-block-set-role": "do $$ begin set role postgres; raise exception '%', (select count(*) from pg_authid); end $$",
    "call": "call evil()",
    "attach": "attach database '{tmp}/evil.db' as evil",
    "pragma-writable-schema": "pragma writable_schema=1",
    "pragma-writable-schema-call": "pragma writable_schema(1)",
    "load-extension": "select load_extension('{tmp}/evil.so')",
    "readfile": "select readfile('/etc/passwd')",
    "advisory-lock": "select pg_advisory_lock(1)",
    "terminate-backend": "select pg_terminate_backend(pg_backend_pid())",
}


@pytest.fixture(scope="module")
def shared(module_ledger: Ledger) -> Ledger:
    """One filled ledger per backend for the tests that only read: each that runs a refused statement checks that
    nothing changed, so a write that got through fails that test, not a later one's setup."""
    return fill(module_ledger)


def fill(ledger: Ledger) -> Ledger:
    """One completed run and its attempt."""
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(
            run_id="r1", name="r1", project="p", model_family="reasoning", kind="full", state="completed",
            command='["python", "train.py"]', workdir="/tmp", resource="local", executor="local", gpus=1, created_at=now,
        ))  # fmt: skip
        insert_attempt(conn, dict(
            run_id="r1", attempt_number=1, state="ended", executor="local", state_dir="/tmp/s", log_path="/tmp/l",
            gpu_count=1, started_at=now, ended_at=now, gpu_seconds=60.0, termination_reason="completed",
        ))  # fmt: skip
    return ledger


def _one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


@pytest.mark.parametrize("query", list(BYPASSES.values()), ids=list(BYPASSES))
def test_every_bypass_is_refused_and_the_ledger_is_unchanged(shared, tmp_path: Path, query):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = ledger_state(shared)
    with pytest.raises(InputError) as info:  # ReadOnlyViolation is one, and so is a query the database rejects
        run_readonly_query(shared, query.format(tmp=scratch))
    assert _one_line(str(info.value))
    assert ledger_state(shared) == before
    assert list(scratch.iterdir()) == []


def test_a_comment_hides_nothing(shared):
    before = ledger_state(shared)
    assert run_readonly_query(shared, "select 1 /* ; delete from runs */").rows == [(1,)]
    assert run_readonly_query(shared, "select 1 -- ; delete from runs").rows == [(1,)]
    assert ledger_state(shared) == before


# --- the database, not the name list, is what refuses (PostgreSQL) --------------------------------

DATABASE_REFUSES = [  # sent past the name check, straight to the database as `trackway sql` sends it
    "select table_to_xml('pg_authid', true, false, '')",
    "select table_to_xml('pg_catalog.pg_authid', true, false, '')",
    "select query_to_xml('select rolpassword from pg_authid', true, false, '')",
    "select rolpassword from pg_authid",
    'select * from U&"\\0070g_authid"',
    "select passwd from pg_shadow",
    "select * from pg_hba_file_rules",
    "select * from pg_file_settings",
    "select current_setting('data_directory')",
    "select pg_read_file('/etc/passwd')",
    "select pg_read_binary_file('postgresql.conf')",
    "select * from pg_ls_dir('.')",
    "select lo_import('/etc/hostname')",
    "select * from pg_largeobject",
    "copy (select 1) to program 'id'",
    "select set_config('role', 'postgres', true)",
    "select set_config('statement_timeout', '0', true)",
    "do $$ begin set role postgres; raise exception '%', (select count(*) from pg_authid); end $$",
]


@pytest.fixture(scope="module")
def shared_pg(module_pg_url: str) -> Iterator[Ledger]:
    """One PostgreSQL ledger for the module's PostgreSQL-only refusals, each checking that nothing changed."""
    ledger = open_ledger(module_pg_url)
    yield ledger
    ledger.dispose()


@pytest.mark.parametrize("sql", DATABASE_REFUSES)
def test_the_reader_role_refuses_what_the_name_check_would_miss(shared_pg, sql):
    before = ledger_state(shared_pg)
    with pytest.raises(ReadOnlyViolation) as info:
        _execute(shared_pg, sql)
    message = str(info.value)
    assert _one_line(message) and ("permission denied" in message or "must be superuser" in message)
    assert ledger_state(shared_pg) == before


def test_what_the_reader_may_see_of_the_server_is_only_what_any_role_sees(pg_url):
    ledger = open_ledger(pg_url)
    try:
        assert _execute(ledger, "select current_user").rows == [(reader_role_names("x")[1],)]
        hidden = "select name, setting from pg_settings where name in ('data_directory', 'hba_file', 'config_file')"
        assert _execute(ledger, hidden).rows == []
        dumped = _execute(ledger, "select database_to_xml(true, false, '')::text").rows[0][0]
        assert "<runs>" in dumped and "pg_authid" not in dumped and "rolpassword" not in dumped
    finally:
        ledger.dispose()


def test_other_sessions_sql_is_not_visible(pg_url):
    import psycopg

    ledger = open_ledger(pg_url)
    dsn = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    other = psycopg.connect(dsn, autocommit=True)
    sleeper = threading.Thread(target=lambda: other.execute(f"select pg_sleep(3) as {SECRET_MARKER}"), daemon=True)
    try:
        sleeper.start()
        with psycopg.connect(dsn, autocommit=True) as admin:  # the superuser sees it: it is running
            wait_for(lambda: admin.execute("select count(*) from pg_stat_activity where query like %s",
                                           (f"%as {SECRET_MARKER}%",)).fetchone()[0],
                     "the other session's query in pg_stat_activity", timeout=10, interval=0.05)
        for query in ("select query from pg_stat_activity", "select pg_stat_get_backend_activity(s) "
                      "from pg_stat_get_backend_idset() s"):
            result = run_readonly_query(ledger, query)
            assert result.rows and not any(SECRET_MARKER in str(row) for row in result.rows)
    finally:
        sleeper.join(timeout=10)
        other.close()
        ledger.dispose()


# --- regular expressions and time limits -----------------------------------------------------------

BLOW_UPS = [
    "select 'aaaaaaaaaaaaaaaaaaaaaaaaaaaa!' ~ '(a+)+$'",
    "select '" + "a" * 5000 + "!' ~ '(a*)*b'",
    "select '" + "ab" * 2000 + "' ~ '(a|b|ab)*c'",
    "select name from runs where name || '" + "a" * 3000 + "' ~ '^(a|aa)+$'",
]


@pytest.mark.parametrize("query", BLOW_UPS, ids=["nested-plus", "nested-star", "alternation", "per-row"])
def test_a_regular_expression_cannot_outrun_the_time_limit(shared, query):
    # How long it takes is bench/bench_sql_limits.py's figure (target: --timeout plus one second).
    try:
        result = run_readonly_query(shared, query, timeout_s=1)
    except InputError as exc:  # stopped by the limit is fine too; running past it is not
        assert "longer than --timeout 1s" in str(exc) or "regular expression" in str(exc)
    else:
        assert result.rows in ([(0,)], [(False,)], [])


def test_a_backreference_on_sqlite_is_one_line_naming_re2(sqlite_url):
    ledger = open_ledger(sqlite_url)
    try:
        with pytest.raises(InputError) as info:
            run_readonly_query(ledger, r"select 'aa' ~ '(a)\1'")
        message = str(info.value)
        assert _one_line(message) and "RE2" in message and "backreferences" in message
        assert run_readonly_query(ledger, "select 'abc' ~ '^a.c$', 'abc' !~ 'x'").rows == [(1, 1)]
    finally:
        ledger.dispose()


# One call of a SQLite built-in over megabytes is one step of its virtual machine: no progress
# handler or interrupt() breaks into it (78 s for this instr with --timeout 1). Its caller still
# has the answer within --timeout + 1 s: the CLI's process ends, the API's worker is killed. The
# tests hold what the caller gets; bench/bench_sql_limits.py measures how soon (its target: that bound).
ONE_STEP_BLOW_UPS = {
    "instr": "select instr(hex(zeroblob(2000000)), hex(zeroblob(1000000)) || '1')",
    "replace": "select length(replace(hex(zeroblob(2000000)), hex(zeroblob(1000000)) || '1', 'x'))",
}


def _trackway(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackway", *args], env=env, capture_output=True, text=True,
                          timeout=120)  # a hang guard: left to itself the query runs for minutes


@pytest.mark.parametrize("query", list(ONE_STEP_BLOW_UPS.values()), ids=list(ONE_STEP_BLOW_UPS))
def test_one_uninterruptible_step_ends_the_cli_within_the_timeout(home, sqlite_url, query):
    env = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": sqlite_url}
    warm = _trackway(env, "sql", "select 1")  # the ledger made and migrated
    assert warm.returncode == 0, warm.stderr
    done = _trackway(env, "sql", "--timeout", "1", query)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.startswith("trackway: error: trackway sql: the query ran longer than --timeout 1s")
    assert _one_line(done.stderr.strip())


def _children(pid: int) -> set[int]:
    listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(line) for line in listed.split()}


def test_one_uninterruptible_step_answers_the_api_within_the_timeout(home, sqlite_url):
    with serving(home, sqlite_url) as (base, process):
        api = Api(base)
        assert api.post("/api/sql", {"query": "select 1"})[0] == 200  # a worker started and warm
        workers = _children(process.pid)
        for query in ONE_STEP_BLOW_UPS.values():
            status, answer, _ = api.post("/api/sql", {"query": query, "timeout_s": 1})
            assert status == 400 and answer["error"]["type"] == "InputError", (status, answer)
            assert answer["error"]["message"].startswith("trackway sql: the query ran longer than --timeout 1s")
            status, answer, _ = api.post("/api/sql", {"query": "select 1"})  # the server still answers
            assert status == 200 and answer["rows"] == [[1]]
        replaced = _children(process.pid)
        assert replaced and not (workers & replaced), (workers, replaced)  # each killed worker gave way to a fresh one


# --- the API tokens ---------------------------------------------------------------------------------

TOKEN_READS = {
    "table": "select * from api_tokens",
    "count": "select count(*) from api_tokens",
    "qualified": "select token_sha256 from public.api_tokens",
    "quoted": 'select token_sha256 from "api_tokens"',
    "cte": "with t as (select * from api_tokens) select token_sha256 from t",
    "subquery": "select (select token_sha256 from api_tokens limit 1)",
    "exists": "select 1 where exists (select 1 from api_tokens where token_sha256 like 'a%')",
    "join": "select r.run_id, t.name from runs r, api_tokens t",
}


@pytest.fixture(scope="module")
def with_token(shared: Ledger) -> tuple[Ledger, str]:
    """The shared ledger with an API token in it (added once; the tests below only try to read it)."""
    from trackway.ledger.tokens import add_token, digest

    with shared.write() as conn:
        token = add_token(conn, "ana", "admin")
    return shared, digest(token)


@pytest.mark.parametrize("query", list(TOKEN_READS.values()), ids=list(TOKEN_READS))
def test_the_api_tokens_are_not_readable(with_token, query):
    ledger, digest = with_token
    sent = query.replace("public.", "") if ledger.dialect == "sqlite" else query
    with pytest.raises(ReadOnlyViolation) as info:
        run_readonly_query(ledger, sent)
    message = str(info.value)
    assert _one_line(message) and digest not in message
    assert "api_tokens is not readable through trackway sql: use `trackway token list`" in message


@pytest.mark.parametrize("query", ["select * from api_tokens", "select (select token_sha256 from api_tokens limit 1)",
                                   "with t as (select * from api_tokens) select * from t"])
def test_the_database_refuses_the_api_tokens_past_the_name_check(with_token, query):
    ledger, digest = with_token
    with pytest.raises(ReadOnlyViolation) as info:
        _execute(ledger, query)
    message = str(info.value)
    expected = "permission denied for table api_tokens" if ledger.dialect == "postgresql" else "is not readable"
    assert _one_line(message) and expected in message and digest not in message


def test_a_view_over_the_api_tokens_is_refused_on_sqlite(sqlite_url):
    from trackway.ledger.tokens import add_token

    ledger = open_ledger(sqlite_url)
    try:
        with ledger.write() as conn:
            add_token(conn, "ana", "admin")
            conn.execute(text("create view token_view as select name, token_sha256 from api_tokens"))
        with pytest.raises(ReadOnlyViolation, match="api_tokens is not readable"):
            run_readonly_query(ledger, "select * from token_view")
        # The table's shape is no secret (it is in the schema); its rows are.
        shape = run_readonly_query(ledger, "select name from pragma_table_info('api_tokens')").rows
        assert ("token_sha256",) in shape
    finally:
        ledger.dispose()


def test_the_reader_role_may_not_read_the_api_tokens(pg_url):
    ledger = open_ledger(pg_url)
    try:
        with ledger.read() as conn:
            role = reader_role_names(conn.execute(text("select current_database()")).scalar_one())[1]
            may = "select has_table_privilege(:role, :table, 'SELECT')"
            assert conn.execute(text(may), {"role": role, "table": "api_tokens"}).scalar_one() is False
            assert conn.execute(text(may), {"role": role, "table": "runs"}).scalar_one() is True
    finally:
        ledger.dispose()


# --- row cap ----------------------------------------------------------------------------------------


def test_rows_past_the_cap_are_left_out_and_said_so(ledger):
    many = "with recursive n(i) as (select 1 union all select i + 1 from n where i < 50000) select i from n"
    result = run_readonly_query(ledger, many, max_rows=10)
    assert [row[0] for row in result.rows] == list(range(1, 11)) and result.truncated
    exact = run_readonly_query(ledger, "values (1), (2)", max_rows=2)
    assert exact.rows == [(1,), (2,)] and not exact.truncated


@pytest.mark.parametrize("bad", [0, -1, 10_000_001, 2.5, "10", True])
def test_a_bad_row_cap_names_max_rows(sqlite_url, bad):
    with pytest.raises(InputError, match=r"^--max-rows: expected a whole number of rows from 1 to 10000000"):
        run_readonly_query(sqlite_url, "select 1", max_rows=bad)


# --- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("query", [
    "select table_to_xml('pg_authid', true, false, '')",
    "with x as (delete from runs returning *) select * from x",
    "select set_config('role', 'postgres', true)",
    "select 1; -- \n delete from runs",
])  # fmt: skip
def test_the_cli_refuses_with_exit_2_and_one_line(cli, query):
    done = cli("sql", query)
    assert done.code == 2 and done.out == ""
    assert _one_line(done.err.strip())
    assert cli("sql", "select count(*) as n from runs", "--json").json() == [{"n": 0}]


def test_the_cli_caps_rows_and_says_so_on_stderr(cli):
    done = cli("sql", "values (1), (2), (3)", "--max-rows", "2", "--json")
    assert done.code == 0 and done.json() == [{"column1": 1}, {"column1": 2}]
    assert "showing the first 2 rows; the query returned more" in done.err and "--max-rows" in done.err
    whole = cli("sql", "values (1), (2)", "--max-rows", "2", "--json")
    assert whole.code == 0 and whole.err == ""
    bad = cli("sql", "select 1", "--max-rows", "0")
    assert bad.code == 2 and "--max-rows" in bad.err


# --- remembered queries ---------------------------------------------------------------------------------


def _remembered(url: str, query: str, remember: Path) -> Path:
    ledger = open_ledger(url)
    try:
        return entry_path(query, ledger.dialect, remember)
    finally:
        ledger.dispose()


def test_a_tampered_sqlite_entry_is_refused_by_the_database(sqlite_url, tmp_path):
    remember = tmp_path / "cache"
    assert run_readonly_query(sqlite_url, "select count(*) from runs", remember_in=remember).rows == [(0,)]
    entry = _remembered(sqlite_url, "select count(*) from runs", remember)
    entry.write_text("DELETE FROM runs")  # this user's own file: trusted as its text, refused by the database
    with pytest.raises(ReadOnlyViolation):
        run_readonly_query(sqlite_url, "select count(*) from runs", remember_in=remember)


@pytest.mark.parametrize("how", ["group-writable", "symlink", "directory-shared"])
def test_an_entry_others_could_have_written_is_checked_again(sqlite_url, tmp_path, how):
    remember = tmp_path / "cache"
    open_ledger(sqlite_url).dispose()
    entry = _remembered(sqlite_url, "select 7", remember)
    remember.mkdir(mode=0o700)
    forged = tmp_path / "forged.sql"
    forged.write_text("DELETE FROM runs")
    if how == "group-writable":
        entry.write_text("DELETE FROM runs")
        entry.chmod(0o664)
    elif how == "symlink":
        entry.symlink_to(forged)
    else:
        entry.write_text("DELETE FROM runs")
        remember.chmod(0o777)
    assert run_readonly_query(sqlite_url, "select 7", remember_in=remember).rows == [(7,)]


def test_a_postgresql_entry_is_a_marker_and_a_forged_one_meets_the_reader_role(pg_url, tmp_path):
    remember = tmp_path / "cache"
    ledger = open_ledger(pg_url)
    try:
        before = ledger_state(ledger)
        assert run_readonly_query(ledger, "select 1 as one;", remember_in=remember).rows == [(1,)]
        entry = entry_path("select 1 as one;", "postgresql", remember)
        assert entry.read_text() == ""  # no SQL text: the query itself is what runs
        entry.write_text("DELETE FROM runs")
        assert run_readonly_query(ledger, "select 1 as one;", remember_in=remember).rows == [(1,)]
        # A marker for a query the check refuses skips the check; the database still refuses it.
        refused = "select set_config('role', 'postgres', true)"
        entry_path(refused, "postgresql", remember).write_text("")
        with pytest.raises(ReadOnlyViolation, match="permission denied for function set_config"):
            run_readonly_query(ledger, refused, remember_in=remember)
        assert ledger_state(ledger) == before
    finally:
        ledger.dispose()


# --- the API ------------------------------------------------------------------------------------------------


def test_the_api_refuses_with_4xx_and_caps_rows(home, ledger_url):
    with serving(home, ledger_url) as (base, _process):
        api = Api(base)
        for query in ("select table_to_xml('pg_authid', true, false, '')", "delete from runs",
                      "with x as (delete from runs returning *) select * from x", "select pg_read_file('/etc/passwd')",
                      "select set_config('role', 'postgres', true)"):
            status, answer, _ = api.post("/api/sql", {"query": query})
            assert status in (400, 403), (query, status, answer)
            assert _one_line(answer["error"]["message"])
        status, answer, _ = api.post("/api/sql", {"query": "values (1), (2), (3)", "max_rows": 2})
        assert status == 200 and answer["rows"] == [[1], [2]] and answer["truncated"] is True and answer["max_rows"] == 2
        status, answer, _ = api.post("/api/sql", {"query": "values (1)"})
        assert status == 200 and "truncated" not in answer
        status, _, _ = api.post("/api/sql", {"query": "select 1", "max_rows": 0})
        assert status == 422
        status, answer, _ = api.post("/api/sql", {"query": "select count(*) from runs"})
        assert answer["rows"] == [[0]]


# --- owners that are not superusers ------------------------------------------------------------------------


@pytest.fixture
def owned_database():
    """`make(createrole)`: a fresh, unmigrated database owned by a new non-superuser role; its URL and names."""
    admin_url = make_url(os.environ.get("TRACKWAY_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    made: list[tuple[str, str]] = []

    def make(createrole: bool) -> tuple[str, str, str]:
        suffix = uuid.uuid4().hex[:10]
        owner, database = f"tw_owner_{suffix}", f"trackway_o_{suffix}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{owner}" LOGIN {"CREATEROLE" if createrole else ""}'))
            conn.execute(text(f'CREATE DATABASE "{database}" OWNER "{owner}"'))
        made.append((owner, database))
        url = admin_url.set(username=owner, database=database).render_as_string(hide_password=False)
        return url, owner, database

    yield make
    with admin.connect() as conn:
        for owner, database in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            reader = reader_role_names(database)[0]
            conn.execute(text(f'DROP ROLE IF EXISTS "{reader}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{owner}"'))
    admin.dispose()


def test_an_owner_with_createrole_gets_its_own_reader(owned_database):
    url, owner, database = owned_database(createrole=True)
    ledger = open_ledger(url)
    try:
        assert _execute(ledger, "select current_user, session_user").rows == [(reader_role_names(database)[0], owner)]
        with pytest.raises(ReadOnlyViolation, match="permission denied for table pg_authid"):
            _execute(ledger, "select table_to_xml('pg_authid', true, false, '')")
        assert run_readonly_query(ledger, "select count(*) from training_attempts").rows == [(0,)]
    finally:
        ledger.dispose()


def test_without_a_reader_role_sql_refuses_and_names_the_fix(owned_database, capfd):
    url, owner, database = owned_database(createrole=False)
    ledger = open_ledger(url)  # the migration goes through, and says what is missing
    reader = reader_role_names(database)[0]
    assert f"cannot create role {reader}" in capfd.readouterr().err
    try:
        with pytest.raises(LedgerError) as info:
            run_readonly_query(ledger, "select 1")
        message = str(info.value)
        assert _one_line(message) and reader in message and "docs/guide/sql.md" in message
        # What docs/guide/sql.md tells a database administrator to run, then the owner:
        admin = create_engine(make_url(url).set(username="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{reader}" NOLOGIN'))
            conn.execute(text(f'GRANT "{reader}" TO "{owner}"'))
            conn.execute(text(f'GRANT pg_read_all_settings TO "{reader}"'))  # a mistake, refused below
        with ledger.write() as conn:
            conn.execute(text(f'GRANT USAGE ON SCHEMA public TO "{reader}"'))
            conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{reader}"'))
            conn.execute(text(f'ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO "{reader}"'))
        with pytest.raises(LedgerError, match=f"will not run as role {reader}"):
            run_readonly_query(ledger, "select 1")
        with admin.connect() as conn:
            conn.execute(text(f'REVOKE pg_read_all_settings FROM "{reader}"'))
        admin.dispose()
        with pytest.raises(LedgerError, match=f"will not run as role {reader}: it may read the server's API tokens"):
            run_readonly_query(ledger, "select 1")
        with ledger.write() as conn:
            conn.execute(text(f'REVOKE SELECT ON api_tokens FROM "{reader}"'))
        assert run_readonly_query(ledger, "select current_user").rows == [(reader,)]
        with pytest.raises(ReadOnlyViolation, match="permission denied for table pg_authid"):
            _execute(ledger, "select table_to_xml('pg_authid', true, false, '')")
    finally:
        ledger.dispose()
