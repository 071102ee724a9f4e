"""The suite's order: test files that took longest in a measured run go first, so no slow file starts last.

`pytest -n 4 --dist loadfile` hands each worker whole files in collection order (with
`--no-loadscope-reorder`, in pyproject's addopts: by default xdist reorders the files by their number
of tests); a five-minute file collected last leaves one worker alone with it while the others idle. tests/file_seconds.json holds
each file's seconds from a whole run; files it does not know (new ones) keep their place after the
known ones. Within a file the order is untouched. The hooks are used by tests/conftest.py.

To measure them again: run the suite with TRACKWAY_TEST_SECONDS=FILE (each test phase's seconds are
appended to FILE as they end, so a run cut short still leaves what it measured), then
`python scripts/test_durations.py FILE`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FILE_SECONDS = TESTS / "file_seconds.json"


def file_seconds() -> dict[str, float]:
    """Seconds per test file (paths relative to the repository), from the last measured run; {} when none."""
    try:
        return json.loads(FILE_SECONDS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(session, config, items):
    seconds = file_seconds()
    if not seconds:
        return
    root = TESTS.parent

    def weight(item) -> float:
        try:
            return seconds.get(Path(item.path).resolve().relative_to(root).as_posix(), 0.0)
        except ValueError:
            return 0.0

    # sort() is stable: tests within one file, and the unknown files, keep their order.
    items.sort(key=lambda item: -weight(item))


def pytest_runtest_logreport(report):
    """With TRACKWAY_TEST_SECONDS set, one line per test phase: "seconds file" (under xdist, in the controller)."""
    out = os.environ.get("TRACKWAY_TEST_SECONDS")
    if out and os.environ.get("PYTEST_XDIST_WORKER") is None:  # a worker's reports reach the controller too
        with open(out, "a", encoding="utf-8") as lines:
            lines.write(f"{report.duration:.3f} {report.nodeid.split('::')[0]}\n")
