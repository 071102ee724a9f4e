"""A checkpoint file hashed while it is written: SHA-256 on a thread of its own (and BLAKE3, if asked, on the writer's).

    caller (the serializer)                                      hasher thread (one per file)
    write(b) ─ copy into a 4 MiB stage ─────────────────┐
      (stage full) ─ [blake3.update] ─ os.write(stage) ─┼─ queue ─► sha256.update(stage) ─ stage back to the pool
    write_held(view, owner) ─ [blake3.update] ─ os.write┘         ─► sha256.update(view)      (no copy)
    close() ─ flush ─ fsync ─────────────────── hashing finishes meanwhile ─ join ─► (size, sha256, blake3 or None)

hashlib lets go of the GIL for buffers this large, so SHA-256 runs beside the writes and the fsync
on another core instead of after them. Every file gets a sha256, the digest anyone can
check (`sha256sum`); a file opened with `blake3=True` (the torch payload's state file, which a
restore reads whole) also gets the digest a restore checks at ~3× the speed (digests.py). BLAKE3
runs on the writer's thread, not beside SHA-256 on the hasher's (together ~1.4× SHA-256's time,
which a save would wait for) nor on a thread of its own: on two cores a third busy thread slowed
the SHA-256 stream, which is what a save waits for, by 10-20%. Bytes the caller may reuse
once `write()` returns are copied into stages (a few, reused; the writer waits when the hasher is
that far behind); bytes the caller leaves alone until `close()` (`write_held`: a snapshot's
tensors) are hashed where they lie. The digests are of the bytes in the order they reach the file.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any

from trackway.checkpoints.digests import new_hasher

STAGE = 4 << 20  # one os.write per stage
_STAGES = 8  # how far (in stages) the hasher may trail the writer
_HINT_EVERY = 8 << 20
_FADVISE = hasattr(os, "posix_fadvise")
_SPARE: list[bytearray] = []  # stages kept between files: fresh ones cost page faults
_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE: room set aside past the end, the file's size unchanged

Digest = tuple[int, str, str | None]  # (size, sha256, blake3 where asked for)


class HashingWriter(io.RawIOBase):
    """A write-only file that records its size, SHA-256 and (with `blake3`) BLAKE3 when closed, after an fsync.

    `guard()` wraps every system call (it renames a full disk); `on_close` receives (size, sha256, blake3),
    or None when a write or the fsync failed; `crash_point(name)` is called at "mid_write" (after
    each os.write) and "after_payload_fsync". No fileno(): bytes written past it would not be hashed.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        guard: Callable[[], AbstractContextManager[Any]],
        on_close: Callable[[Digest | None], None],
        crash_point: Callable[[str], None],
        blake3: bool = False,
    ) -> None:
        super().__init__()
        self._name, self._guard, self._on_close, self._crash_point = name, guard, on_close, crash_point
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._sha, self._blake3 = new_hasher("sha256"), new_hasher("blake3") if blake3 else None
        self._size = self._on_disk = self._hinted = 0
        self._stage: bytearray | None = None
        self._staged = 0
        self._stages = 0  # stages this file holds (in hand, queued or free)
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._queue: queue.SimpleQueue[tuple[memoryview, bytearray | None, Any] | None] = queue.SimpleQueue()
        self._hasher: threading.Thread | None = None
        self._hasher_error: BaseException | None = None
        self._failed = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        """Write bytes the caller may change as soon as this returns (they are copied)."""
        view = self._bytes_of(data)
        with self._writing():
            rest = view
            while rest:
                if self._stage is None:
                    self._stage = self._take_stage()
                n = min(len(rest), STAGE - self._staged)
                self._stage[self._staged : self._staged + n] = rest[:n]
                self._staged, rest = self._staged + n, rest[n:]
                if self._staged == STAGE:
                    self._flush_stage()
        self._size += view.nbytes
        return view.nbytes

    def write_held(self, data: Any, owner: object) -> int:
        """Write bytes that stay unchanged until close(), `owner` keeping them alive: hashed in place, never copied."""
        view = self._bytes_of(data)
        with self._writing():
            self._flush_stage()
            self._hash_later(view, None, owner)
            self._write_out(view)
        self._size += view.nbytes
        return view.nbytes

    def reserve(self, nbytes: int) -> None:
        """Have the filesystem set aside room for the next `nbytes` bytes now; the file's size is unchanged.

        Writes into room set aside skip the filesystem's block allocation (a tenth of a safetensors
        save on this project's ext4 machines), and a disk without the room fails here, named by the
        guard, before a byte is written. Where the system or the filesystem cannot set room aside
        (no fallocate(2), a filesystem without it), nothing happens: the writes allocate as usual.
        """
        set_aside = _set_aside()
        if nbytes <= 0 or set_aside is None:
            return
        with self._writing():
            code = set_aside(self._fd, self._size, nbytes)
            if code in (errno.ENOSPC, errno.EDQUOT):
                raise OSError(code, os.strerror(code), self._name)

    def flush(self) -> None:
        if not self.closed and not self._failed:
            with self._writing():
                self._flush_stage()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._failed:
                with self._writing():  # delayed allocation can run out of room in the fsync
                    if self._hasher is None and self._staged:
                        self._hash_here()  # a small file: not worth a thread
                    self._flush_stage()
                    os.fsync(self._fd)
                self._crash_point("after_payload_fsync")
        finally:
            self._stop_hasher()
            os.close(self._fd)
            super().close()
            blake3 = self._blake3.hexdigest() if self._blake3 is not None else None
            self._on_close(None if self._failed else (self._size, self._sha.hexdigest(), blake3))
        if self._hasher_error is not None:
            raise RuntimeError(f"hashing checkpoint file {self._name} failed") from self._hasher_error

    # -- writing ---------------------------------------------------------------------------

    def _writing(self) -> _Writing:
        if self.closed or self._failed:
            raise ValueError(f"checkpoint file {self._name} is {'closed' if self.closed else 'broken by an error'}")
        return _Writing(self)

    def _write_out(self, view: memoryview) -> None:
        pos = 0
        while pos < len(view):
            written = os.write(self._fd, view[pos : pos + STAGE])
            pos += written
            self._on_disk += written
            self._crash_point("mid_write")
            if _FADVISE and self._on_disk - self._hinted >= _HINT_EVERY:
                # DONTNEED starts writeback without waiting for it: the fsync at close has little left.
                with suppress(OSError):
                    os.posix_fadvise(self._fd, self._hinted, self._on_disk - self._hinted, os.POSIX_FADV_DONTNEED)
                self._hinted = self._on_disk

    def _flush_stage(self) -> None:
        if not self._staged:
            return
        stage, staged = self._stage, self._staged
        self._stage, self._staged = None, 0
        self._hash_later(memoryview(stage)[:staged], stage, None)  # its own view: the hasher releases it
        self._write_out(memoryview(stage)[:staged])

    def _hash_here(self) -> None:
        stage, staged = self._stage, self._staged
        self._stage, self._staged = None, 0
        view = memoryview(stage)[:staged]
        self._write_out(view)
        self._sha.update(view)
        if self._blake3 is not None:
            self._blake3.update(view)
        view.release()
        self._free.put(stage)

    # -- hashing ---------------------------------------------------------------------------

    def _hash_later(self, view: memoryview, stage: bytearray | None, owner: object) -> None:
        if self._blake3 is not None:
            self._blake3.update(view)  # here, in file order: see the module docstring
        if self._hasher is None:
            self._hasher = threading.Thread(target=self._hash_queued, name=f"sha256 {self._name}", daemon=True)
            self._hasher.start()
        self._queue.put((view, stage, owner))

    def _hash_queued(self) -> None:
        while (item := self._queue.get()) is not None:
            view, stage, _owner = item
            try:
                if self._hasher_error is None:
                    self._sha.update(view)
            except BaseException as exc:  # noqa: BLE001 - raised by close(), on the writer's thread
                self._hasher_error = exc
            finally:
                if stage is not None:
                    view.release()
                    self._free.put(stage)

    def _take_stage(self) -> bytearray:
        with suppress(queue.Empty):
            return self._free.get_nowait()
        if self._stages < _STAGES:
            self._stages += 1
            with suppress(IndexError):  # another file's writer may have taken the last spare one
                return _SPARE.pop()
            return bytearray(STAGE)
        return self._free.get()  # waits while the hasher is _STAGES stages behind

    def _stop_hasher(self) -> None:
        if self._hasher is not None:
            self._queue.put(None)
            self._hasher.join()
            self._hasher = None
            if self._hasher_error is not None and not self._failed:
                self._failed = True
        if self._stage is not None:
            self._free.put(self._stage)
            self._stage = None
        while len(_SPARE) < _STAGES:
            try:
                _SPARE.append(self._free.get_nowait())
            except queue.Empty:
                break

    @staticmethod
    def _bytes_of(data: Any) -> memoryview:
        view = memoryview(data)
        view = view if view.c_contiguous else memoryview(view.tobytes())
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")


@functools.cache
def _set_aside() -> Callable[[int, int, int], int] | None:
    """(fd, offset, nbytes) -> 0 or the errno: Linux's fallocate(2), size kept; None where there is none.

    Not os.posix_fallocate: where the filesystem cannot set room aside, glibc's emulation writes
    a byte into every block, which on a network filesystem costs more than the save it would help.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    call.restype = ctypes.c_int

    def set_aside(fd: int, offset: int, nbytes: int) -> int:
        return 0 if call(fd, _KEEP_SIZE, offset, nbytes) == 0 else ctypes.get_errno()

    return set_aside


class _Writing:
    """Marks the writer broken until the block succeeds, and names a full disk (the writer's guard)."""

    __slots__ = ("_writer", "_guard")

    def __init__(self, writer: HashingWriter) -> None:
        self._writer = writer
        self._guard = writer._guard()

    def __enter__(self) -> None:
        self._writer._failed = True
        self._guard.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:
        suppressed = self._guard.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._writer._failed = False
        return suppressed
