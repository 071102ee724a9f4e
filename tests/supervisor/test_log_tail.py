"""The log tail a receipt's classification reads (supervisor/loop.py's read_log_tail): the last whole lines."""

from __future__ import annotations

from trackway.supervisor.loop import read_log_tail


def test_the_tail_is_the_last_whole_lines_and_a_missing_log_is_none(tmp_path):
    log = tmp_path / "output.log"
    assert read_log_tail(log) == []
    log.write_bytes(b"")
    assert read_log_tail(str(log)) == []
    lines = [f"step {i} loss {1 / (i + 1):.4f}" for i in range(5000)] + ["Traceback (most recent call last):",
                                                                       "RuntimeError: CUDA out of memory"]
    log.write_text("\n".join(lines) + "\n")
    tail = read_log_tail(log, max_bytes=1000, max_lines=200)
    assert tail[-2:] == lines[-2:]
    assert tail == lines[-len(tail):] and 0 < len(tail) < 60  # the line cut at the 1000th byte from the end is left out
    assert read_log_tail(log, max_bytes=10**6, max_lines=3) == lines[-3:]
    log.write_bytes(b"caf\xc3\xa9 \xff\nlast")  # not UTF-8 in places, no final newline
    assert read_log_tail(log) == ["café \ufffd", "last"]
