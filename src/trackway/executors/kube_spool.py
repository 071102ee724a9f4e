"""The pod's spool frames read back out of its log: each file's bytes written here by offset, any loss recorded.

A pod has one way back to the executor, its log, which it shares with the command it runs. Its
entry point (kube_manifest.LAUNCH_SCRIPT) prints what the spool's files gained as frames:

    @@trackway-spool NAME OFFSET SIZE     OFFSET: where the bytes go in NAME, or `whole` for a file replaced whole
    @@: <base64>                          as many lines as base64(1) prints, each its own write
    @@trackway-spool-end NAME

Pods started by an earlier trackway print `@@trackway-spool NAME OFFSET` and bare base64 lines;
those frames are still read. The command's lines are not the frame's: a line without the prefix is
the command's, and a line the command left without its newline when a frame began ends where the
frame's marker starts (what comes before the marker is the command's). The pod never sends a byte
twice, so a frame that cannot be read (a line spoiled or lost: SIZE says so), or a gap before a
frame's offset, is recorded as lost (`spool.record_lost_bytes`), never passed over: what those bytes
held is then not known, and `trackway explain` says so.
"""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from trackway.executors.kube_manifest import SPOOL_BEGIN, SPOOL_DATA, SPOOL_END
from trackway.spool import LOCAL_ONLY_FILES, NOTE_FILE, record_lost_bytes, record_lost_copy

MARKER = re.compile(r"@@trackway-spool(?:-end)? |@@: ")
# One line of base64(1)'s output: a frame's line in the format without prefixes.
BASE64_LINE = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class SpoolFrames:
    """Reads a pod's log lines in order, applying frames to `spool_dir`; `state` (JSON) carries a frame across reads."""

    def __init__(self, spool_dir: Path, state: dict[str, Any]):
        self.spool_dir = spool_dir
        self.state = state

    def line(self, text: str) -> str | None:
        """The command's part of one log line (None when it had none); the frame's part applied or kept."""
        found = MARKER.search(text)
        if found is None:
            if self.state.get("open") is not None and self.state.get("size") is None and text.strip() \
                    and BASE64_LINE.fullmatch(text.strip()):
                self.state["chunks"].append(text.strip())  # a frame in the earlier format: bare base64
                return None
            return text
        marked = text[found.start():]
        if marked.startswith(SPOOL_DATA):
            if self.state.get("open") is None or self.state.get("size") is None:
                return text  # no frame of this format open: "@@: " is the command's own
            self.state["chunks"].append(marked[len(SPOOL_DATA):].strip())
        elif marked.startswith(SPOOL_END):
            self._close()
        else:
            self._open(marked[len(SPOOL_BEGIN):].split())
        return text[:found.start()] or None

    def _open(self, fields: list[str]) -> None:
        if self.state.get("open") is not None:
            self._lose(self.state, "its end marker never came")
        name, offset = (fields + ["", ""])[:2]
        size = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
        self.state.update(open=name, offset=offset, size=size, chunks=[])

    def _close(self) -> None:
        frame = {key: self.state.pop(key, None) for key in ("open", "offset", "size", "chunks")}
        if frame["open"] is None:
            return  # its beginning was lost: the next frame's offset shows the gap
        try:
            data = base64.b64decode("".join(frame["chunks"] or ()), validate=True)
        except (binascii.Error, ValueError):
            self._lose(frame, "its lines no longer decode (one spoiled)")
            return
        if frame["size"] is not None and len(data) != frame["size"]:
            self._lose(frame, f"it brought {len(data)} bytes of the {frame['size']} it announced (a line lost)")
            return
        name = self._name(frame["open"])
        if name is not None:
            self._apply(name, frame["offset"], data)

    def _name(self, said: str) -> str | None:
        """The spool file a frame is for, or None for a name no pod's SDK writes (and nothing is written)."""
        name = posixpath.basename(said)
        return name if name and not name.startswith(".") and name not in LOCAL_ONLY_FILES else None

    def _apply(self, name: str, offset: str, data: bytes) -> None:
        """A whole file replaced; bytes from `offset` appended unless this copy already holds them."""
        target = self.spool_dir / name
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        if offset == "whole":
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
        if not offset.isdigit():
            return
        at = int(offset)
        size = target.stat().st_size if target.exists() else 0
        if size > at:
            return  # read already (a log read twice where the pod's clock and ours overlap)
        if size < at:  # a frame between this copy's end and this one never came
            record_lost_bytes(self.spool_dir, name, at, "no frame of the pod's log brought them: the next that came "
                                                        f"began at byte {at}")
        with open(target, "ab") as f:
            f.write(data)

    def _lose(self, frame: dict[str, Any], why: str) -> None:
        """Record a frame that could not be read: its range where it says it, else the next frame's gap shows it."""
        name, offset, size = self._name(frame.get("open") or ""), frame.get("offset"), frame.get("size")
        if name is None or size is None:
            return  # the earlier format says no size: the next frame's offset shows the gap
        if offset == "whole":
            if name == NOTE_FILE:  # a heartbeat's copy is replaced by the next; the note is sent once
                record_lost_copy(self.spool_dir, name, size, f"the pod's copy of {name} could not be read: {why}")
        elif offset is not None and str(offset).isdigit():
            record_lost_bytes(self.spool_dir, name, int(offset) + size,
                              f"a frame of the pod's log could not be read: {why}")
