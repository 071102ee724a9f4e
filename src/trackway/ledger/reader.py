"""Reading the ledger over plain DB-API: the queries listings, `show`, `metrics` and the public read API share.

SQLAlchemy Core (`schema.py`) defines the tables and Alembic creates them; reading them back
needs neither. A SQLite ledger is read through the `sqlite3` module alone, because importing
SQLAlchemy costs about ten times Python's own start-up, which every `trackway runs` would pay.
A PostgreSQL ledger named by a plain `postgresql[+psycopg]://USER@HOST:PORT/DB` URL is read
through libpq alone (`libpq.py`), for the same reason: psycopg's own import costs three times a
whole `trackway runs`. Any other ledger, and any caller already holding a SQLAlchemy connection, runs the
same SQL through it (`Reader.over(conn)`), so each read has one text whatever the backend.

Rows come back as dicts keyed by column name, with timestamps as aware UTC datetimes, exactly
what the SQLAlchemy `UTCDateTime` type gives (`tests/ledger/test_reader.py` holds the two equal).
"""

from __future__ import annotations

import json
import re
import sqlite3
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trackway.errors import Ambiguous, InputError, NotFound
from trackway.ledger.busy_timeout import sqlite_busy_timeout
from trackway.ledger.event_kinds import SUPERVISOR_RANK
from trackway.ledger.revision import HEAD_REVISION
from trackway.taxonomy import AttemptState, RunState


# Every column stored as `UTCDateTime` in schema.py (a test keeps this set equal to the schema's).
TIMESTAMP_COLUMNS = frozenset({
    "created_at", "ended_at", "not_before", "started_at", "last_heartbeat_at", "at", "committed_at", "updated_at", "concluded_at",
    "claimed_at", "sent_at", "revoked_at", "lease_until", "tried_at", "expect_judged_at", "approval_at",
})
DRIVEN_RUN_STATES = (RunState.QUEUED.value, RunState.RUNNING.value)
EVALUATION_IN_FLIGHT = "running"  # evals.records.IN_FLIGHT (a test holds the two equal)
# Points handed out per fetch when streaming a series: large enough to amortize the call, small
# enough that a million points never sit in memory at once.
CHUNK_POINTS = 20_000


def as_utc(value: Any) -> Any:
    """A stored time as the ledger hands it out: aware, in UTC (SQLite's text of a naive UTC time parsed)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return value


class Reader:
    """Runs the read queries over one connection; subclasses say how a statement is executed."""

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[str], Iterator[Sequence[Any]]]:
        raise NotImplementedError

    @staticmethod
    def over(conn) -> Reader:
        """A reader over an open SQLAlchemy connection (its transaction is the caller's)."""
        return _AlchemyReader(conn)

    @staticmethod
    def of(source) -> Reader:
        """`source` as a reader: a Reader itself, or a SQLAlchemy connection the same SQL runs through."""
        return source if isinstance(source, Reader) else _AlchemyReader(source)

    # -- execution -------------------------------------------------------------------------------

    def dicts(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        columns, rows = self._execute(sql, params or {})
        stamps = [i for i, name in enumerate(columns) if name in TIMESTAMP_COLUMNS]
        out = []
        for row in rows:
            record = dict(zip(columns, row))
            for i in stamps:
                name = columns[i]
                record[name] = as_utc(record[name])
            out.append(record)
        return out

    def first(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        rows = self.dicts(sql, params)
        return rows[0] if rows else None

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        _, rows = self._execute(sql, params or {})
        for row in rows:
            return row[0]
        return None

    # -- runs and attempts -----------------------------------------------------------------------

    def runs(self, limit: int | None = 50, project: str | None = None, kinds: Sequence[str] | None = None) -> list[dict]:
        """Newest runs first, each with its attempt count (counted for the listed runs only)."""
        where, params = [], {}
        if project:
            where.append("runs.project = :project")
            params["project"] = project
        if kinds:
            where.append(f"runs.kind IN ({_placeholders('kind', kinds, params)})")
        sql = (
            "SELECT runs.*, (SELECT count(*) FROM attempts WHERE attempts.run_id = runs.run_id) AS attempt_count"
            " FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY runs.created_at DESC, runs.run_id DESC"
        )
        return self.dicts(sql + _limit(limit, params), params)

    def attempts(self, run_id: str | None = None, limit: int | None = 100) -> list[dict]:
        """One run's attempts by number, or every run's, newest first; each with its run's name."""
        params: dict[str, Any] = {}
        sql = "SELECT attempts.*, runs.name AS run_name FROM attempts JOIN runs ON runs.run_id = attempts.run_id"
        if run_id:
            sql += " WHERE attempts.run_id = :run_id ORDER BY attempts.attempt_number"
            params["run_id"] = run_id
        else:
            sql += " ORDER BY attempts.started_at DESC, attempts.attempt_id DESC"
        return self.dicts(sql + _limit(limit, params), params)

    def run(self, ref: str) -> dict:
        """The run whose id or unique name is `ref`."""
        ref = ref.strip()
        if not ref:
            raise InputError("RUN: expected a run id or name, got an empty string")
        row = self.first("SELECT * FROM runs WHERE run_id = :ref", {"ref": ref})
        if row is not None:
            return row
        matches = self.dicts("SELECT * FROM runs WHERE name = :ref", {"ref": ref})
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:  # names are unique; kept for ledgers written by hand
            raise Ambiguous(f"run {ref!r}: {len(matches)} runs have that name; use the run id")
        raise NotFound(f"run {ref!r}: no run has that id or name (see `trackway runs`)")

    def run_named(self, name: str) -> dict | None:
        return self.first("SELECT * FROM runs WHERE name = :name", {"name": name.strip()})

    def attempt(self, ref: str) -> dict:
        """The attempt addressed as `RUN/N`, or the latest attempt of `RUN`."""
        run_ref, _, number_text = ref.rpartition("/") if "/" in ref else (ref, "", "")
        if number_text and not number_text.isdigit():
            # A name may hold a slash (an evaluation seed is RUN@STEP/SPEC/seed-N): the whole ref is a run.
            run_ref, number_text = ref, ""
        run = self.run(run_ref)
        if not number_text:
            row = self.latest_attempt(run["run_id"])
            if row is None:
                if run.get("approval") == "awaiting":
                    raise NotFound(f"run {run_ref!r}: has no attempt yet: it waits for a person's approval "
                                   f"(`trackway approve {run['run_id']}`), because {run.get('approval_note')}")
                raise NotFound(f"run {run_ref!r}: has no attempt yet")
            return row
        row = self.first(
            "SELECT * FROM attempts WHERE run_id = :run_id AND attempt_number = :number",
            {"run_id": run["run_id"], "number": int(number_text)},
        )
        if row is None:
            count = self.attempt_count(run["run_id"])
            raise NotFound(f"attempt {ref!r}: run {run['run_id']} has {count} attempt(s)")
        return row

    def latest_attempt(self, run_id: str) -> dict | None:
        return self.first(
            "SELECT * FROM attempts WHERE run_id = :run_id ORDER BY attempt_number DESC LIMIT 1", {"run_id": run_id}
        )

    def attempt_count(self, run_id: str) -> int:
        return int(self.scalar("SELECT count(*) FROM attempts WHERE run_id = :run_id", {"run_id": run_id}))

    def blob(self, digest: str) -> bytes:
        _, rows = self._execute("SELECT compression, content FROM blobs WHERE sha256 = :digest", {"digest": digest})
        for compression, content in rows:
            content = bytes(content)
            return zlib.decompress(content) if compression == "zlib" else content
        raise NotFound(f"blob {digest}: not in the ledger")

    def supervisor_event(self, attempt_id: str, kind: str) -> dict[str, Any] | None:
        """What the supervisor recorded about an attempt under `kind`, or None."""
        payload = self.scalar("SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id AND rank = :rank"
                              " AND kind = :kind", {"attempt_id": attempt_id, "rank": SUPERVISOR_RANK, "kind": kind})
        return json.loads(payload) if payload is not None else None

    # -- evaluations --------------------------------------------------------------------------------

    def evaluation(self, ref: str) -> dict:
        """The evaluation whose id is `ref`, or whose seed (scoring or inference run) is the run `ref`."""
        ref = ref.strip()
        row = self.first("SELECT * FROM evaluations WHERE eval_id = :ref", {"ref": ref})
        if row is not None:
            return row
        # An evaluation seed's run id (its scoring or inference run's too) addresses its evaluation (`runs --kind eval` lists them).
        row = self.first(
            "SELECT evaluations.* FROM evaluations JOIN evaluation_seeds ON evaluation_seeds.eval_id = evaluations.eval_id"
            " WHERE evaluation_seeds.eval_run_id = :ref OR evaluation_seeds.inference_run_id = :ref LIMIT 1", {"ref": ref})
        if row is None:
            raise NotFound(f"evaluation {ref!r}: no evaluation has that id (see `trackway evals RUN`)")
        return row

    def evaluations_of_run(self, run_id: str, spec_name: str | None = None) -> list[dict]:
        """The run's evaluations (of one spec), by checkpoint step, then when they were asked for."""
        params = {"run_id": run_id}
        sql = "SELECT * FROM evaluations WHERE run_id = :run_id"
        if spec_name:
            sql += " AND spec_name = :spec_name"
            params["spec_name"] = spec_name
        return self.dicts(sql + " ORDER BY checkpoint_step, created_at", params)

    def seeds_of(self, eval_id: str) -> list[dict]:
        """An evaluation's seeds by number, each with its scoring run's state and termination reason."""
        return self.dicts(
            "SELECT evaluation_seeds.*, runs.state AS run_state, runs.termination_reason AS run_reason"
            " FROM evaluation_seeds JOIN runs ON runs.run_id = evaluation_seeds.eval_run_id"
            " WHERE evaluation_seeds.eval_id = :eval_id ORDER BY evaluation_seeds.seed", {"eval_id": eval_id})

    def eval_metrics(self, eval_id: str) -> dict[str, dict]:
        """Each metric of an evaluation over its seeds: mean, std, min, max and how many seeds."""
        rows = self.dicts("SELECT * FROM eval_metrics WHERE eval_id = :eval_id", {"eval_id": eval_id})
        return {r["metric"]: {k: r[k] for k in ("mean", "std", "min", "max", "seeds")} for r in rows}

    # -- what a supervisor still has to drive ------------------------------------------------------

    def in_flight(self) -> dict[str, int]:
        """What a supervisor still has to drive, by kind; empty when nothing is in flight.

        Each count reads an index over the few rows in flight (the plans are checked in
        `tests/ledger/test_query_plans.py`), never the whole history.
        """
        unfinished = [state.value for state in AttemptState if not state.is_terminal()]
        params: dict[str, Any] = {"evaluating": EVALUATION_IN_FLIGHT}
        counts = {
            "unfinished attempts": self.scalar(
                f"SELECT count(*) FROM attempts WHERE state IN ({_placeholders('a', unfinished, params)})", params),
            "queued or running runs": self.scalar(
                f"SELECT count(*) FROM runs WHERE state IN ({_placeholders('r', DRIVEN_RUN_STATES, params)})", params),
            "evaluations in flight": self.scalar(
                "SELECT count(*) FROM evaluations WHERE state = :evaluating", params),
            # A checkpoint committed since an attached spec last looked: the next tick requests its evaluation.
            "checkpoints awaiting evaluation": self.scalar(
                "SELECT count(*) FROM run_eval_specs WHERE trigger != 'on_demand' AND coalesce(considered_step, -1) < ("
                "SELECT max(step) FROM checkpoints WHERE checkpoints.run_id = run_eval_specs.run_id"
                " AND committed_at IS NOT NULL)"),
            # An experiment whose test run or full run ends next: the supervisor gates it or judges it.
            "experiments in flight": self.scalar(
                "SELECT count(*) FROM experiments WHERE status IN ('testing', 'running', 'analyzing')"),
            # A run's own criteria (`submit --expect`) that can still change: judged each tick.
            "run criteria to judge": self.scalar("SELECT count(*) FROM runs WHERE expect_open = :open",
                                                 {"open": True}),
            "notifications to send": self.scalar(
                "SELECT count(*) FROM notifications WHERE state IN ('pending', 'sending')"),
        }
        return {what: int(n) for what, n in counts.items() if n}

    # -- metrics ----------------------------------------------------------------------------------

    # Every metric read below is one rank's (the process that logged it): rank 0 unless asked.

    def metric_keys(self, run_id: str, rank: int = 0) -> list[str]:
        _, rows = self._execute("SELECT key FROM metric_series WHERE run_id = :run_id AND rank = :rank ORDER BY key",
                                {"run_id": run_id, "rank": rank})
        return [row[0] for row in rows]

    def metric_ranks(self, run_id: str) -> list[int]:
        """The ranks that logged metrics for the run, lowest first (empty when none did)."""
        _, rows = self._execute("SELECT DISTINCT rank FROM metric_series WHERE run_id = :run_id ORDER BY rank",
                                {"run_id": run_id})
        return [int(row[0]) for row in rows]

    def check_rank(self, run_id: str, rank: Any, field: str = "rank") -> int:
        """`rank` as a rank the run logged metrics from (rank 0 always passes: it is every read's default).

        InputError naming `field` for anything but a whole number from 0, NotFound naming the ranks it has.
        """
        number = parse_rank(rank, field)
        if number == 0:
            return 0
        ranks = self.metric_ranks(run_id)
        if number not in ranks:
            has = f"it has rank(s) {', '.join(map(str, ranks))}" if ranks else "it has logged no metrics yet"
            raise NotFound(f"{field} {number}: run {run_id} has no metrics from that rank; {has}")
        return number

    def metric_points(
        self, run_id: str, key: str | None = None, limit: int | None = None, first: bool = False, rank: int = 0
    ) -> list[dict]:
        """(key, step, value, attempt_number, logged_at) rows ordered by key, then step.

        With `limit`, the latest `limit` points by step (what a person watching a run wants), or
        the earliest with `first`.
        """
        params: dict[str, Any] = {"run_id": run_id, "rank": rank}
        sql = (
            "SELECT metric_series.key, metric_points.step, metric_points.value, metric_points.attempt_number,"
            " metric_points.logged_at FROM metric_series JOIN metric_points"
            " ON metric_points.series_id = metric_series.series_id"
            " WHERE metric_series.run_id = :run_id AND metric_series.rank = :rank"
        )
        if key is not None:
            sql += " AND metric_series.key = :key"
            params["key"] = key
        if not limit:
            return self.dicts(sql + " ORDER BY metric_series.key, metric_points.step", params)
        order = "metric_points.step" if first else "metric_points.step DESC"
        rows = self.dicts(sql + f" ORDER BY {order}, metric_series.key" + _limit(limit, params), params)
        return sorted(rows, key=lambda row: (row["key"], row["step"]))

    def metric_summary(self, run_id: str, rank: int = 0) -> list[dict[str, Any]]:
        """Per key: points, first and last step, the last value, min, max and the attempts that logged it.

        Aggregated by the database (one pass per key and attempt, then one index probe per key for
        the last value), so a summary of millions of points moves a few rows, not the points.
        """
        params = {"run_id": run_id, "rank": rank}
        groups = self.dicts(
            "SELECT metric_series.series_id, metric_series.key, metric_points.attempt_number, count(*) AS points,"
            " min(metric_points.step) AS first, max(metric_points.step) AS last,"
            " min(metric_points.value) AS low, max(metric_points.value) AS high"
            " FROM metric_series JOIN metric_points ON metric_points.series_id = metric_series.series_id"
            " WHERE metric_series.run_id = :run_id AND metric_series.rank = :rank"
            " GROUP BY metric_series.series_id, metric_series.key, metric_points.attempt_number", params)
        summary: dict[str, dict[str, Any]] = {}
        for group in groups:
            entry = summary.setdefault(group["key"], {
                "key": group["key"], "series_id": group["series_id"], "points": 0, "first": group["first"],
                "last": group["last"], "min": None, "max": None, "attempts": []})
            entry["points"] += group["points"]
            entry["first"] = min(entry["first"], group["first"])
            entry["last"] = max(entry["last"], group["last"])
            for name, pick, value in (("min", min, group["low"]), ("max", max, group["high"])):
                if value is not None:
                    entry[name] = value if entry[name] is None else pick(entry[name], value)
            entry["attempts"].append(group["attempt_number"])
        for entry in summary.values():
            entry["attempts"].sort()
            entry["last_value"] = self.scalar(
                "SELECT value FROM metric_points WHERE series_id = :series_id AND step = :step",
                {"series_id": entry.pop("series_id"), "step": entry["last"]})
        return [summary[key] for key in sorted(summary)]

    def series_chunks(self, run_id: str, key: str, rank: int = 0) -> Iterator[list[tuple[int, float | None, int, float]]]:
        """Every point of one key as (step, value, attempt_number, logged_at) tuples, by step, in chunks.

        The rows go from the database driver to the caller without a dict or a datetime per point:
        this is what `trackway metrics --json` and the read API stream a long run's history through.
        """
        return self._chunks(
            "SELECT metric_points.step, metric_points.value, metric_points.attempt_number, metric_points.logged_at"
            " FROM metric_points WHERE metric_points.series_id = ("
            "SELECT series_id FROM metric_series WHERE run_id = :run_id AND key = :key AND rank = :rank)"
            " ORDER BY metric_points.step",
            {"run_id": run_id, "key": key, "rank": rank},
        )

    def series_text(self, run_id: str, key: str, rank: int, line: str, sep: str,
                    params: dict[str, Any]) -> Iterator[str | list[str | tuple]] | None:
        """Every point of one key as text the database spells, by step, a chunk at a time; None where it cannot.

        `line` is an SQL expression over step, value, attempt_number and logged_at (with `params`)
        giving one point's text, NULL for a point it leaves to the caller. A chunk comes as its lines joined
        by `sep`, or, where some are NULL, as a list of text (lines and separators) and the
        points (step, value, attempt_number, logged_at) to spell between them, in step order.
        Only a SQLite ledger is read this way.
        """
        return None

    def _chunks(self, sql: str, params: dict[str, Any]) -> Iterator[list[Sequence[Any]]]:
        """The rows of `sql` in lists of up to CHUNK_POINTS."""
        _, rows = self._execute(sql, params)
        chunk: list = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == CHUNK_POINTS:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def parse_rank(rank: Any, field: str = "rank") -> int:
    """A rank given as an int or as text: a whole number from 0; InputError naming `field` otherwise."""
    value = rank
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 10:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        shown = rank if isinstance(rank, str) else repr(rank)
        raise InputError(f"{field}: expected a rank, a whole number from 0, got {shown}")
    return value


def _placeholders(prefix: str, values: Sequence[Any], params: dict[str, Any]) -> str:
    names = []
    for i, value in enumerate(values):
        params[f"{prefix}{i}"] = value
        names.append(f":{prefix}{i}")
    return ", ".join(names)


def _limit(limit: int | None, params: dict[str, Any]) -> str:
    if not limit:
        return ""
    params["row_limit"] = int(limit)
    return " LIMIT :row_limit"


class _SqliteReader(Reader):
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[str], Iterator[Sequence[Any]]]:
        cursor = self.conn.execute(sql, params)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        return columns, _fetched(cursor)

    def _chunks(self, sql: str, params: dict[str, Any]) -> Iterator[list[Sequence[Any]]]:
        # The driver's own batches, handed over as they are: no Python work per row.
        cursor = self.conn.execute(sql, params)
        while batch := cursor.fetchmany(CHUNK_POINTS):
            yield batch

    def series_text(self, run_id: str, key: str, rank: int, line: str, sep: str,
                    params: dict[str, Any]) -> Iterator[str | list[str | tuple]]:
        series_id = self.scalar("SELECT series_id FROM metric_series WHERE run_id = :run_id AND key = :key"
                                " AND rank = :rank", {"run_id": run_id, "key": key, "rank": rank})
        return iter(()) if series_id is None else self._series_text(series_id, line, sep, params)

    def _series_text(self, series_id: int, line: str, sep: str, params: dict[str, Any]) -> Iterator[str | list[str | tuple]]:
        # A chunk is one query resuming after the last step seen (one read transaction holds them
        # together), its lines joined inside SQLite: Python handles one string per chunk, no row.
        # The LIMIT keeps SQLite from flattening the points into the aggregate, which would copy
        # `line` into each use: it is computed once a point. group_concat appends in the order the
        # subquery hands rows over, the primary key's (series_id, step): a range scan, nothing
        # sorted. A point without a line leaves a NUL in the text and its step in a list, and is
        # read again by that step.
        def points(start: str) -> str:
            return (f"SELECT step, {line} AS line, value, attempt_number, logged_at FROM metric_points"
                    f" WHERE series_id = :series_id{start} ORDER BY step LIMIT {CHUNK_POINTS}")

        def chunk(start: str) -> str:
            return (f"SELECT group_concat(coalesce(line, :hole), :sep), max(step), count(*) - count(line),"
                    f" group_concat(CASE WHEN line IS NULL THEN step END) FROM ({points(start)})")

        holes = ("SELECT step, value, attempt_number, logged_at FROM metric_points WHERE series_id = :series_id"
                 " AND step IN (SELECT value FROM json_each(:steps)) ORDER BY step")
        args = {**params, "series_id": series_id, "sep": sep, "hole": "\0", "after": None, "steps": None}
        start = ""
        while True:
            text, last, unspelled, steps = self.conn.execute(chunk(start), args).fetchone()
            if last is None:
                return
            if not unspelled:
                yield text
            else:
                args["steps"] = f"[{steps}]"
                missing = self.conn.execute(holes, args).fetchall()
                parts = text.split("\0")
                if len(parts) != len(missing) + 1:  # a NUL of the key's own: each point by itself
                    lines = self.conn.execute(points(start), args).fetchall()
                    parts = [(spelled if spelled is not None else tuple(point), sep) for _, spelled, *point in lines]
                    yield [part for pair in parts for part in pair][:-1]
                else:
                    yield [parts[0], *(part for pair in zip(missing, parts[1:]) for part in pair)]
            args["after"], start = last, " AND step > :after"


def _fetched(cursor: sqlite3.Cursor) -> Iterator[Sequence[Any]]:
    while True:
        batch = cursor.fetchmany(CHUNK_POINTS)
        if not batch:
            return
        yield from batch


class _AlchemyReader(Reader):
    def __init__(self, conn):
        self.conn = conn

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[str], Iterator[Sequence[Any]]]:
        from sqlalchemy import text

        result = self.conn.execute(text(sql), params)
        return list(result.keys()), (tuple(row) for row in result)


class _LibpqReader(Reader):
    def __init__(self, conn):
        self.conn = conn

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[str], Iterator[Sequence[Any]]]:
        columns, rows = self.conn.execute(sql, params)
        return columns, iter(rows)

    def _chunks(self, sql: str, params: dict[str, Any]) -> Iterator[list[Sequence[Any]]]:
        # A series of millions of points: psycopg's C loaders, whose import its length pays for, over a call
        # into libpq per value; its own connection (each read is a statement of its own at READ COMMITTED).
        import psycopg

        with psycopg.connect(self.conn.conninfo) as conn:
            cursor = conn.execute(_NAMED.sub(r"%(\1)s", sql.replace("%", "%%")), params)
            while batch := cursor.fetchmany(CHUNK_POINTS):
                yield batch


# A `:name` parameter as SQLAlchemy's text() finds one (libpq.py numbers them the same way).
_NAMED = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")

_PLAIN_POSTGRES = re.compile(
    r"postgresql(?:\+psycopg)?://(?P<user>[A-Za-z0-9_.-]+)(?::(?P<password>[A-Za-z0-9_.~-]*))?@(?P<host>[A-Za-z0-9_.-]+)"
    r"(?::(?P<port>[0-9]+))?/(?P<database>[A-Za-z0-9_.-]+)")


def plain_postgres(db_url: str) -> dict[str, str | None] | None:
    """User, password, host, port and database of a plain `postgresql[+psycopg]://USER[:PW]@HOST[:PORT]/DB` URL;
    None for any other spelling (read through SQLAlchemy, whose URL parser knows them all)."""
    found = _PLAIN_POSTGRES.fullmatch(db_url)
    return found.groupdict() if found else None


def postgres_conninfo(db_url: str) -> str | None:
    """The libpq URI psycopg connects with, for a plain PostgreSQL URL (see `plain_postgres`); None otherwise."""
    if plain_postgres(db_url) is None:
        return None
    return "postgresql://" + db_url.split("://", 1)[1]


def sqlite_file(db_url: str) -> Path | None:
    """The database file of a plain `sqlite:///PATH` URL; None for any other ledger (read through SQLAlchemy)."""
    prefix = "sqlite:///"
    if not db_url.startswith(prefix) or "?" in db_url:
        return None
    path = db_url[len(prefix):]
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path).expanduser()


@contextmanager
def open_reader(db_url: str) -> Iterator[Reader]:
    """A reader over the ledger at `db_url`, in one read transaction (migrated first when it is not current)."""
    conninfo = postgres_conninfo(db_url)
    if conninfo is not None:
        with _postgres_reader(db_url, conninfo) as reader:
            yield reader
        return
    path = sqlite_file(db_url)
    if path is None or not path.exists() or not _current(path):
        from trackway.ledger.open import open_ledger

        ledger = open_ledger(db_url)
        if path is None:
            try:
                with ledger.read() as conn:
                    yield Reader.over(conn)
            finally:
                ledger.dispose()
            return
        ledger.dispose()
    try:
        conn = _connect(path)
    except sqlite3.Error as exc:
        raise _ledger_error(exc, db_url) from exc
    with _one_transaction(conn, _SqliteReader(conn), sqlite3.Error, db_url) as reader:
        yield reader


@contextmanager
def _one_transaction(conn, reader: Reader, driver_error: type[Exception], db_url: str) -> Iterator[Reader]:
    """`reader` over `conn` in one read transaction, the driver's errors told as the ledger's; `conn` closed after."""
    try:
        conn.execute("BEGIN")
        yield reader
    except driver_error as exc:
        mapped = _ledger_error(exc, db_url, statement_errors=False)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        conn.close()


@contextmanager
def _postgres_reader(db_url: str, conninfo: str) -> Iterator[Reader]:
    """A libpq connection in one transaction, as `Ledger.read()` gives (migrated first when it is not current).

    Without libpq, a server that cannot be reached or a ledger to migrate, the ledger is opened through
    SQLAlchemy as before (its errors are the ones every command gives).
    """
    from trackway.ledger import libpq

    try:
        conn = libpq.connect(conninfo)
    except libpq.Error:
        conn = None
    if conn is not None and not postgres_current(conn):
        conn.close()
        conn = None
    if conn is None:
        from trackway.ledger.open import open_ledger

        ledger = open_ledger(db_url)
        try:
            with ledger.read() as alchemy:
                yield Reader.over(alchemy)
        finally:
            ledger.dispose()
        return
    with _one_transaction(conn, _LibpqReader(conn), libpq.Error, db_url) as reader:
        yield reader


def postgres_current(conn) -> bool:
    """Whether the PostgreSQL ledger is at HEAD_REVISION (a fresh database has no alembic_version yet)."""
    from trackway.ledger.libpq import Error

    try:
        _, rows = conn.execute("SELECT version_num FROM alembic_version")
    except Error:
        return False
    return bool(rows) and rows[0][0] == HEAD_REVISION


def _connect(path: Path) -> sqlite3.Connection:
    timeout = sqlite_busy_timeout()
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    conn.execute("PRAGMA query_only=1")
    return conn


def _current(path: Path) -> bool:
    """Whether the SQLite ledger at `path` is at HEAD_REVISION (a failure to tell is left to the full open)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == HEAD_REVISION


def _ledger_error(exc: Exception, db_url: str, statement_errors: bool = True):
    """The one line `store` gives for a ledger failure (SQLAlchemy is imported only on this path)."""
    from sqlalchemy.engine import make_url

    from trackway.ledger.store import as_ledger_error, ledger_error

    mapped = as_ledger_error(exc, make_url(db_url))
    if mapped is None and statement_errors:
        return ledger_error(exc, make_url(db_url), unavailable=True)
    return mapped

