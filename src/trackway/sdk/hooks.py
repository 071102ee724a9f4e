"""Process hooks the SDK installs: preemption notices (SIGTERM/SIGUSR1) and the uncaught-exception note.

A preemption notice only sets a flag: the script decides when to checkpoint and call
`run.exit_preempted()`. An uncaught exception is written down as the attempt's own termination
note before Python prints the traceback, so classification does not have to guess from logs.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from trackway.sdk.exceptions import BadData, NonFiniteLoss
from trackway.taxonomy import TerminationReason

NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
START_UP_ERRORS = ("ModuleNotFoundError", "ImportError", "FileNotFoundError", "NotADirectoryError", "PermissionError")


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
    if not made_progress and names & set(START_UP_ERRORS):
        return TerminationReason.CONFIG_ERROR
    if isinstance(exc, KeyboardInterrupt):
        return TerminationReason.USER_CANCELLED
    return TerminationReason.CODE_ERROR


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
