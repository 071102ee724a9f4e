"""The numbers in a CUDA out-of-memory message: what was asked, what the GPU had, what PyTorch held.

PyTorch ≥ 2.1 says "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which
1.06 GiB is free. ... this process has 78.07 GiB memory in use. Of the allocated memory 75.12 GiB
is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated." Older versions say
"Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated;
3.44 MiB free; 14.81 GiB reserved in total by PyTorch)". Either becomes `OomNumbers`, in bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
_ASKED = re.compile(rf"Tried to allocate {_SIZE}")
_GPU = re.compile(r"GPU (\d+)")
_CAPACITY = re.compile(rf"total capa(?:city|cty) of {_SIZE}|{_SIZE} total capacity")
_FREE = re.compile(rf"of which {_SIZE} is free|{_SIZE} free")
_ALLOCATED = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch|{_SIZE} already allocated")
_SLACK = re.compile(rf"and {_SIZE} is reserved by PyTorch but unallocated")
_RESERVED = re.compile(rf"{_SIZE} reserved in total by PyTorch")
_PROCESS = re.compile(rf"this process has {_SIZE} memory in use")


@dataclass(frozen=True)
class OomNumbers:
    """What a CUDA OOM message says, in bytes (None where that version of the message does not say it)."""

    asked: int
    device: int | None = None
    capacity: int | None = None
    free: int | None = None
    allocated: int | None = None  # held by live tensors
    reserved: int | None = None  # held by PyTorch's caching allocator (allocated + cached slack)
    process: int | None = None  # this process, including the CUDA context and non-PyTorch memory

    def text(self) -> str:
        """`asked 2.00 GiB on GPU 0 (79.15 GiB): 75.12 GiB allocated, 77.43 GiB reserved, 1.06 GiB free`."""
        where = f" on GPU {self.device}" if self.device is not None else ""
        where += f" ({_gib(self.capacity)})" if self.capacity is not None else ""
        held = [f"{_gib(value)} {name}" for name, value in (("allocated", self.allocated), ("reserved", self.reserved),
                                                             ("in use by the process", self.process),
                                                             ("free", self.free)) if value is not None]
        return f"asked {_gib(self.asked)}{where}" + (f": {', '.join(held)}" if held else "")

    def to_json(self) -> dict[str, int | None]:
        return {"asked_bytes": self.asked, "device": self.device, "capacity_bytes": self.capacity,
                "free_bytes": self.free, "allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "process_bytes": self.process}


def parse_oom(lines: Iterable[str]) -> OomNumbers | None:
    """The numbers of the last CUDA OOM message among `lines` (a message may span several), or None."""
    text = " ".join(line.strip() for line in lines)
    starts = [m.start() for m in _ASKED.finditer(text)]
    if not starts:
        return None
    message = text[starts[-1]:starts[-1] + 1000]
    allocated = _size(_ALLOCATED, message)
    slack = _size(_SLACK, message)
    reserved = _size(_RESERVED, message)
    if reserved is None and allocated is not None and slack is not None:
        reserved = allocated + slack
    gpu = _GPU.search(message)
    return OomNumbers(
        asked=_size(_ASKED, message) or 0,
        device=int(gpu.group(1)) if gpu else None,
        capacity=_size(_CAPACITY, message),
        free=_size(_FREE, message),
        allocated=allocated,
        reserved=reserved,
        process=_size(_PROCESS, message),
    )


def _size(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    if match is None:
        return None
    groups = [g for g in match.groups() if g is not None]
    return round(float(groups[0]) * _UNITS[groups[1]])


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"
