"""Reading an attempt's `output.log` (written by its shim) from an offset, and finding where its last lines begin.

Shared by `trackway logs` and the API's `/api/jobs/{id}/logs`: both read a log that may still be
growing, or that the attempt has not created yet.
"""

from __future__ import annotations

from pathlib import Path

TAIL_PROBE_BYTES = 64 * 1024  # how far back from the end the last lines are looked for


def read_from(path: Path, offset: int) -> bytes:
    """The bytes after `offset`; nothing when the attempt has not written its first line yet."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def tail_offset(path: Path, lines: int) -> int:
    """Where the last `lines` lines of `path` begin (0 for a short or missing file)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    start = max(0, size - TAIL_PROBE_BYTES)
    data = read_from(path, start)
    cut = len(data.rstrip(b"\n"))
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start if start == 0 else start + data.find(b"\n") + 1
    return start + cut + 1
