"""Process hooks the SDK installs: preemption notices (SIGTERM/SIGUSR1) and the uncaught-exception note.

A preemption notice sets a flag: the script decides when to checkpoint and call
`run.exit_preempted()`. A script that never reads the flag is ended by `Run` itself (see
`Run.should_stop`), through `redeliver_notice`. An uncaught exception is written down as the
attempt's own termination note before Python prints the traceback, so classification does not
have to guess from logs.
"""

from __future__ import annotations

import errno
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from trackway.sdk.exceptions import BadData, NonFiniteLoss
from trackway.taxonomy import CONFIG_EXCEPTIONS, CONFIG_MESSAGE_PATTERN, TerminationReason

NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
START_UP_ERRORS = ("ModuleNotFoundError", "ImportError", "FileNotFoundError", "NotADirectoryError", "PermissionError")
# How a full disk reads when only the text of an exception survives (a library re-raised it as its own).
DISK_FULL_TEXTS = ("no space left on device", "[errno 28]", "enospc")
_CONFIG_MESSAGE = re.compile(CONFIG_MESSAGE_PATTERN, re.IGNORECASE)


def reason_for_exception(exc: BaseException, made_progress: bool) -> TerminationReason:
    """The termination reason an uncaught exception stands for (by class, without importing torch)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, NonFiniteLoss):
        return TerminationReason.NAN_LOSS
    if isinstance(exc, BadData) or "BadData" in names:
        return TerminationReason.BAD_DATA
    if "OutOfMemoryError" in names or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()):
        return TerminationReason.OOM
    if isinstance(exc, MemoryError):
        return TerminationReason.OOM
    if isinstance(exc, KeyboardInterrupt):
        return TerminationReason.USER_CANCELLED
    if "RemoteStoreError" in names:
        # The checkpoint store did not answer (checkpoints/object_store.py): the storage's fault, and a
        # retry later may find it back; resuming from scratch instead was refused on purpose.
        return TerminationReason.INFRA_TRANSIENT
    if disk_full_cause(exc) is not None:
        # Not the code's fault and not fixed by retrying at once: the policy stops and says where to free space.
        return TerminationReason.INFRA_TRANSIENT
    if not made_progress and names & set(START_UP_ERRORS):
        return TerminationReason.CONFIG_ERROR
    if not made_progress and names & set(CONFIG_EXCEPTIONS) and _CONFIG_MESSAGE.search(str(exc)):
        # `ValueError: Unknown config key: lrr` before the first step: the command is wrong, not the code.
        return TerminationReason.CONFIG_ERROR
    return TerminationReason.CODE_ERROR


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or while handling, outermost first (each once: chains can loop)."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__]


def disk_full_cause(exc: BaseException) -> BaseException | None:
    """The ENOSPC in `exc` or anywhere in its cause/context chain (a checkpoint save wrapping it), if any."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno == errno.ENOSPC:
            return link
    for link in _chain(exc):
        if any(text in str(link).lower() for text in DISK_FULL_TEXTS):
            return link
    return None


def disk_full_detail(exc: BaseException) -> str | None:
    """`disk full: PATH, N bytes free` for an exception caused by a full disk (None otherwise).

    The free space is measured now, on the file system that holds the path, so whoever reads
    the evidence knows how much to free; an OSError from `write()` names no file, and then
    neither can this.
    """
    cause = disk_full_cause(exc)
    if cause is None:
        return None
    path = _written_path(cause)
    if path is None:
        return f"disk full: path not reported ({type(cause).__name__}: {cause})"
    free = free_bytes(path)
    return f"disk full: {path}" + (f", {free} bytes free" if free is not None else "")


def describe_exception(exc: BaseException) -> str:
    """The message of the SDK's termination note for an uncaught exception."""
    base = f"{type(exc).__name__}: {exc}".strip()
    detail = disk_full_detail(exc)
    return f"{detail} ({base})" if detail else base


def _written_path(exc: BaseException) -> str | None:
    if not isinstance(exc, OSError):
        return None
    # For a copy or rename the destination (filename2) is what ran out of room.
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    return str(path) if path is not None else None


def free_bytes(path: str) -> int | None:
    """Bytes free to this user on the file system holding `path` (its nearest existing ancestor)."""
    for candidate in (Path(path), *Path(path).parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def install_notice_handlers(on_notice: Callable[[int], None]) -> dict[int, Any]:
    """Route SIGTERM/SIGUSR1 to `on_notice` (main thread only); return the handlers they replaced."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def handler(signum, frame):
        on_notice(signum)
        earlier = previous.get(signum)
        if callable(earlier):
            earlier(signum, frame)

    for signum in NOTICE_SIGNALS:
        previous[signum] = signal.signal(signum, handler)
    return previous


def redeliver_notice(signum: int) -> bool:
    """Send `signum` to the main thread, from another thread: its handler runs there, waking a sleep or a wait."""
    try:
        signal.pthread_kill(threading.main_thread().ident, signum)
    except (OSError, ValueError):
        return False
    return True


def restore_handlers(previous: dict[int, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def install_excepthook(on_exception: Callable[[BaseException], None]) -> Callable[[], None]:
    """Call `on_exception` for an uncaught exception in the main thread before the usual traceback."""
    original = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            on_exception(exc)
        finally:
            original(exc_type, exc, tb)

    sys.excepthook = hook

    def uninstall() -> None:
        if sys.excepthook is hook:
            sys.excepthook = original

    return uninstall
