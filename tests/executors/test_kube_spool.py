"""A pod's spool frames read out of its log lines: bytes by offset, the command's lines kept, any loss recorded."""

from __future__ import annotations

import base64
import json

from trackway.executors.kube_spool import SpoolFrames
from trackway.spool import LOST_FILE, decode_lost_bytes


def _events(first: int, count: int) -> bytes:
    return b"".join(json.dumps({"seq": i, "kind": "checkpoint_committed", "step": 10 * i}).encode() + b"\n"
                    for i in range(first, first + count))


def _frame(name: str, offset: int | str, data: bytes) -> list[str]:
    """The lines the pod's relay prints for `data` (base64(1)'s 76-character lines, each prefixed)."""
    return ([f"@@trackway-spool {name} {offset} {len(data)}"]
            + [f"@@: {line}" for line in base64.encodebytes(data).decode().splitlines()]
            + [f"@@trackway-spool-end {name}"])


def _read(tmp_path, lines: list[str], state: dict | None = None) -> tuple[list[str], dict]:
    """What the command said, line by line, and the state to carry to the next read."""
    state = {} if state is None else state
    frames = SpoolFrames(tmp_path / "spool", state)
    said = [part for part in (frames.line(line) for line in lines) if part is not None]
    return said, state


def _lost(tmp_path) -> list[dict]:
    path = tmp_path / "spool" / LOST_FILE
    return [decode_lost_bytes(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_the_commands_lines_inside_a_frame_even_base64_only_ones_are_its_own_and_the_frame_arrives(tmp_path):
    data = _events(0, 4)
    frame = _frame("events.jsonl", 0, data)
    # "done" and "abcd" are all base64 characters: in the format without prefixes they spoiled the frame.
    said, _ = _read(tmp_path, [frame[0], frame[1], "done", "step 25: loss 1.5", "abcd", *frame[2:], "step 26"])
    assert said == ["done", "step 25: loss 1.5", "abcd", "step 26"]
    assert (tmp_path / "spool" / "events.jsonl").read_bytes() == data
    assert _lost(tmp_path) == []


def test_a_line_the_command_left_without_its_newline_ends_where_the_frame_begins(tmp_path):
    # A progress bar writes without a newline; the relay's marker then lands in the middle of its log line.
    data = _events(0, 2)
    frame = _frame("events.jsonl", 0, data)
    said, _ = _read(tmp_path, ["epoch 1: 50%" + frame[0], *frame[1:-1], "60%" + frame[-1], "70%"])
    assert said == ["epoch 1: 50%", "60%", "70%"]
    assert (tmp_path / "spool" / "events.jsonl").read_bytes() == data


def test_a_frame_that_lost_a_line_is_recorded_lost_and_later_bytes_keep_their_offsets(tmp_path):
    first, second, third = _events(0, 3), _events(3, 4), _events(7, 2)
    one = _frame("events.jsonl", 0, first)
    two = _frame("events.jsonl", len(first), second)
    three = _frame("events.jsonl", len(first) + len(second), third)
    assert len(two) > 3
    said, state = _read(tmp_path, [*one, *two[:2], *two[3:]])  # one of the second frame's lines never came
    _read(tmp_path, three, state)  # a later poll

    arrived = (tmp_path / "spool" / "events.jsonl").read_bytes()
    start, end = len(first), len(first) + len(second)
    assert len(arrived) == len(first) + len(second) + len(third)
    assert arrived[:start] == first and arrived[end:] == third  # every byte that came is where the pod wrote it
    assert arrived[start:end].strip() == b""  # blanks stand in for the lost ones: no line made of two halves
    (lost,) = _lost(tmp_path)
    assert (lost["file"], lost["from"], lost["to"]) == ("events.jsonl", start, end)
    assert "a line lost" in lost["why"]
    assert said == []


def test_a_frame_never_seen_shows_as_a_gap_before_the_next(tmp_path):
    first, second, third = _events(0, 2), _events(2, 2), _events(4, 2)
    _read(tmp_path, [*_frame("events.jsonl", 0, first), *_frame("events.jsonl", len(first) + len(second), third)])
    arrived = (tmp_path / "spool" / "events.jsonl").read_bytes()
    assert arrived[:len(first)] == first and arrived[len(first) + len(second):] == third
    (lost,) = _lost(tmp_path)
    assert (lost["from"], lost["to"]) == (len(first), len(first) + len(second))


def test_frames_from_a_pod_an_earlier_trackway_started_are_still_read(tmp_path):
    # No size, no prefix: bare base64 lines between the markers.
    data = _events(0, 3)
    wrapped = base64.encodebytes(data).decode().splitlines()
    said, _ = _read(tmp_path, ["@@trackway-spool events.jsonl 0", wrapped[0], "step 1: loss 2.0", *wrapped[1:],
                               "@@trackway-spool-end events.jsonl"])
    assert said == ["step 1: loss 2.0"]
    assert (tmp_path / "spool" / "events.jsonl").read_bytes() == data


def test_a_lost_copy_of_the_attempts_note_is_recorded_and_a_heartbeats_is_not(tmp_path):
    note = json.dumps({"reason": "oom", "message": "CUDA out of memory"}).encode()
    beat = json.dumps({"step": 12}).encode()
    spoiled_note, spoiled_beat = _frame("termination.json", "whole", note), _frame("heartbeat.json", "whole", beat)
    _read(tmp_path, [*spoiled_note[:1], *spoiled_note[2:], *spoiled_beat[:1], *spoiled_beat[2:]])
    assert not (tmp_path / "spool" / "termination.json").exists()  # nothing half-written stands for the note
    (lost,) = _lost(tmp_path)
    assert lost["file"] == "termination.json" and lost["whole"]


def test_a_pod_cannot_write_the_files_only_this_machine_writes(tmp_path):
    said, _ = _read(tmp_path, [*_frame(LOST_FILE, 0, b'{"file": "events.jsonl", "from": 0, "to": 9}\n'),
                               *_frame("quarantine.jsonl", 0, b"{}\n"), *_frame("../escape.jsonl", 0, b"{}\n")])
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["escape.jsonl"]  # kept inside spool/
    assert said == []
