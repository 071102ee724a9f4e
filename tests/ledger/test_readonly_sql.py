"""`trackway sql` reads the ledger in PostgreSQL's dialect on both backends and changes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger_state import ledger_state
from trackway.errors import InputError, ReadOnlyViolation
from trackway.ledger import Ledger, open_ledger
from trackway.ledger.sql.readonly import QueryResult, _execute, check_timeout, run_readonly_query
from trackway.ledger.records import insert_attempt, insert_run

ALLOWED = "(only SELECT, WITH … SELECT, VALUES, EXPLAIN and read-only PRAGMA)"

DESIGN_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= now() - interval '7 days' "
    "group by termination_reason order by gpu_hours desc;"
)

VIEW_COLUMNS = [
    "attempt_id", "run_id", "run_name", "project", "model_family", "run_kind", "attempt_number", "executor",
    "executor_job_id", "host", "gpu_model", "gpu_count", "started_at", "ended_at", "gpu_seconds", "cost_usd",
    "exit_code", "signal", "termination_reason", "termination_evidence", "config_sha256", "data_manifest_sha256",
    "environment_sha256", "code_commit", "code_dirty_sha256", "resumed_from_checkpoint", "first_step", "last_step",
    "checkpoints_committed", "useful_gpu_seconds", "wasted_gpu_seconds", "retry_decision", "environ_sha256", "started_by",
]  # fmt: skip

# (run, started this long ago, gpu_seconds, termination_reason)
ATTEMPTS = [
    ("rsn", timedelta(days=30), 99_999.0, "oom"),
    ("rsn", timedelta(days=3), 3_600.0, "preempted"),
    ("rsn", timedelta(days=1), 7_200.0, "preempted"),
    ("rsn", timedelta(days=1), 36_000.0, "oom"),
    ("rsn", timedelta(hours=1), 1_800.0, "completed"),
    ("vis", timedelta(days=1), 50_000.0, "preempted"),
    ("rsn-eval", timedelta(days=1), 500.0, "evaluator_crash"),
]


@pytest.fixture
def filled(ledger: Ledger) -> Ledger:
    """A ledger of its own, filled (`fill`): for a test that writes."""
    return fill(ledger)


@pytest.fixture(scope="module")
def shared(module_ledger: Ledger) -> Ledger:
    """One filled ledger per backend for the tests that only read: each that runs a refused statement checks that
    nothing changed, so a write that got through fails that test, not a later one's setup."""
    return fill(module_ledger)


def fill(ledger: Ledger) -> Ledger:
    """Reasoning, vision and an evaluation run (which the view leaves out), attempts from 1h to 30 days ago."""
    now = datetime.now(timezone.utc)
    families = {"rsn": ("reasoning", "full"), "vis": ("vision", "full"), "rsn-eval": ("reasoning", "eval")}
    with ledger.write() as conn:
        for name, (family, kind) in families.items():
            insert_run(conn, dict(
                run_id=name, name=name, project="arcagi", model_family=family, kind=kind, state="completed",
                command='["python", "train.py"]', workdir="/tmp", resource="local", executor="local", gpus=8,
                created_at=now - timedelta(days=31),
            ))  # fmt: skip
        numbers: dict[str, int] = {}
        for run_id, ago, gpu_seconds, reason in ATTEMPTS:
            numbers[run_id] = numbers.get(run_id, 0) + 1
            insert_attempt(conn, dict(
                run_id=run_id, attempt_number=numbers[run_id], state="ended", executor="local",
                state_dir="/tmp/state", log_path="/tmp/log", gpu_count=8, started_at=now - ago,
                ended_at=now - ago + timedelta(minutes=30), gpu_seconds=gpu_seconds, termination_reason=reason,
            ))  # fmt: skip
    return ledger


def _one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


def test_the_design_query_runs_verbatim(shared):
    result = run_readonly_query(shared, DESIGN_QUERY)
    assert isinstance(result, QueryResult) and not result.truncated
    assert result.columns == ["termination_reason", "attempts", "gpu_hours"]
    # Last 7 days, reasoning only: the 30-day-old oom, the vision run and the eval run are left out.
    assert result.rows == [
        ("oom", 1, pytest.approx(10.0)),
        ("preempted", 2, pytest.approx(3.0)),
        ("completed", 1, pytest.approx(0.5)),
    ]
    if shared.dialect == "sqlite":
        assert "DATETIME(CURRENT_TIMESTAMP, '-7 days')" in result.executed_sql
        assert "INTERVAL" not in result.executed_sql.upper()
    else:
        assert result.executed_sql == DESIGN_QUERY.rstrip(";")


def test_view_has_exactly_the_documented_columns(ledger):
    result = run_readonly_query(ledger, "select * from training_attempts limit 0")
    assert result.columns == VIEW_COLUMNS
    assert result.rows == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("select attempt_id from training_attempts where started_at >= now() - interval '2 hours'", ["rsn/5"]),
        (
            "select attempt_id from training_attempts where interval '2 days' + started_at > now()",
            ["rsn/3", "rsn/4", "rsn/5", "vis/1"],
        ),
        (
            "select attempt_id from training_attempts where started_at > now() - interval '1 day 12 hours'",
            ["rsn/3", "rsn/4", "rsn/5", "vis/1"],
        ),
        (
            "select attempt_id from training_attempts "
            "where started_at between now() - interval '1 week' and now() - interval '2 days'",
            ["rsn/2"],
        ),
        ("select attempt_id from training_attempts where started_at < now() - '7 days'::interval", ["rsn/1"]),
        (
            "select attempt_id from training_attempts where started_at + interval '90 minutes' >= current_timestamp",
            ["rsn/5"],
        ),
    ],
)
def test_interval_arithmetic_against_now(shared, query, expected):
    result = run_readonly_query(shared, query + " order by attempt_id")
    assert [row[0] for row in result.rows] == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("timestamp '2026-03-14 15:00:00' - interval '1 day 2 hours'", "2026-03-13 13:00:00"),
        ("interval '1 week' + timestamp '2026-03-14 15:00:00'", "2026-03-21 15:00:00"),
        ("timestamp '2026-03-14 15:00:00' - interval '90 minutes'", "2026-03-14 13:30:00"),
        ("timestamp '2026-01-15 00:00:00' + interval '1 month'", "2026-02-15 00:00:00"),
        ("timestamp '2026-03-14 15:00:00' - interval '-3 days'", "2026-03-17 15:00:00"),
        ("timestamp '2026-03-14 15:00:00' - interval '1 day' - interval '2 hours'", "2026-03-13 13:00:00"),
        ("timestamp '2026-03-14 15:00:00' + interval '2' hour", "2026-03-14 17:00:00"),
        ("date_trunc('day', timestamp '2026-03-14 15:09:26')", "2026-03-14 00:00:00"),
        ("date_trunc('month', timestamp '2026-03-14 15:09:26')", "2026-03-01 00:00:00"),
    ],
)
def test_timestamp_expressions_agree_on_both_backends(shared, expression, expected):
    result = run_readonly_query(shared, f"select ({expression})::text as t")
    assert result.rows == [(expected,)]


def test_extract_and_regex_match(shared):
    result = run_readonly_query(
        shared,
        "select extract(epoch from timestamp '2026-03-14 15:09:26'), extract(year from timestamp '2026-03-14'), "
        "date_part('hour', timestamp '2026-03-14 15:09:26')",
    )
    (epoch, year, hour), = result.rows
    assert (float(epoch), int(year), int(hour)) == (1773500966.0, 2026, 15)
    names = run_readonly_query(shared, "select name from runs where name ~ '^rsn-' order by name")
    assert names.rows == [("rsn-eval",)]


def test_cte_select(shared):
    result = run_readonly_query(
        shared,
        "with recent as (select * from training_attempts where started_at >= now() - interval '7 days') "
        "select run_name, count(*) as n from recent group by run_name order by run_name",
    )
    assert result.columns == ["run_name", "n"]
    assert result.rows == [("rsn", 4), ("vis", 1)]


def test_ilike(shared):
    result = run_readonly_query(shared, "select name from runs where name ilike 'RSN%' order by name")
    assert result.rows == [("rsn",), ("rsn-eval",)]
    if shared.dialect == "sqlite":
        assert "ILIKE" not in result.executed_sql.upper()


def test_values_union_and_explain(shared):
    assert run_readonly_query(shared, "values (1, 'a'), (2, 'b')").rows == [(1, "a"), (2, "b")]
    assert run_readonly_query(shared, "select 1 as n union all select 2 order by n").rows == [(1,), (2,)]
    plan = run_readonly_query(shared, "explain select * from training_attempts where run_id = 'rsn'")
    assert plan.rows
    if shared.dialect == "sqlite":
        assert plan.executed_sql.startswith("EXPLAIN QUERY PLAN SELECT")


def test_read_only_pragmas_on_sqlite(sqlite_url):
    ledger = open_ledger(sqlite_url)
    try:
        info = run_readonly_query(ledger, "PRAGMA table_info(runs)")
        assert "name" in info.columns and "run_id" in [row[info.columns.index("name")] for row in info.rows]
        assert run_readonly_query(ledger, "pragma journal_mode").rows == [("wal",)]
        listed = run_readonly_query(ledger, "select name from pragma_table_info('attempts') where pk = 1")
        assert listed.rows == [("attempt_id",)]
    finally:
        ledger.dispose()


def test_pragma_on_postgresql_is_an_input_error(pg_url):
    ledger = open_ledger(pg_url)
    try:
        with pytest.raises(InputError, match="SQLite ledger only") as info:
            run_readonly_query(ledger, "pragma table_info(runs)")
        assert not isinstance(info.value, ReadOnlyViolation)
    finally:
        ledger.dispose()


REFUSED = {
    "insert": "insert into runs (run_id, project, kind, state, command, workdir, resource, executor, gpus, created_at) "
    "values ('x', 'p', 'full', 'queued', '[]', '/', 'local', 'local', 0, now())",
    "update": "update runs set state = 'failed'",
    "delete": "delete from attempts",
    "merge": "merge into runs r using attempts a on r.run_id = a.run_id when matched then delete",
    "create": "create table evil (a int)",
    "create-index": "create index ix_evil on runs (project)",
    "alter": "alter table runs add column evil int",
    "drop": "drop view training_attempts",
    "truncate": "truncate attempts",
    "attach": "attach database '{tmp}/evil.db' as evil",
    "detach": "detach database main",
    "vacuum": "vacuum",
    "copy": "copy runs to '{tmp}/runs.csv'",
    "pragma-assignment": "pragma journal_mode=delete",
    "pragma-query-only": "pragma query_only = off",
    "pragma-call-assignment": "pragma user_version(7)",
    "select-into": "select * into evil from runs",
    "for-update": "select * from runs for update",
    "for-share-in-subquery": "select (select count(*) from (select * from runs for share) s)",
    "writable-cte": "with gone as (delete from attempts returning *) select count(*) from gone",
    "set": "set search_path = evil",
    "begin": "begin",
    "commit": "commit",
    "start-transaction": "start transaction read write",
    "terminate-backend": "select pg_terminate_backend(1)",
    "qualified-terminate": "select pg_catalog.pg_terminate_backend(pg_backend_pid())",
    "lo-import": "select lo_import('/etc/hostname')",
    "set-config": "select set_config('transaction_read_only', 'off', false)",
    "nextval": "select nextval('evil')",
    "advisory-lock": "select pg_advisory_lock(1)",
    "sql-in-a-string": "select query_to_xml('delete from attempts', true, true, '')",
    "explain-delete": "explain analyze delete from attempts",
    "two-statements": "select 1; select 2",
    "select-then-delete": "select 1; delete from attempts",
    "lock": "lock table runs",
    "notify": "notify evil",
}


@pytest.mark.parametrize("query", list(REFUSED.values()), ids=list(REFUSED))
def test_refused_and_nothing_changes(shared, tmp_path: Path, query):
    scratch = tmp_path / "scratch"  # where ATTACH and COPY would write
    scratch.mkdir()
    before = ledger_state(shared)
    with pytest.raises(ReadOnlyViolation) as info:
        run_readonly_query(shared, query.format(tmp=scratch))
    message = str(info.value)
    assert _one_line(message)
    assert message.startswith("trackway sql is read-only: ") and message.endswith(ALLOWED)
    assert ledger_state(shared) == before
    assert list(scratch.iterdir()) == []


def test_refusal_names_what_was_refused(ledger):
    with pytest.raises(ReadOnlyViolation) as info:
        run_readonly_query(ledger, "INSERT INTO runs (run_id) VALUES ('x')")
    assert str(info.value) == f"trackway sql is read-only: INSERT is not allowed {ALLOWED}"
    with pytest.raises(ReadOnlyViolation, match="more than one statement"):
        run_readonly_query(ledger, "select 1; select 2")


@pytest.mark.parametrize(
    "sql",
    [
        "delete from attempts",
        "update runs set state = 'failed'",
        "create table evil (a int)",
        "drop view training_attempts",
    ],
)
def test_the_database_refuses_writes_the_classifier_missed(shared, sql):
    """Defense in depth: the read-only transaction alone stops a write that reached the database."""
    before = ledger_state(shared)
    with pytest.raises(ReadOnlyViolation) as info:
        _execute(shared, sql)
    assert _one_line(str(info.value))
    assert ledger_state(shared) == before


@pytest.mark.parametrize(
    "sql",
    [
        "select 1; commit; delete from attempts",
        "select 1; delete from attempts",
    ],
)
def test_the_database_runs_one_statement_at_most(shared, sql):
    before = ledger_state(shared)
    with pytest.raises(InputError) as info:
        _execute(shared, sql)
    assert _one_line(str(info.value))
    assert ledger_state(shared) == before


def test_queries_run_in_a_transaction_the_database_keeps_read_only(ledger):
    if ledger.dialect == "sqlite":
        assert run_readonly_query(ledger, "pragma query_only").rows == [(1,)]
    else:
        setting = run_readonly_query(ledger, "select current_setting('transaction_read_only')")
        assert setting.rows == [("on",)]


def test_sqlite_authorizer_refuses_attach_and_pragma_assignment(sqlite_url, tmp_path: Path):
    ledger = open_ledger(sqlite_url)
    try:
        before = ledger_state(ledger)
        for sql in (f"attach database '{tmp_path}/evil.db' as evil", "pragma query_only=0", "pragma journal_mode=delete"):
            with pytest.raises(ReadOnlyViolation):
                _execute(ledger, sql)
        assert ledger_state(ledger) == before
        assert not (tmp_path / "evil.db").exists()
    finally:
        ledger.dispose()


def test_the_ledger_is_writable_again_afterwards(filled):
    run_readonly_query(filled, "select count(*) from runs")
    with pytest.raises(ReadOnlyViolation):
        run_readonly_query(filled, "delete from runs")
    with filled.write() as conn:
        conn.execute(text("update runs set state = 'failed' where run_id = 'vis'"))
    assert run_readonly_query(filled, "select state from runs where run_id = 'vis'").rows == [("failed",)]


def test_unparseable_query_is_an_input_error(shared):
    with pytest.raises(InputError) as info:
        run_readonly_query(shared, "select * from (")
    message = str(info.value)
    assert message.startswith("trackway sql: cannot parse the query: ") and _one_line(message)
    assert not isinstance(info.value, ReadOnlyViolation)


@pytest.mark.parametrize(
    ("query", "mentions"),
    [
        ("select * from no_such_table", "no_such_table"),
        ("select no_such_column from training_attempts", "no_such_column"),
    ],
)
def test_database_errors_are_one_line_input_errors(shared, query, mentions):
    with pytest.raises(InputError) as info:
        run_readonly_query(shared, query)
    message = str(info.value)
    assert message.startswith("trackway sql: ") and mentions in message and _one_line(message)
    assert not isinstance(info.value, ReadOnlyViolation)


@pytest.mark.parametrize("query", ["", "  ;  ", "-- nothing here"])
def test_empty_query_is_an_input_error(shared, query):
    with pytest.raises(InputError, match="the query is empty"):
        run_readonly_query(shared, query)


@pytest.mark.parametrize(
    ("query", "mentions"),
    [
        ("select now() + 2 * interval '1 day'", "cannot translate"),
        ("select now() - interval '3 fortnights'", "fortnights"),
        ("select date_trunc('millennium', now())", "date_trunc"),
    ],
)
def test_untranslatable_queries_say_so_on_sqlite(sqlite_url, query, mentions):
    ledger = open_ledger(sqlite_url)
    try:
        with pytest.raises(InputError, match=mentions) as info:
            run_readonly_query(ledger, query)
        assert _one_line(str(info.value))
    finally:
        ledger.dispose()


# --- the server's configuration and credentials; time limits ------------------------------------

SERVER_SECRETS = [  # (what the refusal names, a query that reads it)
    ("pg_file_settings", "select * from pg_file_settings"),
    ("pg_hba_file_rules", "select * from pg_hba_file_rules"),
    ("pg_ident_file_mappings", "select * from pg_ident_file_mappings"),
    ("pg_settings", "select name, setting from pg_settings where name = 'hba_file'"),
    ("pg_settings", "with s as (select setting from pg_catalog.pg_settings) select * from s"),
    ("current_setting('primary_conninfo')", "select current_setting('primary_conninfo')"),
    ("current_setting('hba_file', TRUE)", "select pg_catalog.current_setting('hba_file', true)"),
    ("current_setting(name)", "select current_setting(name) from runs"),
    ("pg_show_all_settings()", "select * from pg_show_all_settings()"),
    ("pg_config", "select * from pg_config"),
    ("pg_authid", "select rolname, rolpassword from pg_authid"),
    ("pg_shadow", "select passwd from pg_shadow"),
    ("pg_user_mappings", "select umoptions from pg_user_mappings"),
    ("pg_subscription", "select subconninfo from pg_subscription"),
    ("pg_read_file('postgresql.conf')", "select pg_read_file('postgresql.conf')"),
    ("pg_read_binary_file('pg_hba.conf')", "select pg_read_binary_file('pg_hba.conf')"),
    ("pg_ls_dir('.')", "select * from pg_ls_dir('.')"),
    ("pg_ls_logdir()", "select * from pg_ls_logdir()"),
    ("pg_stat_file('pg_hba.conf')", "select (pg_stat_file('pg_hba.conf')).size"),
    ("pg_current_logfile()", "select pg_current_logfile()"),
]


@pytest.mark.parametrize(("named", "query"), SERVER_SECRETS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SERVER_SECRETS)])
def test_the_servers_configuration_and_credentials_are_refused_before_running(shared, named, query):
    before = ledger_state(shared)
    with pytest.raises(ReadOnlyViolation) as info:
        run_readonly_query(shared, query)
    message = str(info.value)
    assert _one_line(message)
    assert message.startswith(f"trackway sql: {named} is not allowed: ")
    assert "configuration, files or credentials" in message
    assert ledger_state(shared) == before


def test_harmless_settings_are_still_readable(pg_url):
    ledger = open_ledger(pg_url)
    try:
        result = run_readonly_query(ledger, "select current_setting('TimeZone') is not null as known")
        assert result.rows == [(True,)]
    finally:
        ledger.dispose()


def test_postgresql_runs_the_query_read_only_and_under_the_time_limit(pg_url):
    ledger = open_ledger(pg_url)
    try:
        assert _execute(ledger, "show transaction_read_only").rows == [("on",)]
        assert _execute(ledger, "show statement_timeout", timeout_s=2.5).rows == [("2500ms",)]
        assert run_readonly_query(ledger, "select current_setting('statement_timeout')").rows == [("30s",)]
        assert run_readonly_query(ledger, "select current_user").rows == [("trackway_reader",)]
        # The limit and the role are the transaction's own: the pooled connection goes back without them.
        with ledger.read() as conn:
            assert conn.exec_driver_sql("show statement_timeout").scalar() == "0"
            assert conn.exec_driver_sql("show transaction_read_only").scalar() == "off"
            assert conn.exec_driver_sql("select current_user").scalar() == "postgres"
    finally:
        ledger.dispose()


def test_a_write_that_slips_past_the_parser_fails_in_the_read_only_transaction(pg_url):
    ledger = open_ledger(pg_url)
    try:
        before = ledger_state(ledger)
        with pytest.raises(ReadOnlyViolation, match="read-only transaction"):
            _execute(ledger, "create table evil as select 1 as a")
        assert ledger_state(ledger) == before
    finally:
        ledger.dispose()


def test_a_query_past_the_time_limit_is_stopped_and_the_ledger_answers_next(ledger):
    if ledger.dialect == "sqlite":
        slow = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 1000000000) select count(*) from c"
    else:
        slow = "select pg_sleep(5)"
    with pytest.raises(InputError) as info:
        run_readonly_query(ledger, slow, timeout_s=1)
    message = str(info.value)
    assert message.startswith("trackway sql: the query ran longer than --timeout 1s") and _one_line(message)
    assert not isinstance(info.value, ReadOnlyViolation)
    assert run_readonly_query(ledger, "select count(*) from runs").rows == [(0,)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0, 1e308, 86_401.0, "soon"])
def test_the_time_limit_must_be_finite_and_in_range(bad):
    with pytest.raises(InputError, match=r"^--timeout: expected a number of seconds above 0 and at most 86400"):
        check_timeout(bad)
    assert check_timeout(0.25) == 0.25 and check_timeout(86_400) == 86_400.0


# --- queries remembered between runs ---------------------------------------------------------------


def test_a_repeated_query_runs_without_parsing_it_again(tmp_path):
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).dispose()
    remember = tmp_path / "remembered"
    probe = (
        "import sys; from pathlib import Path; from trackway.ledger.sql.readonly import run_readonly_query\n"
        f"result = run_readonly_query({url!r}, \"select now() - interval '1 day' > '2000-01-01' as recent\", "
        f"remember_in=Path({str(remember)!r}))\n"
        "print(result.rows, 'sqlglot' in sys.modules)"
    )
    first = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    again = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert first == "[(1,)] True" and again == "[(1,)] False"
    (entry,) = remember.glob("*.sql")
    assert entry.stat().st_mode & 0o777 == 0o600 and remember.stat().st_mode & 0o777 == 0o700


def test_a_refused_query_is_never_remembered_and_a_forged_one_still_cannot_write(tmp_path):
    from trackway.ledger.sql.remembered import entry_path

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).dispose()
    remember = tmp_path / "remembered"
    with pytest.raises(ReadOnlyViolation):
        run_readonly_query(url, "delete from runs", remember_in=remember)
    assert not remember.exists() or not list(remember.glob("*.sql"))
    # Whoever can write the home can forge an entry; the database still refuses to write.
    forged = entry_path("select 1", "sqlite", remember)
    forged.parent.mkdir(parents=True, exist_ok=True)
    forged.write_text("DROP TABLE runs")
    with pytest.raises(ReadOnlyViolation):
        run_readonly_query(url, "select 1", remember_in=remember)
    assert run_readonly_query(url, "select count(*) from runs").rows == [(0,)]
