"""Memory a restore is about to fill, faulted in by a thread of its own so the reader only copies (Linux).

A new process's tensors are new pages: the kernel zeroes and maps each 4 KiB page the first time
it is written, and in a restore's read that costs about as much as the copy itself (252 MB is
61,000 faults, 60-75 ms of CPU on our VMs). torch.load takes those faults one at a time on its
only thread. A restore hands them to this thread instead: it runs madvise(MADV_POPULATE_WRITE)
over the regions the reader will fill, last region first, while the reader copies into the first
ones and the hasher hashes them, so faulting, copying and hashing share the cores.

Populating never changes a byte that is already there, so neither thread waits for the other: a
page is either present (populating it does nothing) or faulted by whichever reaches it first.
Where the call is missing (another OS, a kernel before 5.14) nothing is populated ahead, and the
reader takes the faults as torch.load does. Huge pages (MADV_HUGEPAGE) would take fewer faults,
but where the kernel has no free 2 MiB page it compacts memory first: restores took 0.5-1 s
instead of 0.15 s on our VMs.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable, Sequence

MADV_POPULATE_WRITE = 23  # <linux/mman.h>, since Linux 5.14
STEP = 2 << 20  # one madvise call; the thread looks for `stop` between calls
PAGE = 4096


class Prefaulter:
    """A thread that populates `views` (writable memoryviews), the last first, until done or stopped."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        populate = _populate()
        self._spans = [_pages_within(view) for view in views if view.nbytes >= STEP] if populate else []
        self._stop = threading.Event()
        self._thread = None
        if self._spans:
            self._thread = threading.Thread(target=self._run, args=(populate,), name="restore prefault", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether populating has ended (every view done, or given up), waiting up to `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def stop(self) -> None:
        """Stop at the next step and wait: after this returns the thread touches none of the views."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, populate: Callable[[int, int], bool]) -> None:
        for start, end in reversed(self._spans):
            while end > start:
                if self._stop.is_set():
                    return
                begin = max(start, end - STEP)
                if not populate(begin, end - begin):
                    return  # unsupported here, or no memory to spare: the reader faults the rest itself
                end = begin


def _pages_within(view: memoryview) -> tuple[int, int]:
    """The whole pages inside a view's bytes: its neighbours' bytes on a shared page are never named."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    return -(-address // PAGE) * PAGE, (address + view.nbytes) // PAGE * PAGE


@functools.cache
def _populate() -> Callable[[int, int], bool] | None:
    """(address, nbytes) -> whether madvise(MADV_POPULATE_WRITE) succeeded; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return lambda address, nbytes: madvise(address, nbytes, MADV_POPULATE_WRITE) == 0
