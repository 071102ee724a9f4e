"""Asynchronous checkpoint saving: the caller only copies state to host memory; one thread writes and commits.

The writer thread is started once, with the first save, and kept (a ThreadPoolExecutor of one):
starting a thread per save costs the caller a GIL hand-over, ~5 ms, longer than many copies.
Like a non-daemon thread, it finishes the save in flight before the interpreter exits.

    caller thread                       writer thread
    save(step 10) ─ wait idle ─ capture ─► begin → serialize+hash → commit → on_commit
    (training continues)                                                        │
    save(step 20) ─ wait idle ◄───────────────────────────────────────────────────┘
                  ─ capture ─► ...

How reused host buffers stay safe: `save()` waits for the previous job to finish (commit or
abort) *before* it captures, and only the writer thread reads a snapshot. So a capture never
overwrites buffers that a write is still reading, and at most one save is ever in flight.

A failure on the writer thread aborts the pending checkpoint (`commit_to` does; its temp
directory is removed and no marker is ever written) and is raised as CheckpointError from the
next `save()`, `wait()` or `close()`. A full disk keeps its errno on the way: the protocol
raises CheckpointDiskFull (a CheckpointError and an OSError with errno ENOSPC), which is raised
as it is, and any other OSError with ENOSPC is raised unwrapped rather than hidden in a message.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trackway.checkpoints.layout import CheckpointError, CheckpointInfo
from trackway.checkpoints.torch_state import HostBuffers, Snapshot, capture
from trackway.checkpoints.write import PendingCheckpoint, disk_full_named

Persist = Callable[[Snapshot], "CheckpointInfo | None"]
OnCommit = Callable[[CheckpointInfo], None]


def commit_to(
    begin: Callable[[], PendingCheckpoint], *, metrics: dict | None = None, filename: str | None = None
) -> Persist:
    """The single-process persist: open the pending checkpoint, serialize the snapshot (into `filename`,
    by default the snapshot's: `state.pt` or `state.safetensors`), commit.

    Any failure aborts the pending checkpoint, so no marker is ever written for it. A full disk
    is raised as CheckpointDiskFull, whichever layer met it.
    """

    def persist(snapshot: Snapshot) -> CheckpointInfo:
        pending = begin()
        try:
            with disk_full_named(Path(pending.path).parent, pending.step):
                snapshot.write(pending, filename)
                return pending.commit(metrics=metrics)
        except BaseException:
            abort_quietly(pending)
            raise

    return persist


def abort_quietly(pending: PendingCheckpoint) -> None:
    """Abort a pending checkpoint without letting a second failure hide the first."""
    try:
        pending.abort()
    except Exception:  # noqa: BLE001 - the original failure is the one worth raising
        pass


class AsyncSaver:
    """Saves captured state on one background thread, one save at a time."""

    def __init__(self, buffers: HostBuffers | None = None, *, name: str = "trackway-checkpoint-writer") -> None:
        self.buffers = buffers if buffers is not None else HostBuffers()
        self._name = name
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._failure: BaseException | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def save(
        self,
        persist: Persist,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        data_state: Any = None,
        extra: Any = None,
        on_commit: OnCommit | None = None,
        blocking: bool = False,
        format: str = "torch",  # noqa: A002 - the user-facing word
    ) -> None:
        """Capture now; `persist` the snapshot on the writer thread (or here, when `blocking`).

        `persist` writes and commits the snapshot, returning the committed info (None where
        another process commits, as on rank > 0); `commit_to(store.begin-callable)` is the
        usual one. `format` is the payload's ("torch" or "safetensors"). Raises the previous
        save's failure before capturing anything.
        """
        if self._closed:
            raise CheckpointError("this AsyncSaver is closed; create a new one to save again")
        self.wait()
        writer = None if blocking else self._writer_thread()
        snapshot = capture(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            data_state=data_state,
            extra=extra,
            buffers=self.buffers,
            format=format,
        )
        job = _Job(persist, snapshot, on_commit)
        self._idle.clear()
        if writer is not None:
            try:
                writer.submit(self._run, job)
                return
            except RuntimeError:
                pass  # the interpreter is exiting and takes no new work for threads: save here
        try:
            job.run()
        except Exception as exc:
            if _keeps_its_type(exc):
                raise
            raise CheckpointError(f"checkpoint save failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._idle.set()

    def wait(self) -> None:
        """Block until no save is in flight; raise CheckpointError if the last one failed."""
        self._idle.wait()
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None and _keeps_its_type(failure):
            raise failure
        if failure is not None:
            raise CheckpointError(
                f"the background checkpoint save failed: {type(failure).__name__}: {failure}"
            ) from failure

    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and refuse further saves."""
        self._closed = True
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=False)  # idle now; its thread ends by itself
                self._writer = None

    def _writer_thread(self) -> ThreadPoolExecutor | None:
        """The writer (its thread started); None while the interpreter exits, when no thread can start."""
        if self._writer is None:
            writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
            try:
                writer.submit(int)  # its thread starts now, on a job that ends at once, not behind a capture
            except RuntimeError:
                return None
            self._writer = writer
        return self._writer

    def _run(self, job: _Job) -> None:
        try:
            job.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread by wait()
            with self._lock:
                self._failure = exc
        finally:
            self._idle.set()


def _keeps_its_type(exc: BaseException) -> bool:
    """Whether a save's failure reaches the script as it is: ours, or a full disk (whose errno must survive)."""
    return isinstance(exc, CheckpointError) or isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class _Job:
    def __init__(self, persist: Persist, snapshot: Snapshot, on_commit: OnCommit | None) -> None:
        self.persist = persist
        self.snapshot: Snapshot | None = snapshot
        self.on_commit = on_commit

    def run(self) -> None:
        try:
            info = self.persist(self.snapshot)
        finally:
            # The buffers belong to the next capture now; nothing may keep reading them.
            self.snapshot = None
        if info is not None and self.on_commit is not None:
            try:
                self.on_commit(info)
            except Exception as exc:
                raise CheckpointError(
                    f"checkpoint {info.name} is committed, but its on_commit callback failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

