"""The attempt's real GPU memory peak, per device, as PyTorch's caching allocator counts it.

Recorded as `cuda_memory` events (on heartbeats when it grew, and when the attempt ends, an OOM
included) so that `trackway preflight --calibrate RUN` can compare it with the estimate. Nothing
here imports torch: a script that never touched CUDA records nothing and pays nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def cuda_peaks() -> list[dict[str, Any]] | None:
    """`max_memory_allocated`/`max_memory_reserved` of each device this process used; None without CUDA in use."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        devices = []
        for index in range(cuda.device_count()):
            reserved = int(cuda.max_memory_reserved(index))
            if not reserved:
                continue  # a device this process never allocated on
            properties = cuda.get_device_properties(index)
            devices.append({
                "device": index, "name": properties.name, "total_bytes": int(properties.total_memory),
                "max_allocated_bytes": int(cuda.max_memory_allocated(index)), "max_reserved_bytes": reserved,
            })
        return devices or None
    except Exception:  # noqa: BLE001 - a broken CUDA state (after a device error) must not end the attempt here
        return None


class PeakRecorder:
    """Writes a `cuda_memory` event when a device's peak is new; `read` is `cuda_peaks` but for tests."""

    def __init__(self, event: Callable[..., None], read: Callable[[], list[dict[str, Any]] | None] = cuda_peaks):
        self._event = event
        self._read = read
        self._last: list[dict[str, Any]] | None = None

    def __call__(self) -> None:
        peaks = self._read()
        if peaks and peaks != self._last:
            self._last = peaks
            # Not synced here: the writer's close() syncs the events file after its last heartbeat.
            self._event("cuda_memory", fsync=False, devices=peaks)
