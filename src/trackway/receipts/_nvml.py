"""A guarded NVML session: the NVIDIA library when a driver is present, None otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import ModuleType


def _init() -> ModuleType | None:
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
