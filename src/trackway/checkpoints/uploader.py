"""Committed checkpoints copied to the remote store on one background thread, in commit order.

    writer thread (or the caller)             uploader thread
    commit step 10 ─ on_commit ─ submit ────► upload step 10 → marker → on_upload(remote, seconds)
    commit step 20 ─ on_commit ─ submit ─┐    (queued behind it)
    (training goes on)                   └──► upload step 20 → ...

`submit()` only appends to a queue, so training never waits on the network. `wait()` returns
once the queue is empty, or gives up with a warning on stderr once nothing has moved (bytes, a
finished checkpoint) for `stall_s` seconds: a slow store that keeps moving is waited for, an
unreachable one costs `stall_s`. The checkpoint stays committed locally either way.

A store failure is retried (`attempts`, doubling backoff), then reported on stderr and dropped;
a local checkpoint gone or damaged, or a step another writer committed with other content
(UploadLost), is reported at once and never retried. The thread is a daemon: an upload cut off
by the end of the process leaves only debris under a token no marker names.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from trackway.checkpoints.layout import CheckpointError, CheckpointInfo
from trackway.checkpoints.object_store import RemoteCheckpoint, RemoteCheckpointStore, RemoteStoreError, UploadLost

OnUpload = Callable[[RemoteCheckpoint, float], None]


def warn(message: str) -> None:
    """Say it on stderr, where the attempt's log keeps it."""
    print(f"trackway: {message}", file=sys.stderr, flush=True)


class Uploader:
    """Uploads committed local checkpoints to `store` one at a time, off the caller's thread."""

    def __init__(
        self,
        store: RemoteCheckpointStore,
        *,
        on_upload: OnUpload | None = None,
        stall_s: float = 60.0,
        attempts: int = 3,
        backoff_s: float = 2.0,
        warn: Callable[[str], None] = warn,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not stall_s > 0:
            raise CheckpointError(f"upload stall_s must be a positive number of seconds, got {stall_s!r}")
        self.store = store
        self.on_upload = on_upload
        self.stall_s = stall_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._warn = warn
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[CheckpointInfo] = deque()
        self._current: CheckpointInfo | None = None
        self._moved_at = clock()
        self._last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        self._stop = threading.Event()  # cuts a retry's backoff short at close()
        self.uploaded: list[RemoteCheckpoint] = []
        self.failed: list[str] = []  # one line per checkpoint given up on

    def submit(self, info: CheckpointInfo) -> None:
        """Queue a committed local checkpoint for upload; returns at once."""
        with self._cond:
            if os.getpid() != self._pid:  # a forked child: the parent's thread and queue are not here
                self._queue, self._current, self._thread, self._pid = deque(), None, None, os.getpid()
            if self._closed:
                raise CheckpointError(f"the uploader to {self.store.url} is closed; {info.name} was not queued")
            self._queue.append(info)
            self._moved_at = self._clock()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trackway-checkpoint-uploader", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @property
    def pending(self) -> list[CheckpointInfo]:
        """The checkpoints not uploaded yet: the one going up, then the queue."""
        with self._cond:
            return [*([self._current] if self._current is not None else []), *self._queue]

    def wait(self, stall_s: float | None = None) -> bool:
        """Block until every queued upload finished; False (warned on stderr) once nothing moved for `stall_s`."""
        stall = self.stall_s if stall_s is None else stall_s
        with self._cond:
            while self._queue or self._current is not None:
                if os.getpid() != self._pid:
                    return True  # a forked child waits for nothing of its parent's
                idle = self._clock() - self._moved_at
                if idle >= stall:
                    names = ", ".join(i.name for i in [*([self._current] if self._current else []), *self._queue])
                    cause = f" (last error: {self._last_error})" if self._last_error else ""
                    self._warn(
                        f"checkpoint upload to {self.store.url} made no progress for {stall:g} s{cause}; "
                        f"not uploaded: {names} (committed locally only, they will not outlive this machine)"
                    )
                    return False
                self._cond.wait(min(stall - idle, 1.0))
        return True

    def close(self, stall_s: float | None = None) -> bool:
        """Wait as `wait()` does, then take no more; an upload still going on ends with the process."""
        try:
            return self.wait(stall_s)
        finally:
            with self._cond:
                self._closed = True
                self._stop.set()
                self._cond.notify_all()

    def _moved(self) -> None:
        self._moved_at = self._clock()  # a float store: no lock, it is called on fsspec's IO thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    self._thread = None
                    return
                self._current = self._queue.popleft()
            try:
                self._upload(self._current)
            finally:
                with self._cond:
                    self._current = None
                    self._moved_at = self._clock()
                    self._cond.notify_all()

    def _upload(self, info: CheckpointInfo) -> None:
        for attempt in range(1, self.attempts + 1):
            started = self._clock()
            try:
                remote = self.store.upload(info, progress=self._moved)
            except UploadLost as exc:
                self._give_up(info, str(exc))
                return
            except RemoteStoreError as exc:
                self._last_error = str(exc)
                if attempt == self.attempts or self._closed:
                    self._give_up(info, f"{exc} (after {attempt} attempt{'s' if attempt > 1 else ''})")
                    return
                self._stop.wait(self.backoff_s * 2 ** (attempt - 1))
                continue
            except Exception as exc:  # noqa: BLE001 - the local checkpoint itself: retrying cannot help
                self._give_up(info, f"{type(exc).__name__}: {exc}")
                return
            self._last_error = None
            self.uploaded.append(remote)
            if self.on_upload is not None:
                try:
                    self.on_upload(remote, self._clock() - started)
                except Exception as exc:  # noqa: BLE001 - the upload is done; only its report failed
                    self._warn(f"{remote.url} is uploaded, but its on_upload callback failed: "
                               f"{type(exc).__name__}: {exc}")
            return

    def _give_up(self, info: CheckpointInfo, why: str) -> None:
        self.failed.append(f"{info.name}: {why}")
        self._warn(f"checkpoint {info.name} was not uploaded to {self.store.url}: {why}; "
                   f"it stays committed locally at {info.path}")
