"""`trackway metrics`: a run's logged metrics, on its step axis, continuous across attempts; rank 0's unless asked."""

from __future__ import annotations

import csv
import sys

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json
from trackway.cli.metrics_stream import POINT_FIELDS, RANK_FIELDS, stream_csv, stream_json
from trackway.errors import InputError, NotFound
from trackway.ledger.reader import parse_rank
from trackway.validation import limit as check_limit

ALL_RANKS = "all"


def metrics(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name."),
    key: str = typer.Option(None, "--key", help="Only this metric, point by point (e.g. loss)."),
    limit: int = typer.Option(0, "--limit", help="Only the latest N points by step (0: all)."),
    first: bool = typer.Option(False, "--first", help="With --limit: the earliest N points instead of the latest."),
    as_json: bool = typer.Option(False, "--json", help="Print every point as JSON (an array, one point per line)."),
    as_csv: bool = typer.Option(False, "--csv", help="Print every point as CSV with a header row."),
    rank: str = typer.Option(None, "--rank", metavar="N|all",
                             help="Whose values: a rank number (default 0), or all (with a rank column)."),
) -> None:
    """Show a run's metrics: a summary per key, or every point of one key."""
    check_limit(limit)
    if rank is not None and rank != ALL_RANKS:
        parse_rank(rank, "--rank")  # before the ledger is opened: a typo is told the same with or without one
    if first and not limit:
        raise InputError("--first: expected together with --limit N (the earliest N points)")
    if as_json and as_csv:
        raise InputError("--json/--csv: expected one of them, not both")
    app = app_context(ctx)
    app.reconcile()  # ingests the spools of attempts still running
    with app.reader() as reader:
        run_id = reader.run(run)["run_id"]
        every_rank = rank == ALL_RANKS
        ranks = (reader.metric_ranks(run_id) or [0]) if every_rank else [reader.check_rank(run_id, rank or 0, "--rank")]
        keys = {r: reader.metric_keys(run_id, r) for r in ranks}
        if key is not None and not any(key in keys[r] for r in ranks):
            # An empty table for a typo reads as "nothing logged": say which keys there are instead.
            known = sorted({k for r in ranks for k in keys[r]})
            has = f"it has {', '.join(known)}" if known else "it has logged no metrics yet"
            whose = f" from rank {ranks[0]}" if ranks != [0] and not every_rank else ""
            raise NotFound(f"--key {key}: no such metric{whose} for run {run}; {has}")
        if (as_json or as_csv) and not limit:
            # Every point: streamed a chunk at a time (spelled by SQLite on a SQLite ledger).
            series = [(name, r) for r in ranks for name in ([key] if key is not None else keys[r])]
            (stream_json if as_json else stream_csv)(reader, run_id, series, every_rank)
            return
        whole_run_summary = key is None and not limit and not (as_json or as_csv)
        if whole_run_summary:  # aggregated by the database: millions of points move as a few rows
            summary = [{**s, "rank": r} for r in ranks for s in reader.metric_summary(run_id, r)]
        else:
            points = [{**p, "rank": r} if every_rank else p
                      for r in ranks for p in reader.metric_points(run_id, key=key, limit=limit or None, first=first, rank=r)]
    fields = RANK_FIELDS if every_rank else POINT_FIELDS
    if as_json:
        print_json([{f: p[f] for f in fields} for p in points])
        return
    if as_csv:
        _write_csv([[tuple(p[f] for f in fields) for p in points]], fields)
        return
    from trackway.cli.render import KEY, Column, console, table

    by_rank = [Column("rank", 10, right=True)] if every_rank else []
    if key:
        console.print(table(
            None, [*by_rank, Column("step", KEY, right=True), Column(key, KEY, right=True),
                   Column("attempt", 10, right=True)],
            ((*([p["rank"]] if every_rank else []), p["step"], p["value"], p["attempt_number"]) for p in points),
        ))
        return
    console.print(table(
        None,
        [Column("key", KEY, shorten_to=16), *by_rank, Column("points", 20, right=True), Column("steps", 40, right=True),
         Column("last", 90, right=True), Column("min", 50, right=True), Column("max", 50, right=True),
         Column("attempts", 10)],
        ((s["key"], *([s["rank"]] if every_rank else []), s["points"], f"{s['first']}..{s['last']}",
          _g(s["last_value"]), _g(s["min"]), _g(s["max"]), ",".join(str(a) for a in s["attempts"]))
         for s in (summary if whole_run_summary else _summarize(points))),
    ))


def _summarize(points) -> list[dict]:
    """The summary `Reader.metric_summary` gives, of the points a --limit kept."""
    summary: dict[tuple, dict] = {}
    for p in points:
        s = summary.setdefault((p.get("rank", 0), p["key"]), {
            "key": p["key"], "rank": p.get("rank", 0), "points": 0, "first": p["step"], "min": None, "max": None,
            "attempts": set()})
        s["points"] += 1
        s["last"], s["last_value"] = p["step"], p["value"]
        if p["value"] is not None:
            s["min"] = p["value"] if s["min"] is None else min(s["min"], p["value"])
            s["max"] = p["value"] if s["max"] is None else max(s["max"], p["value"])
        s["attempts"].add(p["attempt_number"])
    return [{**s, "attempts": sorted(s["attempts"])} for s in summary.values()]


def _write_csv(chunks, fields=POINT_FIELDS) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(fields)
    for chunk in chunks:
        writer.writerows(chunk)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)
