"""`trackway metrics --key K --json/--csv` print every stored double so that it reads back as exactly that double.

On SQLite the lines are spelled by SQLite (printf('%!.17g') in its exact range, Python beyond it);
on PostgreSQL by Python's repr. Either way a user parsing the output gets the very doubles logged,
the ints unchanged and the fields in the same order, across chunk boundaries and around points
(None, ±inf, 1e-300, subnormals) that take the other spelling.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import sqlite3
import struct
from datetime import datetime, timezone

import pytest

from trackway.cli.metrics_stream import _exact
from trackway.ledger import open_ledger
from trackway.ledger import reader as reader_module
from trackway.ledger.records import insert_attempt, insert_run

INF = float("inf")
TRICKY = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 2 / 3, 1e-300, 1e300, -1e300, 5e-324, 2.2250738585072014e-308,
          1.7976931348623157e308, 1e-30, 1e30, 9.999999999999999e29, 1e-10, 1e16, 1e22, 1e23, 2.0 ** 53,
          2.0 ** 53 + 2, 123456789012345.0, 1234567890123456.0, 0.30000000000000004, 1.0000000000000002,
          4.35, 0.001, 3e-4, 1e-5, INF, -INF, None]


def _bits(value):
    return None if value is None else struct.pack("<d", value)


def _values(count: int) -> list[float | None]:
    rng = random.Random(7)
    values = list(TRICKY)
    while len(values) < count:
        kind = rng.randrange(4)
        if kind == 0:  # any finite double, every exponent
            value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(value):
                values.append(value)
        elif kind == 1:
            values.append(1.0 / (len(values) + 1))  # needs 16 or 17 digits
        elif kind == 2:
            values.append(float(f"{rng.random():.{rng.randint(1, 17)}g}"))  # short ones
        else:
            values.append(float(rng.getrandbits(rng.randint(1, 60))))  # integers as floats
    return values


@pytest.fixture
def logged(ledger_url: str, monkeypatch):
    """A run `spelled` whose loss holds 3,000 points of every kind of double, read back in chunks of 700."""
    monkeypatch.setattr(reader_module, "CHUNK_POINTS", 700)
    ledger = open_ledger(ledger_url)
    now = datetime.now(timezone.utc)
    values = _values(3000)
    clock = 1.78e9
    points = [(step, value, 1 + step // 2000, clock + step * 1e-3 + (step % 7) / 3) for step, value in enumerate(values)]
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rspell", name="spelled", project="p", kind="full", state="completed",
                              command="[]", workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        for attempt in (1, 2):
            insert_attempt(conn, dict(run_id="rspell", attempt_number=attempt, state="ended", executor="local",
                                      state_dir="/s", log_path="/s/log", gpu_count=0, started_at=now, ended_at=now))
        from sqlalchemy import text

        series = conn.execute(text("INSERT INTO metric_series (run_id, key, rank) VALUES ('rspell', 'loss', 0)"
                                   " RETURNING series_id")).scalar()
        conn.execute(text("INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at)"
                          " VALUES (:s, :step, :value, :attempt, :at)"),
                     [dict(s=series, step=s, value=v, attempt=a, at=t) for s, v, a, t in points])
    ledger.dispose()
    # What the ledger holds, as a reader gets it (SQLite keeps -0.0 as 0.0).
    import trackway

    history = trackway.Api(db=ledger_url).history("spelled", "loss")
    return list(zip(history.steps, history.values, history.attempt_numbers, history.logged_at))


def test_json_reads_back_every_stored_double_exactly(cli, logged, ledger_url):
    printed = cli("metrics", "spelled", "--key", "loss", "--json").out
    points = json.loads(printed)
    assert [list(p) for p in points] == [["key", "step", "value", "attempt_number", "logged_at"]] * len(logged)
    assert [(p["step"], p["attempt_number"]) for p in points] == [(s, a) for s, _, a, _ in logged]
    assert [_bits(p["value"]) for p in points] == [_bits(v) for _, v, _, _ in logged]
    assert [_bits(p["logged_at"]) for p in points] == [_bits(t) for _, _, _, t in logged]
    lines = printed.splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == len(logged) + 2
    # Beyond printf's exact range a value is spelled as before: Python's repr, JSON's names for ±inf.
    assert '"value":1e-300,' in printed and '"value":5e-324,' in printed and '"value":Infinity,' in printed
    assert '"value":-Infinity,' in printed and '"value":null,' in printed
    assert '"value":0.1,' in printed and '"value":0.0003,' in printed  # short ones as people wrote them
    # SQLite spelled the rest: seventeen digits where repr has sixteen (1/3), the same double.
    spelled_by = "0.33333333333333331" if ledger_url.startswith("sqlite") else "0.3333333333333333"
    assert f'"value":{spelled_by},' in printed


def test_csv_reads_back_every_stored_double_exactly(cli, logged):
    printed = cli("metrics", "spelled", "--key", "loss", "--csv").out
    rows = list(csv.reader(io.StringIO(printed)))
    assert rows[0] == ["key", "step", "value", "attempt_number", "logged_at"]
    assert [(r[0], int(r[1]), int(r[3])) for r in rows[1:]] == [("loss", s, a) for s, _, a, _ in logged]
    assert [_bits(float(r[2])) if r[2] else None for r in rows[1:]] == [_bits(v) for _, v, _, _ in logged]
    assert [_bits(float(r[4])) for r in rows[1:]] == [_bits(t) for _, _, _, t in logged]
    assert printed.count("\r\n") == len(logged) + 1 and "\r\n\r\n" not in printed


def test_sqlite_spells_exactly_in_its_range_and_leaves_the_rest_to_python():
    """printf('%!.17g') reads back as the same double in the range it is used for; beyond it SQL gives NULL."""
    rng = random.Random(39)
    inside = [rng.choice((-1, 1)) * 10 ** rng.uniform(-30, 30) for _ in range(100_000)]
    inside = [x for x in inside if 1e-30 <= abs(x) < 1e30] + [1e-30, -1e-30, 9.999999999999999e29, 0.0, 0.1, 1 / 3]
    outside = [1e30, -1e30, 9.99e-31, -9.99e-31, 1e-300, 5e-324, 1e300, INF, -INF]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (value REAL)")
    conn.executemany("INSERT INTO t VALUES (?)", ((x,) for x in inside + outside))
    conn.execute("INSERT INTO t VALUES ('0.5x')")  # text a ledger should never hold: left to Python too
    spelled = conn.execute(f"SELECT value, CASE WHEN {_exact('value')} THEN printf('%!.17g', value) END"
                           " FROM t ORDER BY rowid").fetchall()
    assert [x for x, text in spelled[:len(inside)] if _bits(float(text)) != _bits(x)] == []
    assert [text for _, text in spelled[len(inside):]] == [None] * (len(outside) + 1)
