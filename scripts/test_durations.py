"""Write tests/file_seconds.json (each test file's seconds) from a measured run, for the suite's order.

    TRACKWAY_TEST_SECONDS=/tmp/seconds.txt .venv/bin/python -m pytest -n 4 --dist loadfile -m "not slow"
    python scripts/test_durations.py /tmp/seconds.txt

The run appends "seconds file" for every test phase (set-up, call, tear-down) as it ends
(tests/slowest_first.py), so even a run cut short leaves what it measured. tests/slowest_first.py
reads the file written here and hands the slowest files out first.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "file_seconds.json"


def per_file(lines: list[str]) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        value, _, name = line.strip().partition(" ")
        if name and (ROOT / name).exists():
            seconds[name] += float(value)
    return {name: round(total, 1) for name, total in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/test_durations.py SECONDS_FILE", file=sys.stderr)
        return 2
    seconds = per_file(Path(argv[0]).read_text(encoding="utf-8").splitlines())
    if not seconds:
        print(f"{argv[0]}: no line names a test file", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(seconds, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
