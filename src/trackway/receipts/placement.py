"""Placement facts for a receipt: the host name and the NVIDIA GPUs it can see."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from types import ModuleType

from trackway.receipts._nvml import nvml_session, text


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML reports it at the moment of the call."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: int


def gpu_inventory() -> list[GpuInfo]:
    """Every NVIDIA GPU visible to this process; [] where there is no driver or NVML fails. Never raises."""
    with nvml_session() as lib:
        if lib is None:
            return []
        try:
            return [_gpu(lib, i) for i in range(lib.nvmlDeviceGetCount())]
        except lib.NVMLError:
            return []


def gpu_utilization(gpu_ids: str) -> list[int]:
    """Current utilization (%) of the GPUs in a comma-separated id list; [] where NVML cannot say. Never raises."""
    with nvml_session() as lib:
        if lib is None:
            return []
        try:
            return [
                int(lib.nvmlDeviceGetUtilizationRates(lib.nvmlDeviceGetHandleByIndex(int(i))).gpu)
                for i in gpu_ids.split(",")
                if i.strip()
            ]
        except (lib.NVMLError, ValueError):
            return []


def host_name() -> str:
    """This machine's host name."""
    return socket.gethostname()


def _gpu(lib: ModuleType, index: int) -> GpuInfo:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    memory = lib.nvmlDeviceGetMemoryInfo(handle)
    return GpuInfo(
        index=index,
        uuid=text(lib.nvmlDeviceGetUUID(handle)),
        name=text(lib.nvmlDeviceGetName(handle)),
        memory_total_bytes=int(memory.total),
        memory_used_bytes=int(memory.used),
        processes=_process_count(lib, handle),
    )


def _process_count(lib: ModuleType, handle: object) -> int:
    # Some devices (MIG parents, vGPUs) refuse process queries; losing the whole
    # inventory over a count would hide GPUs that are really there.
    try:
        return len(lib.nvmlDeviceGetComputeRunningProcesses(handle))
    except lib.NVMLError:
        return 0
