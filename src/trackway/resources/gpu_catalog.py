"""GPU memory as the driver reports it, for the GPUs our users rent and own, and a resource's capacity from it.

A card sold as "80 GB" shows 81,920 MiB (A100) or 81,559 MiB (H100) in nvidia-smi: the preflight
compares its estimate with the second kind of number, in GiB (docs/memory-preflight.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from trackway.settings.resources import Resource

# Name → GiB usable (nvidia-smi's total MiB / 1024), in the order `trackway preflight` lists them.
KNOWN_GPUS: dict[str, float] = {
    "A100-80": 80.0,
    "H100": 79.65,
    "H200": 140.40,
    "B200": 179.06,
    "RTX 5090": 31.84,
    "RTX 6000 Ada": 47.99,
}
_ALIASES = {
    "a100": "A100-80", "a10080": "A100-80", "a10080gb": "A100-80", "a100sxm480gb": "A100-80",
    "a100pcie80gb": "A100-80", "h100": "H100", "h10080gb": "H100", "h100sxm": "H100", "h100pcie": "H100",
    "h10080gbhbm3": "H100", "h100sxm580gb": "H100", "h200": "H200", "h200141gb": "H200", "h200sxm": "H200",
    "b200": "B200", "rtx5090": "RTX 5090", "geforcertx5090": "RTX 5090", "5090": "RTX 5090",
    "rtx6000ada": "RTX 6000 Ada", "rtx6000adageneration": "RTX 6000 Ada", "6000ada": "RTX 6000 Ada",
}


@dataclass(frozen=True)
class Target:
    """A GPU a run may get, for the preflight to judge: a declared resource's, or one from the catalog."""

    name: str
    capacity_gib: float
    source: str
    cost_per_gpu_hour: float = 0.0
    resource: bool = False


def targets_for(resources: Iterable[Resource], gpu_names: Iterable[str] = ()) -> list[Target]:
    """The GPUs named (`--gpu`), else the resources whose GPU memory is known, else every GPU in the catalog."""
    named = [resolve_gpu(name) for name in gpu_names]
    if named:
        return [Target(name, KNOWN_GPUS[name], "catalog") for name in dict.fromkeys(named)]
    return resource_targets(resources) or [Target(name, gib, "catalog") for name, gib in KNOWN_GPUS.items()]


def resource_targets(resources: Iterable[Resource]) -> list[Target]:
    """The resources whose GPU memory is known (the others cannot be judged), as targets."""
    targets = []
    for resource in resources:
        capacity = resource_capacity_gib(resource)
        if capacity is not None:
            targets.append(Target(resource.name, capacity[0], capacity[1], resource.cost_per_gpu_hour, resource=True))
    return targets


def known_gpu(name: str | None) -> str | None:
    """The catalog's name for a GPU as people (or nvidia-smi) write it: `NVIDIA H100 80GB HBM3` → `H100`."""
    if not name:
        return None
    key = re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia")
    return _ALIASES.get(key)


def resolve_gpu(name: str, field: str = "--gpu") -> str:
    """A GPU named on the command line, as the catalog names it; InputError naming the known ones otherwise."""
    from trackway.errors import InputError

    found = known_gpu(name)
    if found is None:
        raise InputError(f"{field} {name!r}: expected one of {', '.join(KNOWN_GPUS)}")
    return found


def resource_capacity_gib(resource: Resource) -> tuple[float, str] | None:
    """A resource's usable GiB per GPU and where that number comes from; None when neither is declared.

    A GPU the catalog knows gives the driver's figure; otherwise `gpu_memory_gb` is taken as what
    the driver shows.
    """
    found = known_gpu(resource.gpu)
    if found is not None:
        return KNOWN_GPUS[found], f"{found}: {KNOWN_GPUS[found]:g} GiB as the driver reports it"
    if resource.gpu_memory_gb is not None:
        return float(resource.gpu_memory_gb), f"gpu_memory_gb = {resource.gpu_memory_gb:g}"
    return None
