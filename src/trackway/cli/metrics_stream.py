"""`trackway metrics --json/--csv` of every point: streamed a chunk at a time, spelled by SQLite on a SQLite ledger.

A point's text is built where its row is read. On a SQLite ledger one SQL expression spells each
line and SQLite joins a chunk's lines, so Python handles one string per 20,000 points instead of
a tuple, two ints and two floats per point (two thirds of the time went to Python's float repr).

There a float is spelled `printf('%!.17g', x)`: seventeen significant digits, trailing zeros
dropped, always a decimal point. Seventeen digits name one double only, so every value and time
reads back as exactly the double stored (json.loads, float(), any correct parser), but the text
can be longer than Python's shortest repr: 1/3 comes out 0.33333333333333331 (repr:
0.3333333333333333), a time 1780000000.1229999 (repr: 1780000000.123). SQLite 3.40's printf
computes in long double, exact for seventeen digits only within 1e-30 <= |x| < 1e30 (beyond,
its scaling by powers of ten drifts; tests/cli/test_metrics_stream.py checks the range); a
probe at the first stream falls back to Python where printf is not exact (a SQLite built
without long double). Python's repr, as before, spells a value outside that range (±inf,
1e-300, subnormals), a chunk holding one coming back with those points to spell; and a
value whose shortest text has ten digits or fewer (0.1, 3e-4) is re-spelled from its seventeen
digits by repr (`_shorter`). Checking a 15-digit text in SQL instead
(CAST(printf('%!.15g', x) AS REAL) = x) is not exact: SQLite 3.40's text-to-double conversion
rounds twice, and about 2 in 100,000 doubles pass that check with a text that reads back as a
neighbouring double.

Elsewhere (PostgreSQL) the driver's rows are formatted in Python with one template per chunk,
floats by `%r`, the shortest text that reads back as the same double.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
import sqlite3
import sys
from collections.abc import Iterator, Sequence

POINT_FIELDS = ("key", "step", "value", "attempt_number", "logged_at")
RANK_FIELDS = ("key", "rank", "step", "value", "attempt_number", "logged_at")  # with --rank all


def _exact(column: str) -> str:
    """SQL: whether printf('%!.17g') spells `column` exactly (a REAL in its range; a TEXT value sorts above them all)."""
    return f"({column} >= 1e-30 AND {column} < 1e30 OR {column} <= -1e-30 AND {column} > -1e30 OR {column} = 0)"


def _line(spelled: str, missing: str) -> str:
    """SQL: one point's text by a single printf (one call: each costs as much as the rest of a point);
    `missing` for a NULL value, NULL (Python spells it) where a float is outside printf's exact range."""
    return (f"CASE WHEN {_exact('value')} AND {_exact('logged_at')}"
            f" THEN printf({spelled}, step, value, attempt_number, logged_at)"
            f" WHEN value IS NULL AND {_exact('logged_at')} THEN printf({missing}, step, attempt_number, logged_at) END")


_LINE = _line(":spelled", ":missing")
_JSON_FORMAT = ',"step":%lld,"value":{},"attempt_number":%lld,"logged_at":%!.17g}}'
_CSV_FORMAT = ",%lld,{},%lld,%!.17g"


def _formats(prefix: str, template: str, null: str) -> dict[str, str]:
    """The printf formats of a series' lines: `prefix` (key and rank, %-escaped) before `template`."""
    head = prefix.replace("%", "%%")
    return {"spelled": head + template.format("%!.17g"), "missing": head + template.format(null)}

# Seventeen digits ending in a run of zeros or nines (0.10000000000000001, 0.00029999999999999997)
# are a value of ten digits or fewer, which repr spells as people wrote it (0.1, 0.0003). The runs
# are found by str.find (a regex scan of a chunk costs ten times more), then the number around one
# is checked to be a value or a time ending so.
_RUNS = ("000000", "999999")
_TAIL = re.compile(r"(?:0+|9+)[0-9](?:e[-+][0-9]+)?(?=[,}\r])")
_NUMBER = re.compile(r"-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?")


def _shorter(text: str, before: str, anchors: tuple[str, ...]) -> str:
    """`text` with each float spelled with such a run spelled as repr spells it: the same double, shorter.

    A float starts after `before` (":" in JSON, "," in CSV) and follows one of `anchors`.
    """
    hits = [at for run in _RUNS for at in _found(text, run)]
    if not hits:
        return text
    pieces, done = [], 0
    for at in sorted(hits):
        tail = _TAIL.match(text, at) if at >= done else None
        if tail is None:
            continue
        start, end = text.rfind(before, done, at) + 1, tail.end()
        if start > 0 and _NUMBER.fullmatch(text, start, end) and text.endswith(anchors, done, start):
            pieces += [text[done:start], repr(float(text[start:end]))]
            done = end
    return "".join(pieces) + text[done:] if pieces else text


def _found(text: str, run: str) -> Iterator[int]:
    at = text.find(run)
    while at >= 0:
        yield at
        at = text.find(run, at + len(run))

# A point is (step, value, attempt_number, logged_at): ints and floats whose `%r` is exactly what `json`
# and `csv` write for them (the shortest text that reads back as the same float). Formatting a chunk
# with one template is three times faster than a dict per point through the JSON encoder; a chunk
# holding a value the template would spell differently (None, NaN, ±inf) goes the general way.
_SPELLED_OTHERWISE = ('"value":None', '"value":nan', '"value":inf', '"value":-inf')


def _printf_exact() -> bool:
    """Whether this SQLite's printf('%!.17g') reads back exactly for a fixed spread of doubles in its range."""
    global _EXACT
    if _EXACT is None:
        rng = random.Random(39)
        probe = [rng.choice((-1, 1)) * rng.uniform(1, 10) * 10.0 ** rng.randint(-30, 29) for _ in range(4000)]
        conn = sqlite3.connect(":memory:")  # the library the reader's connection runs on
        try:
            conn.execute("CREATE TEMP TABLE probe (x REAL)")
            conn.executemany("INSERT INTO probe VALUES (?)", ((x,) for x in probe))
            spelled = conn.execute("SELECT x, printf('%!.17g', x) FROM probe ORDER BY rowid").fetchall()
        finally:
            conn.close()
        _EXACT = all(float(text) == x for x, text in spelled)
    return _EXACT


_EXACT: bool | None = None


def stream_json(reader, run_id: str, series: Sequence[tuple[str, int]], with_rank: bool = False) -> None:
    """Every point of each (key, rank) in `series`, as one JSON array with a point per line."""
    out = sys.stdout
    written = False
    out.write("[")
    for name, rank in series:
        for text in _json_chunks(reader, run_id, name, rank, with_rank):
            out.write((",\n" if written else "\n") + text)
            written = True
    out.write("\n]\n" if written else "]\n")


def stream_csv(reader, run_id: str, series: Sequence[tuple[str, int]], with_rank: bool = False) -> None:
    """Every point of each (key, rank) in `series`, as CSV under one header row."""
    out = sys.stdout
    csv.writer(out).writerow(RANK_FIELDS if with_rank else POINT_FIELDS)
    for name, rank in series:
        for text in _csv_chunks(reader, run_id, name, rank, with_rank):
            out.write(text)


def _json_chunks(reader, run_id: str, name: str, rank: int, with_rank: bool) -> Iterator[str]:
    fields, head = (RANK_FIELDS, (name, rank)) if with_rank else (POINT_FIELDS, (name,))
    ranked = f',"rank":{rank:d}' if with_rank else ""
    prefix = '{"key":' + json.dumps(name, ensure_ascii=False) + ranked
    template = prefix + ',"step":%d,"value":%r,"attempt_number":%d,"logged_at":%r}'

    def general(points) -> str:
        return ",\n".join(json.dumps(dict(zip(fields, (*head, *point))), separators=(",", ":"), ensure_ascii=False)
                          for point in points)

    def spelled(point) -> str:
        text = template % point
        return general([point]) if any(word in text for word in _SPELLED_OTHERWISE) else text

    chunks = reader.series_text(run_id, name, rank, _LINE, ",\n", _formats(prefix, _JSON_FORMAT, "null"))
    if chunks is not None and _printf_exact():
        anchors = ('"value":', '"logged_at":')
        for chunk in chunks:
            yield _shorter(chunk, ":", anchors) if isinstance(chunk, str) else "".join(
                _shorter(part, ":", anchors) if isinstance(part, str) else spelled(part) for part in chunk)
        return
    for chunk in reader.series_chunks(run_id, name, rank):
        text = ",\n".join(map(template.__mod__, chunk))
        yield general(chunk) if any(word in text for word in _SPELLED_OTHERWISE) else text


def _csv_chunks(reader, run_id: str, name: str, rank: int, with_rank: bool) -> Iterator[str]:
    head = (name, rank) if with_rank else (name,)

    def general(points) -> str:
        text = io.StringIO()
        csv.writer(text).writerows((*head, *point) for point in points)  # a missing value: an empty field
        return text.getvalue()

    prefix = general([()])[:-2]  # the key quoted as csv quotes it, and the rank
    template = prefix + ",%d,%r,%d,%r\r\n"

    def spelled(point) -> str:  # one line, without its line end (the chunk's text has it)
        return (general([point]) if point[1] is None else template % point)[:-2]

    chunks = reader.series_text(run_id, name, rank, _LINE, "\r\n", _formats(prefix, _CSV_FORMAT, ""))
    if chunks is not None and _printf_exact():
        # A key csv quotes may hold anything, a float's text too: its floats keep their 17 digits.
        shorter = (lambda text: text) if '"' in prefix else (lambda text: _shorter(text, ",", ("",)))
        for chunk in chunks:
            yield (shorter(chunk) if isinstance(chunk, str) else "".join(
                shorter(part) if isinstance(part, str) else spelled(part) for part in chunk)) + "\r\n"
        return
    for chunk in reader.series_chunks(run_id, name, rank):
        text = "".join(map(template.__mod__, chunk))
        yield general(chunk) if "None" in text else text
