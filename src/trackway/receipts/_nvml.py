"""A guarded NVML session: the NVIDIA library when a driver is present, None otherwise."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType

# Where Linux tells the loaded NVIDIA driver's version without NVML (the same string NVML reports).
DRIVER_VERSION_FILE = Path("/sys/module/nvidia/version")


def kernel_lists_drivers() -> bool:
    """Whether DRIVER_VERSION_FILE exists exactly when a driver is loaded (Linux; WSL's GPUs come another way)."""
    return sys.platform == "linux" and os.path.isdir("/sys/module") and not os.path.exists("/dev/dxg")


def driver_loaded() -> bool:
    """False only where the kernel says no NVIDIA driver is loaded: NVML could not start there."""
    return not kernel_lists_drivers() or DRIVER_VERSION_FILE.exists()


def _init() -> ModuleType | None:
    # Most of our users' laptops and CI machines have no NVIDIA driver: importing pynvml there only
    # to be told so cost every submit and supervisor start about 10 ms.
    if not driver_loaded():
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


@contextmanager
def nvml_session() -> Iterator[ModuleType | None]:
    """Yield the initialised `pynvml` module, or None where there is no NVIDIA driver; shuts NVML down after."""
    lib = _init()
    try:
        yield lib
    finally:
        if lib is not None:
            with suppress(lib.NVMLError):
                lib.nvmlShutdown()


def text(value: str | bytes) -> str:
    """NVML strings arrive as bytes from older nvidia-ml-py releases and as str from newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
