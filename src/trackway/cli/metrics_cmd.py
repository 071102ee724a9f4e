"""`trackway metrics`: a run's logged metrics, on its step axis, continuous across attempts."""

from __future__ import annotations

import csv
import io
import json
import sys

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json
from trackway.errors import InputError, NotFound
from trackway.validation import limit as check_limit

POINT_FIELDS = ("key", "step", "value", "attempt_number", "logged_at")


def metrics(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name."),
    key: str = typer.Option(None, "--key", help="Only this metric, point by point (e.g. loss)."),
    limit: int = typer.Option(0, "--limit", help="Only the latest N points by step (0: all)."),
    first: bool = typer.Option(False, "--first", help="With --limit: the earliest N points instead of the latest."),
    as_json: bool = typer.Option(False, "--json", help="Print every point as JSON (an array, one point per line)."),
    as_csv: bool = typer.Option(False, "--csv", help="Print every point as CSV with a header row."),
) -> None:
    """Show a run's metrics: a summary per key, or every point of one key."""
    check_limit(limit)
    if first and not limit:
        raise InputError("--first: expected together with --limit N (the earliest N points)")
    if as_json and as_csv:
        raise InputError("--json/--csv: expected one of them, not both")
    app = app_context(ctx)
    app.reconcile()  # ingests the spools of attempts still running
    with app.reader() as reader:
        run_id = reader.run(run)["run_id"]
        keys = reader.metric_keys(run_id)
        if key is not None and key not in keys:
            # An empty table for a typo reads as "nothing logged": say which keys there are instead.
            has = f"it has {', '.join(keys)}" if keys else "it has logged no metrics yet"
            raise NotFound(f"--key {key}: no such metric for run {run}; {has}")
        if (as_json or as_csv) and not limit:
            # Every point: streamed a chunk at a time, as the driver hands them over.
            series = ((name, chunk) for name in ([key] if key is not None else keys)
                      for chunk in reader.series_chunks(run_id, name))
            (_stream_json if as_json else _stream_csv)(series)
            return
        whole_run_summary = key is None and not limit and not (as_json or as_csv)
        if whole_run_summary:  # aggregated by the database: millions of points move as a few rows
            summary = reader.metric_summary(run_id)
        else:
            points = reader.metric_points(run_id, key=key, limit=limit or None, first=first)
    if as_json:
        print_json(points)
        return
    if as_csv:
        _write_csv([[tuple(p[f] for f in POINT_FIELDS) for p in points]])
        return
    from trackway.cli.render import KEY, Column, console, table

    if key:
        console.print(table(
            None, [Column("step", KEY, right=True), Column(key, KEY, right=True), Column("attempt", 10, right=True)],
            ((p["step"], p["value"], p["attempt_number"]) for p in points),
        ))
        return
    console.print(table(
        None,
        [Column("key", KEY, shorten_to=16), Column("points", 20, right=True), Column("steps", 40, right=True),
         Column("last", 90, right=True), Column("min", 50, right=True), Column("max", 50, right=True),
         Column("attempts", 10)],
        ((s["key"], s["points"], f"{s['first']}..{s['last']}", _g(s["last_value"]), _g(s["min"]), _g(s["max"]),
          ",".join(str(a) for a in s["attempts"])) for s in (summary if whole_run_summary else _summarize(points))),
    ))


def _summarize(points) -> list[dict]:
    """The summary `Reader.metric_summary` gives, of the points a --limit kept."""
    summary: dict[str, dict] = {}
    for p in points:
        s = summary.setdefault(p["key"], {"key": p["key"], "points": 0, "first": p["step"], "min": None, "max": None,
                                          "attempts": set()})
        s["points"] += 1
        s["last"], s["last_value"] = p["step"], p["value"]
        if p["value"] is not None:
            s["min"] = p["value"] if s["min"] is None else min(s["min"], p["value"])
            s["max"] = p["value"] if s["max"] is None else max(s["max"], p["value"])
        s["attempts"].add(p["attempt_number"])
    return [{**s, "attempts": sorted(s["attempts"])} for s in summary.values()]


def _write_csv(chunks) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(POINT_FIELDS)
    for chunk in chunks:
        writer.writerows(chunk)


# A point is (step, value, attempt_number, logged_at): ints and floats whose `%r` is exactly what `json`
# and `csv` write for them (the shortest text that reads back as the same float). Formatting a chunk
# with one template is three times faster than a dict per point through the JSON encoder; a chunk
# holding a value the template would spell differently (None, NaN, ±inf) goes the general way.
_SPELLED_OTHERWISE = ('"value":None', '"value":nan', '"value":inf', '"value":-inf')


def _stream_json(series) -> None:
    out = sys.stdout
    written = False
    out.write("[")
    for name, chunk in series:
        template = '{"key":' + json.dumps(name, ensure_ascii=False) + ',"step":%d,"value":%r,"attempt_number":%d,"logged_at":%r}'
        text = ",\n".join(map(template.__mod__, chunk))
        if any(word in text for word in _SPELLED_OTHERWISE):
            text = ",\n".join(json.dumps(dict(zip(POINT_FIELDS, (name, *point))), separators=(",", ":"),
                                          ensure_ascii=False) for point in chunk)
        out.write((",\n" if written else "\n") + text)
        written = True
    out.write("\n]\n" if written else "]\n")


def _stream_csv(series) -> None:
    out = sys.stdout
    writer = csv.writer(out)
    writer.writerow(POINT_FIELDS)
    for name, chunk in series:
        quoted = io.StringIO()
        csv.writer(quoted).writerow([name])
        template = quoted.getvalue().rstrip("\r\n") + ",%d,%r,%d,%r\r\n"
        text = "".join(map(template.__mod__, chunk))
        if "None" in text:  # csv writes a missing value as an empty field
            writer.writerows((name, *point) for point in chunk)
            continue
        out.write(text)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)
