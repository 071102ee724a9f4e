"""Write the performance table (README.md, docs/guide/performance.md) from what `make bench` measured.

    python scripts/gen_performance.py [--check]

`bench/run_all.py` writes bench/results.json at the end of every run (a run of some benches
replaces only their rows) and then runs this, so the table in README.md and in docs/guide/performance.md,
between the markers `<!-- performance:begin -->` and `<!-- performance:end -->`, is what the last
`make bench` printed, never a figure pasted by hand. `--check` writes nothing and fails when either
table is not what the committed results make of it; tests/docs/test_performance_table.py does the same.

Each row names the command that measured it (`python bench/NAME.py`), the value, the baseline the
ratio was taken against (measured in the same run, in alternation where the bench says so), the
target, and whether it was met.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results.json"
PAGES = (ROOT / "README.md", ROOT / "docs" / "guide" / "performance.md")
BEGIN = "<!-- performance:begin -->"
END = "<!-- performance:end -->"


def human(value: float, unit: str) -> str:
    """A value as bench/_common.py prints it: seconds scaled to µs/ms/s, other units as counts."""
    if unit != "s":
        return f"{value:,.0f} {unit}" if abs(value) >= 10 or value == int(value) else f"{value:,.2f} {unit}"
    if value < 1e-3:
        return f"{value * 1e6:.1f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace("\n", " ")


def row_cells(row: dict[str, Any]) -> list[str]:
    unit = row["unit"]
    sign = "≥" if row["higher_is_better"] else "≤"
    baseline = ""
    if row.get("baseline"):
        baseline = human(row["baseline"], unit)
        if row.get("baseline_name"):
            baseline = f"{baseline} ({row['baseline_name']})"
    ratio = f"{row['ratio']:.2f}×" if row.get("ratio") is not None else ""
    targets = []
    if row.get("target") is not None:
        targets.append(f"{sign} {human(row['target'], unit)}")
    if row.get("target_ratio") is not None:
        targets.append(f"{sign} {row['target_ratio']:g}×")
    met = {None: "", True: "yes", False: "**missed**"}[row.get("met")]
    return [row["figure"], human(row["value"], unit), baseline, ratio, " and ".join(targets), met,
            f"`python bench/{row['bench']}`"]


def render(results: dict[str, Any]) -> str:
    """The Markdown block that goes between the markers (markers excluded)."""
    machine = results.get("machine", {})
    load = machine.get("load_average")
    dates = sorted({row.get("measured_at", results.get("measured_at", "")) for row in results.get("rows", [])} - {""})
    when = f"between {dates[0]} and {dates[-1]}" if len(dates) > 1 else f"on {dates[0] if dates else 'a date not recorded'}"
    lines = [
        "",
        f"Measured by `make bench` {when} (the last run"
        + (f": {machine['cpus']} CPUs" if machine.get("cpus") else "")
        + (f", load average {load[0]:.1f} when it began" if load else "")
        + (f", Python {machine['python']}" if machine.get("python") else "")
        + "). Written by `scripts/gen_performance.py` from `bench/results.json`; do not edit by hand.",
        "",
        "| figure | value | baseline | ratio | target | met | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results.get("rows", []):
        lines.append("| " + " | ".join(cell(text) for text in row_cells(row)) + " |")
    missed = [row["figure"] for row in results.get("rows", []) if row.get("met") is False]
    failed = results.get("failed", [])
    lines.append("")
    if missed or failed:
        lines.append(f"Missed: {len(missed)} figure{'s' if len(missed) != 1 else ''}"
                     + (f"; benches that failed outright: {', '.join(failed)}" if failed else "") + ".")
    else:
        lines.append("Every target was met in that run.")
    lines.append("")
    return "\n".join(lines)


def rewritten(page: Path, text: str, block: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{page.relative_to(ROOT)}: expected the markers {BEGIN} and {END} around the performance table")
    return text[: start + len(BEGIN)] + "\n" + block + text[end:]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail when README.md differs")
    args = parser.parse_args(argv)
    if not RESULTS.exists():
        print(f"{RESULTS.relative_to(ROOT)}: not found; `make bench` writes it", file=sys.stderr)
        return 2
    block = render(json.loads(RESULTS.read_text(encoding="utf-8")))
    stale = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = rewritten(page, text, block)
        if new == text:
            continue
        if args.check:
            stale.append(str(page.relative_to(ROOT)))
        else:
            page.write_text(new, encoding="utf-8")
    if stale:
        print(f"{', '.join(stale)}: the performance table is not what bench/results.json makes of it: "
              "run `python scripts/gen_performance.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
