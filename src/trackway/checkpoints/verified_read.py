"""A checkpoint file read once into memory, hashed as it is read: what a restore parses is what was verified.

    loader's thread                                       hasher thread (one per file)
    readinto piece by piece, in file order ─── queue ───► blake3.update(the bytes just read)
    (all read) ─ join ─► size and digest against the manifest ─► the pieces, or CheckpointCorrupt
                                                          prefault thread (prefault.py)
                                                          the regions' new pages faulted in, last first

One read of the file does both jobs: the bytes hashed are the very bytes the loader then parses
(a second read could see other bytes), and nothing of a file that fails is parsed at all. Reading
(the disk, or a copy out of the page cache) and hashing overlap on two cores; the digest is the
manifest entry's blake3 where it has one (about 4.5 GB/s on a core here, faster than a cold read),
else its sha256 (one sequential stream at about 1.7 GB/s, which the read then waits for; digests.py).
In a new process the regions are new pages, each faulted in at its first write, which costs about
as much as the copy: a third thread faults them in ahead of the reader (prefault.py).

Regions the caller names (a tensor's bytes) are read into memory of their own from `allocate`
(a torch storage), which the loader hands out as it lies, without another copy; the rest (zip
headers, the pickle, a safetensors header) into bytearrays. Which regions there are is only a
hint taken from a look at the file beforehand: `take` serves any range from whatever was read.
"""

from __future__ import annotations

import bisect
import io
import os
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trackway.checkpoints.digests import new_hasher, usable_cores, verified_by
from trackway.checkpoints.layout import CheckpointCorrupt, CheckpointError
from trackway.checkpoints.prefault import Prefaulter

CHUNK = 8 << 20  # one readinto and one hash step; the hasher trails the reader by whole chunks

# (nbytes) -> (owner, a writable memoryview of its nbytes bytes)
Allocate = Callable[[int], tuple[Any, memoryview]]


@dataclass(frozen=True)
class Piece:
    offset: int
    owner: Any  # a caller's allocation (a named region), or the bytearray behind `view`
    view: memoryview
    region: bool


class VerifiedFile:
    """A file's bytes, in pieces laid end to end, whose size and sha256 matched its manifest entry."""

    def __init__(self, path: Path, size: int, pieces: list[Piece]) -> None:
        self.path = path
        self.size = size
        self.pieces = pieces
        self._starts = [p.offset for p in pieces]

    def region(self, start: int, stop: int) -> Any | None:
        """The owner of the named region that is exactly bytes [start, stop), or None."""
        i = bisect.bisect_left(self._starts, start)
        if i < len(self.pieces):
            piece = self.pieces[i]
            if piece.region and piece.offset == start and piece.view.nbytes == stop - start:
                return piece.owner
        return None

    def take(self, start: int, out: memoryview) -> int:
        """Copy the bytes from `start` into `out`, as many as fit and the file has; how many."""
        done = 0
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while done < out.nbytes and i < len(self.pieces):
            piece = self.pieces[i]
            at = start + done - piece.offset
            n = min(out.nbytes - done, piece.view.nbytes - at)
            if n > 0:
                out[done : done + n] = piece.view[at : at + n]
                done += n
            i += 1
        return done

    def file(self) -> io.RawIOBase:
        """A read-only, seekable file over the bytes (for readers that want one)."""
        return _PieceFile(self)


def read_verified(
    path: Path,
    name: str,
    entry: dict[str, Any],
    regions: Iterable[tuple[int, int]] = (),
    allocate: Allocate | None = None,
) -> VerifiedFile:
    """Read `path` (the manifest's `name`, listed as `entry`: its size and digests) once, hashing as it goes.

    `regions` ((offset, nbytes), sorted, not overlapping) are read into memory from `allocate`.
    Raises CheckpointCorrupt with the problem in the words verification uses (a wrong size, a
    wrong digest), after reading nothing more than it took to tell; CheckpointError when the file
    cannot be read for another reason (EIO, permissions: no proof of corruption).
    """
    size = entry.get("size")
    algorithm, expected = verified_by(entry)
    try:
        with open(path, "rb", buffering=0) as f:
            actual = os.fstat(f.fileno()).st_size
            if type(size) is not int or actual != size:
                raise _corrupt(path, f"{name}: {actual} bytes, manifest says {size}")
            pieces = _plan(size, regions if allocate is not None else (), allocate)
            digest = _read_hashing(f, pieces, algorithm)
            extra = f.read(1)
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"cannot verify {path.parent}: {name}: {exc.strerror or exc}") from exc
    if digest is None or extra:
        got = "fewer" if digest is None else "more"
        raise _corrupt(path, f"{name}: {got} bytes than the {size} its manifest says (it changed while read)")
    if digest != expected:
        raise _corrupt(path, f"{name}: {algorithm} {digest[:12]}… but manifest says {str(expected)[:12]}…")
    return VerifiedFile(path, size, pieces)


def _corrupt(path: Path, problem: str) -> CheckpointCorrupt:
    return CheckpointCorrupt(f"checkpoint {path.parent} does not match its manifest: {problem}", [problem])


def _plan(size: int, regions: Iterable[tuple[int, int]], allocate: Allocate | None) -> list[Piece]:
    """The pieces covering [0, size): each usable region, and bytearrays for the gaps."""
    pieces, at = [], 0
    for offset, nbytes in regions:
        if offset < at or nbytes <= 0 or offset + nbytes > size:
            continue  # a hint that does not fit: those bytes land in a gap
        if offset > at:
            gap = bytearray(offset - at)
            pieces.append(Piece(at, gap, memoryview(gap), False))
        owner, view = allocate(nbytes)
        pieces.append(Piece(offset, owner, view, True))
        at = offset + nbytes
    if at < size or not pieces:
        gap = bytearray(size - at)
        pieces.append(Piece(at, gap, memoryview(gap), False))
    return pieces


def _read_hashing(f: Any, pieces: list[Piece], algorithm: str) -> str | None:
    """Fill the pieces in order while a thread hashes what was read; the hex digest, or None at an early EOF."""
    hashing = new_hasher(algorithm, threads=usable_cores())
    chunks: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
    failed: list[BaseException] = []

    def hash_chunks() -> None:
        while (chunk := chunks.get()) is not None:
            try:
                if not failed:
                    hashing.update(chunk)
            except BaseException as exc:  # noqa: BLE001 - raised on the reader's thread below
                failed.append(exc)

    # Started first: should it fail, no hasher is left waiting on the queue.
    prefault = Prefaulter([piece.view for piece in pieces if piece.region])
    hasher = threading.Thread(target=hash_chunks, name=f"{algorithm} verify", daemon=True)
    hasher.start()
    complete = False
    try:
        for piece in pieces:
            view, done = piece.view, 0
            while done < view.nbytes:
                n = f.readinto(view[done : done + CHUNK])
                if not n:
                    return None
                chunks.put(view[done : done + n])
                done += n
        complete = True
    finally:
        prefault.stop()
        chunks.put(None)
        hasher.join()  # the pieces must outlive every hash step that reads them
    if failed:
        raise RuntimeError("hashing a checkpoint file failed") from failed[0]
    return hashing.hexdigest() if complete else None


class _PieceFile(io.RawIOBase):
    def __init__(self, verified: VerifiedFile) -> None:
        super().__init__()
        self._verified = verified
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._verified.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = self._verified.take(self._pos, memoryview(buffer).cast("B"))
        self._pos += n
        return n
