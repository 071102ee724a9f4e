"""The spool writer: `run.log` appends to an in-memory queue; one background thread writes it to the spool.

The training thread pays for one `deque.append` per call. Every `flush_interval_s` the writer
drains the queue in slices of `SLICE_ROWS` rows: each slice becomes one columnar line per set of
keys, built by C loops (`trackway.spool.metric_batches`), and is appended before the next slice is
taken. A slice holds the GIL for about a millisecond, and nothing holds it for a whole flush, so a
log call never waits behind the writer for longer than that (or the interpreter's switch interval).
Then the writer refreshes its rank's heartbeat file (every rank has one: `trackway.spool.heartbeat_file`),
which says the step this rank last logged and when it moved, so a rank that stopped stepping while its
heartbeat thread beats on can be named. Nothing here touches the ledger, so a locked, slow or
absent ledger cannot slow training.

A spool that cannot be written (a full disk) loses nothing silently. The lines it refused stay
in memory and are retried on every flush; the first failure prints one stderr line (the path,
the error, the free space) and queues a `spool_write_failed` event {file, error, free_bytes,
points_pending}. When the spool takes writes again, a second `spool_write_failed` event with
`recovered: true` says how many points were delayed. Past `max_pending_bytes` held, and at
`close()` if the spool never came back, what is held goes to the fallback directory that
`trackway.spool` describes (and the ingester reads), with an event saying so; what cannot be
written there either is counted in `points_lost`, told on stderr, and left for `Run` to report.
The bound is $TRACKWAY_SPOOL_PENDING_BYTES (default 64 MiB).
"""

from __future__ import annotations

import errno
import json
import math
import operator
import os
import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from trackway.spool import (
    EVENTS_FILE,
    MetricBatch,
    append_lines,
    end_torn_line,
    heartbeat_file,
    make_fallback_dir,
    metric_batches,
    metrics_file,
    write_json_atomic,
)

FLUSH_INTERVAL_S = 0.25
# Rows encoded and appended at a time: about a millisecond of the GIL per slice.
SLICE_ROWS = 2048
HEARTBEAT_INTERVAL_S = 5.0
# Metric keys whose non-finite values end the attempt as nan_loss: `loss`, `*_loss`, `*/loss` (and
# Lightning's `*_loss_step` / `*_loss_epoch`), and `grad_norm`. Matched against the whole key.
DEFAULT_LOSS_KEYS = r"(?:.*[_/])?loss(?:_step|_epoch)?|grad_norm"


class LossKeys:
    """Which metric keys must stay finite: a regex over the whole key, case-insensitive, decided once per key."""

    _MAX_KNOWN = 10_000  # a script that puts a counter in its key names must not grow this forever

    def __init__(self, pattern: str = DEFAULT_LOSS_KEYS):
        try:
            self.pattern = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"loss_keys: {pattern!r} is not a regular expression ({exc})") from None
        self._known: dict[str, bool] = {}

    def __call__(self, key: str) -> bool:
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= self._MAX_KNOWN:
                self._known.clear()
            known = self._known[key] = self.pattern.fullmatch(str(key)) is not None
        return known


def _env_bytes(name: str, default: int) -> int:
    """A positive byte count from the environment; `default` when unset or not one."""
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


# How much an unwritable spool may hold in memory before it goes to the fallback directory.
MAX_PENDING_BYTES = _env_bytes("TRACKWAY_SPOOL_PENDING_BYTES", 64 << 20)
# Held lines are retried in appends of at most this size, so a disk with a little room takes some.
_CHUNK_BYTES = 1 << 20


class _Backlog:
    """Owns the lines one spool file has not taken yet, oldest first, and how many points they hold."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: deque[tuple[bytes, int]] = deque()
        self.points = 0
        self.size = 0

    def add(self, items: list[tuple[bytes, int]]) -> None:
        for line, points in items:
            self.lines.append((line, points))
            self.points += points
            self.size += len(line)

    def head(self, limit: int) -> list[bytes]:
        """The oldest lines, up to `limit` bytes (at least one line)."""
        chunk, size = [], 0
        for line, _ in list(self.lines):  # a copy: a signal handler may append meanwhile
            if chunk and size + len(line) > limit:
                break
            chunk.append(line)
            size += len(line)
        return chunk

    def pop(self, count: int) -> int:
        """Forget the `count` oldest lines (written or dropped); the points they held."""
        points = 0
        for _ in range(count):
            line, held = self.lines.popleft()
            points += held
            self.size -= len(line)
        self.points -= points
        return points

    def all(self) -> list[bytes]:
        return [line for line, _ in self.lines]


@dataclass
class _Outage:
    """What the writer knows about the spool refusing writes, from the first failure until it takes them again."""

    file: str
    error: str
    free_bytes: int | None
    started: float
    points_held: int  # points that waited in memory during the outage
    points_spilled: int = 0
    points_lost: int = 0
    events_lost: int = 0
    fallback: str | None = None
    wrote: bool = False  # whether an append to the spool succeeded since it began


class SpoolWriter:
    """Owns the attempt's spool files for one process (one rank)."""

    def __init__(
        self,
        spool_dir: Path,
        rank: int = 0,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        loss_keys: LossKeys | None = None,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ):
        self.spool_dir = spool_dir
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.metrics_path = metrics_file(spool_dir, rank)
        self.events_path = spool_dir / EVENTS_FILE
        self.heartbeat_path = heartbeat_file(spool_dir, rank)
        self.flush_interval_s = flush_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_pending_bytes = max_pending_bytes
        self.queue: deque[tuple[int, float, dict[str, Any]]] = deque()
        self.last_step: int | None = None
        self.last_progress_t: float | None = None  # wall time of the newest logged step: stall detection reads it
        self.loss_keys = loss_keys
        # (key, value, step) of the first non-finite value of a `loss_keys` metric that was not a
        # plain float (those the training thread checks itself); `Run.log` raises it on its next call.
        self.non_finite: tuple[str, float, int] | None = None
        self.on_non_finite: Callable[[], None] | None = None  # told once `non_finite` is set, from either thread
        self.points_lost = 0  # metric points neither the spool nor a fallback took: `Run` must say so
        self.fallback_dir: Path | None = None
        # One re-entrant lock for every file and backlog: an event may come from a signal handler
        # that interrupted this same thread inside a write. That nested call only queues its line
        # (`_busy`); the write it interrupted, or the next flush, writes it.
        self._lock = threading.RLock()
        self._busy = False
        # Held by whoever drains the queue (this writer's thread, or `close()`), so that slices are
        # written in the order they were logged; events do not wait for it.
        self._flushing = threading.Lock()
        self._flusher: int | None = None
        end_torn_line(self.metrics_path)  # this rank's file: only a process of this rank that died writes it
        self._metrics = _Backlog(self.metrics_path)
        self._events = _Backlog(self.events_path)
        self._outage: _Outage | None = None
        self._seq = self._next_event_seq()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._last_heartbeat = 0.0
        # Called after each heartbeat (this writer's thread, and close()): the run's GPU peak, sdk/cuda_memory.py.
        self.on_heartbeat: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._loop, name="trackway-spool", daemon=True)
        self._thread.start()

    def _next_event_seq(self) -> int:
        # A process that joins an attempt after another (a restarted rank) continues the numbering.
        try:
            with open(self.events_path, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    @property
    def points_pending(self) -> int:
        """Metric points held in memory because the spool refused them."""
        return self._metrics.points

    def event(self, kind: str, fsync: bool = True, **payload: Any) -> None:
        """Append one event line now (events are rare and matter: they are written synchronously)."""
        with self._lock:
            self._enqueue_event(kind, payload)
            if self._busy:
                return
            self._busy = True
            try:
                self._write(self._events, fsync=fsync)
            finally:
                self._busy = False

    def _enqueue_event(self, kind: str, payload: dict[str, Any]) -> None:
        record = {"seq": self._seq, "t": time.time(), "kind": kind, "rank": self.rank, **payload}
        self._seq += 1
        self._events.add([(json.dumps(record, default=str).encode() + b"\n", 0)])

    def flush(self) -> None:
        """Write everything queued so far, and retry what the spool refused before (callable from any thread)."""
        me = threading.get_ident()
        if self._flusher == me:
            return  # a signal handler inside this thread's own flush: that flush writes everything
        with self._flushing:
            self._flusher = me
            try:
                self._drain()
                with self._lock:
                    if self._busy:
                        return
                    self._busy = True
                    try:
                        if self._write(self._metrics) and self._write(self._events):
                            self._end_outage()
                    finally:
                        self._busy = False
            finally:
                self._flusher = None

    def _drain(self) -> None:
        """Encode and append the queued rows, a slice at a time; once the spool refuses one, hold the rest."""
        queue, pop = self.queue, self.queue.popleft
        in_thread = threading.current_thread() is self._thread
        refused = False
        while queue:
            rows = list(map(operator.call, repeat(pop, min(len(queue), SLICE_ROWS))))
            batches = metric_batches(rows)
            self._progress(rows[-1])
            del rows  # freed here, a slice at a time, rather than all at the end
            if self.non_finite is None and self.loss_keys is not None:
                self._check_finite(batches)
            lines = [(batch.line(), batch.points) for batch in batches]
            with self._lock:
                if self._outage is not None:
                    self._outage.points_held += sum(points for _, points in lines)
                self._metrics.add(lines)
                if refused:
                    self._bound()
                elif not self._busy:
                    self._busy = True
                    try:
                        refused = not self._write(self._metrics)
                    finally:
                        self._busy = False
            if in_thread:
                time.sleep(0)  # let a waiting training thread have the GIL between slices

    def progress(self, step: Any, t: float) -> None:
        """A step this rank reached without logging it (a rank that does not log): the heartbeat says it all the same."""
        self._progress((step, t, None))

    def _progress(self, row: tuple[Any, float, Any]) -> None:
        step = row[0]
        try:
            step = operator.index(step)
        except TypeError:
            pass
        if self.last_step is None or step != self.last_step:
            self.last_progress_t = row[1]
        self.last_step = step

    def _write(self, backlog: _Backlog, fsync: bool = False) -> bool:
        """Append what `backlog` holds to its spool file; False (the rest still held) when the spool refuses."""
        while backlog.lines:
            chunk = backlog.head(_CHUNK_BYTES)
            try:
                append_lines(backlog.path, chunk, fsync=fsync)
            except OSError as exc:
                self._failed(backlog, exc)
                return False
            backlog.pop(len(chunk))
            if self._outage is not None:
                self._outage.wrote = True
        return True

    def _failed(self, backlog: _Backlog, exc: OSError) -> None:
        """Start (or continue) an outage: say it once, keep the lines, and bound what memory holds."""
        if self._outage is None:
            free = _free_bytes(self.spool_dir)
            self._outage = _Outage(
                file=str(backlog.path), error=_error_text(exc), free_bytes=free, started=time.time(),
                points_held=self._metrics.points,
            )
            _tell(
                f"trackway: cannot write the spool file {backlog.path}: {self._outage.error} "
                f"({_bytes_text(free)} free); holding {self._metrics.points} points in memory and retrying"
            )
            self._enqueue_event("spool_write_failed", {
                "file": backlog.path.name, "error": self._outage.error, "free_bytes": free,
                "points_pending": self._metrics.points,
            })
        self._bound()

    def _bound(self) -> None:
        """Past `max_pending_bytes` held, what is held goes to the fallback directory."""
        if self._metrics.size + self._events.size > self.max_pending_bytes:
            self._spill(bounded=True)

    def _spill(self, bounded: bool) -> None:
        """Move what is held to the fallback directory; when that fails too and `bounded`, drop the oldest."""
        outage = self._outage
        try:
            if self.fallback_dir is None:
                self.fallback_dir = make_fallback_dir(self.spool_dir)
            for backlog in (self._metrics, self._events):
                lines = backlog.all()
                if lines:
                    append_lines(self.fallback_dir / backlog.path.name, lines, fsync=True)
                    outage.points_spilled += backlog.pop(len(lines))
        except OSError as exc:
            if bounded:
                self._drop_oldest(exc)
            return
        if outage.fallback is None:
            outage.fallback = str(self.fallback_dir)
            _tell(f"trackway: the spool at {self.spool_dir} still refuses writes; "
                  f"held lines now go to {self.fallback_dir}")

    def _drop_oldest(self, exc: OSError) -> None:
        """Keep memory bounded when nothing can be written: forget the oldest lines, counted and told."""
        outage = self._outage
        first = outage.points_lost == 0 and outage.events_lost == 0
        room = self.max_pending_bytes - self._events.size
        while self._metrics.lines and self._metrics.size > room:
            dropped = self._metrics.pop(1)
            outage.points_lost += dropped
            self.points_lost += dropped
        while self._events.size > self.max_pending_bytes:
            self._events.pop(1)
            outage.events_lost += 1
        if first:
            _tell(
                f"trackway: metric points are being lost: neither the spool at {self.spool_dir} nor a fallback "
                f"can be written ({_error_text(exc)}) and more than {self.max_pending_bytes} bytes are held"
            )

    def _end_outage(self) -> None:
        """The spool takes writes again and holds nothing back: say so, with what the outage cost."""
        outage = self._outage
        if outage is None or not outage.wrote:
            return
        self._outage = None
        free = _free_bytes(self.spool_dir)
        _tell(
            f"trackway: the spool at {self.spool_dir} is writable again ({_bytes_text(free)} free); "
            f"{outage.points_held - outage.points_spilled - outage.points_lost} delayed points written"
            + _cost_text(outage)
        )
        self._enqueue_event("spool_write_failed", {**_outage_payload(outage, free), "recovered": True})
        self._write(self._events, fsync=True)

    def _check_finite(self, batches: list[MetricBatch]) -> None:
        """Find a non-finite value under a loss key, floats and tensors alike: `Run` raises it (see `Run.log`)."""
        is_loss = self.loss_keys
        for batch in batches:
            for key, column in zip(batch.keys, batch.columns):
                if is_loss(key) and not all(map(math.isfinite, column)):
                    at = next(i for i, value in enumerate(column) if not math.isfinite(value))
                    self.non_finite = (key, column[at], batch.steps[at])
                    if self.on_non_finite is not None:
                        self.on_non_finite()
                    return

    def heartbeat(self, closed: bool = False) -> None:
        self._last_heartbeat = time.monotonic()
        beat = {
            "t": time.time(),
            "rank": self.rank,
            "step": self.last_step,
            "progress_t": self.last_progress_t,
            "pid": os.getpid(),
            "rss_bytes": _rss_bytes(),
        }
        if closed:
            beat["closed"] = True  # this rank is done: its silence from now on is not a hang
        try:
            write_json_atomic(self.heartbeat_path, beat, fsync=False)
        except OSError:
            pass  # a full disk is told by the data writes; a missed heartbeat costs nothing held
        if self.on_heartbeat is not None:
            self.on_heartbeat()

    def _loop(self) -> None:
        told = False
        while not self._stopped.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self.flush()
                if time.monotonic() - self._last_heartbeat >= self.heartbeat_interval_s:
                    self.heartbeat()
            except Exception as exc:  # noqa: BLE001 - this thread dying would stop all logging, silently
                if not told:
                    _tell(f"trackway: the spool writer hit {type(exc).__name__}: {exc}; it keeps going")
                    told = True

    def close(self) -> None:
        """Stop the thread and write what is left, durably; what the spool still refuses goes to the fallback."""
        self._stopped.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self.flush()
        with self._lock:
            if self._outage is not None and not self._busy:
                self._busy = True
                try:
                    self._give_up()
                finally:
                    self._busy = False
        self.heartbeat(closed=True)
        for path in (self.metrics_path, self.events_path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _give_up(self) -> None:
        """The process ends with the spool still refusing writes: the fallback gets the rest, or it is lost, loudly."""
        outage = self._outage
        if not self._metrics.lines and not self._events.lines:
            return
        points = self._metrics.points
        payload = {**_outage_payload(outage, _free_bytes(self.spool_dir)), "points_pending": points, "recovered": False}
        try:
            if self.fallback_dir is None:
                self.fallback_dir = make_fallback_dir(self.spool_dir)
            payload.update(fallback=str(self.fallback_dir), points_in_fallback=outage.points_spilled + points)
        except OSError:
            pass  # the event is lost with the rest; stderr says so below
        self._enqueue_event("spool_write_failed", payload)
        self._spill(bounded=False)
        if not self._metrics.lines and not self._events.lines:
            _tell(f"trackway: the spool at {self.spool_dir} could not be written; {points} points and the "
                  f"attempt's last events are in {self.fallback_dir}, where the ingester reads them")
            return
        self.points_lost += self._metrics.points
        _tell(
            f"trackway: {self.points_lost} metric points were lost: the spool at "
            f"{self.spool_dir} ({outage.error}) and every fallback directory refused them"
        )
        self._metrics.pop(len(self._metrics.lines))
        self._events.pop(len(self._events.lines))


def _outage_payload(outage: _Outage, free: int | None) -> dict[str, Any]:
    payload = {
        "file": Path(outage.file).name, "error": outage.error, "free_bytes": free, "points_pending": outage.points_held,
        "seconds": round(time.time() - outage.started, 3),
    }
    if outage.fallback:
        payload.update(fallback=outage.fallback, points_in_fallback=outage.points_spilled)
    if outage.points_lost or outage.events_lost:
        payload.update(points_lost=outage.points_lost, events_lost=outage.events_lost)
    return payload


def _cost_text(outage: _Outage) -> str:
    text = f", {outage.points_spilled} more in {outage.fallback}" if outage.fallback else ""
    return text + (f"; {outage.points_lost} points were lost" if outage.points_lost else "")


def _error_text(exc: OSError) -> str:
    """`ENOSPC: No space left on device (disk full)`: the name a person searches for, and what it means."""
    name = errno.errorcode.get(exc.errno or 0)
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += " (disk full)"
    return f"{name}: {reason}" if name else reason


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _bytes_text(count: int | None) -> str:
    return "unknown space" if count is None else f"{count} bytes"


def _tell(message: str) -> None:
    """One line on stderr, which may itself be a file on the full disk."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _rss_bytes() -> int | None:
    """This process's resident memory, for the supervisor's memory-growth watcher (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
