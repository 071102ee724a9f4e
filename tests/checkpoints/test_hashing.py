"""A payload file hashed while it is written: the digest is the file's, however the bytes arrived."""

from __future__ import annotations

import array
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from blake3 import blake3

from trackway.checkpoints.hashing import STAGE
from trackway.checkpoints.layout import MANIFEST
from trackway.checkpoints.store import CheckpointStore


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pieces(data: bytes, sizes: list[int]) -> list[memoryview]:
    view, out, pos, i = memoryview(data), [], 0, 0
    while pos < len(data):
        out.append(view[pos : pos + sizes[i % len(sizes)]])
        pos, i = pos + sizes[i % len(sizes)], i + 1
    return out


PATTERNS = {
    "small copied writes": lambda f, data: [f.write(p) for p in pieces(data, [1, 4095, 7, 65536])],
    "one copied write of many stages": lambda f, data: f.write(data),  # the writer waits for the hasher
    "held only": lambda f, data: [f.write_held(p, data) for p in pieces(data, [3 << 20, 5, 1 << 20])],
    "held and copied, interleaved": lambda f, data: [
        f.write_held(p, data) if i % 2 else f.write(p) for i, p in enumerate(pieces(data, [10, 6 << 20, 333, 2 << 20]))
    ],
    "not bytes, not B-formatted": lambda f, data: [
        f.write(b""), f.write(array.array("d", data)), f.write_held(b"", None)
    ],
}


@pytest.mark.parametrize("pattern", PATTERNS, ids=list(PATTERNS))
def test_the_digest_taken_while_writing_is_the_files(tmp_path: Path, pattern: str) -> None:
    data = os.urandom(12 * STAGE + 123 * 8)  # more than the stages the hasher may trail by
    store = CheckpointStore(tmp_path)
    pending = store.begin(1)
    f = pending.open("big.bin")
    PATTERNS[pattern](f, data)
    f.close()
    assert pending.digests == {"big.bin": {"size": len(data), "sha256": sha(data)}}
    info = pending.commit()
    on_disk = (info.path / "big.bin").read_bytes()
    assert on_disk == data
    manifest = json.loads((info.path / MANIFEST).read_bytes())
    assert manifest["files"]["big.bin"] == {"size": len(data), "sha256": sha(on_disk)}
    assert store.verify(info) == []



@pytest.mark.parametrize("pattern", ["one copied write of many stages", "held and copied, interleaved"])
def test_a_file_opened_with_blake3_records_both_digests_and_is_verified_by_its_blake3(tmp_path: Path,
                                                                                      pattern: str) -> None:
    data = os.urandom(12 * STAGE + 5)
    store = CheckpointStore(tmp_path)
    pending = store.begin(1)
    with pending.open("state.pt", blake3=True) as f:
        PATTERNS[pattern](f, data)
    digests = {"size": len(data), "sha256": sha(data), "blake3": blake3(data).hexdigest()}
    assert pending.digests == {"state.pt": digests}
    info = pending.commit()
    assert json.loads((info.path / MANIFEST).read_bytes())["files"]["state.pt"] == digests
    assert store.verify(info) == []

    flipped = bytearray(data)
    flipped[7 * STAGE] ^= 1
    (info.path / "state.pt").write_bytes(flipped)
    got, listed = blake3(bytes(flipped)).hexdigest()[:12], digests["blake3"][:12]
    assert store.verify(info) == [f"state.pt: blake3 {got}… but manifest says {listed}…"]


def test_a_small_file_opened_with_blake3_gets_it_without_a_thread(tmp_path: Path) -> None:
    pending = CheckpointStore(tmp_path).begin(1)
    before = threading.active_count()
    with pending.open("small.pt", blake3=True) as f:
        f.write(b"tiny")
        assert threading.active_count() == before
    assert pending.digests["small.pt"]["blake3"] == blake3(b"tiny").hexdigest()

def test_a_small_file_is_hashed_without_a_thread(tmp_path: Path) -> None:
    pending = CheckpointStore(tmp_path).begin(1)
    before = threading.active_count()
    with pending.open("small.json") as f:
        f.write(b'{"a": 1}')
        f.write(b"\n")
        assert threading.active_count() == before
    assert pending.digests["small.json"] == {"size": 9, "sha256": sha(b'{"a": 1}\n')}


def test_files_written_side_by_side_each_get_their_own_digest(tmp_path: Path) -> None:
    pending = CheckpointStore(tmp_path).begin(1)
    parts = [os.urandom(3 * STAGE + n) for n in (1, 2, 3)]
    files = [pending.open(f"part-{i}.bin") for i in range(3)]
    for chunk in range(0, 3 * STAGE + 3, STAGE // 2):
        for f, data in zip(files, parts):
            f.write_held(memoryview(data)[chunk : chunk + STAGE // 2], data)
    for f in files:
        f.close()
    assert pending.digests == {f"part-{i}.bin": {"size": len(d), "sha256": sha(d)} for i, d in enumerate(parts)}


def test_a_closed_file_refuses_writes_and_closes_once(tmp_path: Path) -> None:
    pending = CheckpointStore(tmp_path).begin(1)
    f = pending.open("a.bin")
    f.write(b"abc")
    f.close()
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.write(b"more")
    with pytest.raises(ValueError, match="closed"):
        f.write_held(b"more", None)
    with pytest.raises(OSError):
        f.fileno()  # bytes written past the writer would not be hashed
    assert pending.digests["a.bin"]["size"] == 3


def test_room_reserved_before_writing_is_the_files_and_its_size_stays_what_was_written(tmp_path: Path) -> None:
    data = os.urandom(3 * STAGE + 17)
    store = CheckpointStore(tmp_path)
    pending = store.begin(1)
    f = pending.open("state.bin")
    f.reserve(len(data) + STAGE)  # more than will be written: the file must not keep the rest as bytes
    path = pending.path / "state.bin"
    reserved = os.stat(path)
    assert reserved.st_size == 0
    assert reserved.st_blocks * 512 >= len(data) + STAGE  # set aside on disk, not written
    f.write(data[:5])
    f.write_held(memoryview(data)[5:], data)
    f.close()
    assert pending.digests == {"state.bin": {"size": len(data), "sha256": sha(data)}}
    info = pending.commit()
    assert (info.path / "state.bin").read_bytes() == data
    assert store.verify(info) == []
