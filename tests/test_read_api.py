"""`trackway.Api` reads runs, attempts and metric histories back; `trackway metrics --json/--csv` streams them."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from datetime import datetime, timezone

import pytest

import trackway
from trackway.errors import NotFound
from trackway.ledger import open_ledger
from trackway.ledger.records import insert_attempt, insert_run
from trackway.ledger.schema import metric_points, metric_series

POINTS = 45_000  # more than two of the reader's chunks


def _run_with_history(url: str) -> None:
    ledger = open_ledger(url)
    now = datetime.now(timezone.utc)
    at = time.time()
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rhist", name="hist", project="p", kind="full", state="completed", command="[]",
                              workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        for n in (1, 2):
            insert_attempt(conn, dict(run_id="rhist", attempt_number=n, state="ended", executor="local",
                                      state_dir="/s", log_path="/s/log", gpu_count=0, started_at=now, ended_at=now))
        loss = conn.execute(metric_series.insert().values(run_id="rhist", key="loss")).inserted_primary_key[0]
        lr = conn.execute(metric_series.insert().values(run_id="rhist", key="lr")).inserted_primary_key[0]
        conn.execute(metric_points.insert(), [
            dict(series_id=loss, step=i, value=math.nan if i == 7 else 1.0 / (i + 1),
                 attempt_number=1 if i < 20_000 else 2, logged_at=at) for i in range(POINTS)
        ])
        conn.execute(metric_points.insert(), [dict(series_id=lr, step=0, value=3e-4, attempt_number=1, logged_at=at)])
    ledger.dispose()


def _missing(value) -> bool:
    """A NaN as the backend keeps it: SQLite stores NaN as NULL, PostgreSQL keeps NaN."""
    return value is None or math.isnan(value)


def test_history_reads_every_point_in_step_order_with_the_attempt_that_wrote_it(ledger_url):
    _run_with_history(ledger_url)
    api = trackway.Api(db=ledger_url)
    assert [(r["name"], r["attempt_count"]) for r in api.runs()] == [("hist", 2)] and api.run("rhist")["name"] == "hist"
    assert [a["attempt_number"] for a in api.attempts("hist")] == [1, 2]
    assert api.metric_keys("hist") == ["loss", "lr"]
    loss = api.history("hist", "loss")
    assert len(loss) == POINTS and loss.steps == list(range(POINTS))
    assert loss.values[0] == 1.0 and loss.values[-1] == 1.0 / POINTS
    assert _missing(loss.values[7])
    assert loss.attempt_numbers[19_999] == 1 and loss.attempt_numbers[20_000] == 2
    arrays = loss.to_numpy()
    assert arrays["step"].dtype.name == "int64" and arrays["value"][1] == 0.5
    with pytest.raises(NotFound, match="it has loss, lr"):
        api.history("hist", "accuracy")


def test_metrics_json_and_csv_stream_every_point_of_a_key(cli, ledger_url):
    _run_with_history(ledger_url)
    result = cli("metrics", "hist", "--key", "loss", "--json")
    assert result.code == 0, result.err
    points = json.loads(result.out)
    assert len(points) == POINTS and points[3] == {
        "key": "loss", "step": 3, "value": 0.25, "attempt_number": 1, "logged_at": points[3]["logged_at"]}
    assert _missing(points[7]["value"])  # never silently dropped: the point is there, its value NaN or null
    csv_result = cli("metrics", "hist", "--csv")
    rows = list(csv.reader(io.StringIO(csv_result.out)))
    assert rows[0] == ["key", "step", "value", "attempt_number", "logged_at"]
    assert len(rows) == 1 + POINTS + 1 and rows[-1][:3] == ["lr", "0", "0.0003"]
    latest = cli("metrics", "hist", "--key", "loss", "--limit", "2", "--json").json()
    assert [p["step"] for p in latest] == [POINTS - 2, POINTS - 1]
    both = cli("metrics", "hist", "--json", "--csv")
    assert both.code == 2 and "--json/--csv" in both.err


def test_the_whole_run_summary_is_aggregated_and_agrees_with_the_points(cli, ledger_url):
    from trackway.ledger.reader import open_reader

    _run_with_history(ledger_url)
    with open_reader(ledger_url) as reader:
        run_id = reader.run("hist")["run_id"]
        loss, lr = reader.metric_summary(run_id)
        points = reader.metric_points(run_id, key="loss")
    finite = [p["value"] for p in points if not _missing(p["value"])]
    assert (loss["key"], loss["points"], loss["first"], loss["last"]) == ("loss", POINTS, 0, POINTS - 1)
    assert loss["attempts"] == [1, 2] and loss["last_value"] == points[-1]["value"]
    assert loss["min"] == min(finite)
    assert loss["max"] == max(finite) or _missing(loss["max"])  # PostgreSQL orders NaN above every number
    assert (lr["points"], lr["attempts"], lr["last_value"]) == (1, [1], 3e-4)
    shown = cli("metrics", "hist").out
    assert f"{POINTS:,}".replace(",", "") in shown.replace(",", "") and f"0..{POINTS - 1}" in shown and "1,2" in shown
