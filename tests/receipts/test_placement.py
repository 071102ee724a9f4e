"""Placement: the host name, and a GPU inventory that is empty (not an error) where there is no NVIDIA driver."""

from __future__ import annotations

import socket

from trackway.receipts._nvml import nvml_session
from trackway.receipts.placement import GpuInfo, gpu_inventory, host_name


def test_host_name_is_this_machine() -> None:
    assert host_name() == socket.gethostname()


def test_gpu_inventory_matches_what_nvml_can_see() -> None:
    gpus = gpu_inventory()
    with nvml_session() as lib:
        expected = 0 if lib is None else lib.nvmlDeviceGetCount()
    assert len(gpus) == expected
    assert all(isinstance(g, GpuInfo) and g.memory_total_bytes > 0 for g in gpus)
    assert [g.index for g in gpus] == list(range(len(gpus)))


def test_gpu_inventory_is_repeatable() -> None:
    assert [g.uuid for g in gpu_inventory()] == [g.uuid for g in gpu_inventory()]
