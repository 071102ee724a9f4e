"""Choosing where a run goes, and saying why: filter by what it needs, rank what is left, pick a QoS tier.

    filter   the run's kind in `use_for`; enough GPUs; enough GPU memory; a QoS tier (or no tiers)
             covering the time limit, within its Slurm partition's MaxTime, and no more nodes than
             the partition's MaxNodes (its limits as availability read them); the resource answers
    rank     free GPUs now before a queue; then the order of [selection] for the run's kind
             (resources it does not list come after, as declared); then cost per GPU-hour
    tier     the smallest QoS tier whose max_hours covers the time limit (the longest without one)

A run `in_pieces` (`submit --time-limit 100 --in-pieces`) asks for its time in pieces: any resource
with a limit takes it, on its longest tier, and each attempt runs at most that tier's hours (and
the partition's MaxTime): the Selection's `piece_hours`; the retry policy resumes it from its
checkpoint until the run's time is spent (supervisor/policy.py).

The result keeps every candidate passed over with its reason, so that `show` and `explain` can
say "chose ailab/gpu-short: 2 of 8 B200 free, the 24 h tier covers 20 h; skipped local-5090:
32 GB < 80 GB asked; skipped della-h100: 0 of 16 GPUs free, 41 jobs pending". Nothing here runs
a command: availability is looked up by the caller (resources/availability.py) and passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trackway.errors import InputError
from trackway.resources.availability import Availability
from trackway.resources.gpu_catalog import KNOWN_GPUS, known_gpu, resource_capacity_gib
from trackway.resources.nodes import unfit_nodes
from trackway.settings.resources import QosTier, Resource
from trackway.resources.selection_record import Selection

AUTO = "auto"


@dataclass(frozen=True)
class Need:
    """What a run asks of a resource."""

    kind: str
    gpus: int = 0
    gpu_memory_min_gb: float | None = None
    time_limit_hours: float | None = None
    memory_peak_gib: float | None = None  # the memory preflight's estimate per GPU at the longest batch
    nodes: int = 1  # the nodes the run spans (submit --nodes)
    in_pieces: bool = False  # the time limit is the run's total, run in pieces of the longest tier (--in-pieces)


class NoResourceFits(InputError):
    """No declared resource can take the run; the message lists each with its reason."""


def select(
    need: Need,
    resources: list[Resource],
    available: dict[str, Availability],
    priority: tuple[str, ...] = (),
    requested: str = AUTO,
    field_name: str = "--resource",
    preferred: str | None = None,
) -> Selection:
    """The resource for a run needing `need` (see the module docstring); NoResourceFits when none can take it."""
    candidates = resources if requested == AUTO else [r for r in resources if r.name == requested]
    if not candidates:
        declared = ", ".join(r.name for r in resources) or "none"
        raise InputError(f"{field_name} {requested!r}: not declared in trackway.toml (declared: {declared})")
    fitting: list[tuple[Resource, QosTier | None]] = []
    skipped: list[tuple[str, str]] = []
    for resource in candidates:
        row = available.get(resource.name)
        why = _unfit(need, resource, row, explicit=requested != AUTO)
        if why is not None:
            skipped.append((resource.name, why))
            continue
        piece = _piece_hours(need, resource, row)
        fitting.append((resource, _tier(resource, None if piece is not None else need.time_limit_hours)))
    if not fitting:
        what = f"{field_name} {requested!r}" if requested != AUTO else "no resource can take this run"
        raise NoResourceFits(f"{what}: " + "; ".join(f"{name}: {why}" for name, why in skipped))
    order = {name: index for index, name in enumerate(priority)}
    declared = {resource.name: index for index, resource in enumerate(resources)}

    def rank(item: tuple[Resource, QosTier | None]) -> tuple:
        resource = item[0]
        # A preferred resource comes first whenever it fits; the others as always.
        return (resource.name != preferred, not _free_now(need, available.get(resource.name)),
                order.get(resource.name, len(order)),
                resource.cost_per_gpu_hour, declared[resource.name])

    fitting.sort(key=rank)
    (best, tier), rest = fitting[0], fitting[1:]
    for resource, _ in rest:
        skipped.append((resource.name, _ranked_below(need, resource, best, available, order)))
    # Listed as they were declared: a reader finds a resource where trackway.toml has it.
    skipped.sort(key=lambda item: declared.get(item[0], len(declared)))
    piece = _piece_hours(need, best, available.get(best.name))
    return Selection(
        requested=requested,
        resource=best.name,
        qos=tier.name if tier else None,
        reason=("preferred (prefer_resource); " if best.name == preferred else "")
        + _chosen_reason(need, best, tier, available.get(best.name), order, len(resources) if requested == AUTO else 0,
                         piece),
        skipped=tuple(skipped),
        piece_hours=piece,
    )


def longest_hours(resource: Resource, row: Availability | None) -> tuple[float | None, str]:
    """The longest job `resource` runs (its longest tier's hours, within its partition's MaxTime), and what sets it;
    (None, "") when nothing limits it (or nothing known does)."""
    tier = resource.qos[-1].max_hours if resource.qos else None
    partition = row.max_time_hours if row is not None and row.reachable else None
    if partition is not None and (tier is None or partition < tier):
        return partition, f"partition {row.partition} allows {partition:g} h (MaxTime {row.max_time_text})"
    if tier is not None:
        return tier, f"its longest QoS ({resource.qos[-1].name}) allows {tier:g} h"
    return None, ""


def _piece_hours(need: Need, resource: Resource, row: Availability | None) -> float | None:
    """How long each attempt of a run in pieces runs; None when the run is not in pieces or fits in one."""
    if not need.in_pieces or need.time_limit_hours is None:
        return None
    longest, _ = longest_hours(resource, row)
    if longest is None or longest >= need.time_limit_hours:
        return None
    return longest


def _unfit(need: Need, resource: Resource, row: Availability | None, explicit: bool) -> str | None:
    """Why `resource` cannot take the run, or None when it can."""
    if need.kind not in resource.use_for:
        return f"not used for {need.kind} runs (use_for: {', '.join(resource.use_for)})"
    too_few_nodes = unfit_nodes(resource, need.nodes)
    if too_few_nodes is not None:
        return too_few_nodes
    if row is not None and not row.reachable and not explicit:
        return f"unreachable ({row.error})"
    if need.gpu_memory_min_gb is not None:
        memory = resource.gpu_memory_gb if resource.gpu_memory_gb is not None else (row.gpu_memory_gb if row else None)
        if memory is None:
            return f"{need.gpu_memory_min_gb:g} GB per GPU asked, and its GPU memory is unknown (declare gpu_memory_gb)"
        if memory < need.gpu_memory_min_gb:
            return f"{memory:g} GB < {need.gpu_memory_min_gb:g} GB asked"
    if need.memory_peak_gib is not None:
        capacity = capacity_gib(resource, row)
        if capacity is not None and need.memory_peak_gib > capacity:
            return (f"the memory preflight predicts OOM: {need.memory_peak_gib:.1f} GiB per GPU at the longest batch "
                    f"> {capacity:g} GiB ({need.memory_peak_gib / capacity:.2f})")
    total = resource.total_gpus if resource.total_gpus is not None else (row.total_gpus if row else None)
    if need.gpus:
        if total is None:
            return f"{need.gpus} GPU(s) asked, and its GPU count is unknown (declare gpus_per_node)"
        if total < need.gpus:
            return f"{need.gpus} GPU(s) asked, it has {total}"
        # A run gets the GPUs of the nodes it spans, not of every node the resource has.
        if resource.gpus_per_node is not None and resource.gpus_per_node * need.nodes < need.gpus:
            return (f"{need.gpus} GPU(s) asked on {need.nodes} node(s) of {resource.gpus_per_node} GPU(s): "
                    f"ask for more nodes (--nodes)")
    if row is not None and row.reachable and row.max_nodes is not None and need.nodes > row.max_nodes:
        return (f"{need.nodes} nodes asked, partition {row.partition} allows {row.max_nodes} per job (MaxNodes, "
                "at most the nodes it has)")
    if need.time_limit_hours is not None and not need.in_pieces:
        longest, why = longest_hours(resource, row)
        if longest is not None and need.time_limit_hours > longest:
            return f"{need.time_limit_hours:g} h asked, {why}; --in-pieces runs it in pieces"
    return None


def capacity_gib(resource: Resource, row: Availability | None = None) -> float | None:
    """GiB per GPU as the driver reports it: the catalog's for a GPU it knows, else what is declared or seen
    (`row`: its live availability, when looked up); None when nothing says."""
    declared = resource_capacity_gib(resource)
    if declared is not None:
        return declared[0]
    if row is not None and row.gpu_model and known_gpu(row.gpu_model):
        return KNOWN_GPUS[known_gpu(row.gpu_model)]
    return row.gpu_memory_gb if row is not None else None


def _tier(resource: Resource, hours: float | None) -> QosTier | None:
    """The smallest tier covering `hours` (tiers are sorted shortest first); the longest when no limit is asked."""
    if not resource.qos:
        return None
    if hours is None:
        return resource.qos[-1]
    return next((tier for tier in resource.qos if tier.max_hours >= hours), None)


def _free_now(need: Need, row: Availability | None) -> bool:
    if row is None or not row.reachable:
        return False
    if not need.gpus:
        return True
    return row.free_gpus is not None and row.free_gpus >= need.gpus


def _chosen_reason(
    need: Need, resource: Resource, tier: QosTier | None, row: Availability | None, order: dict[str, int], count: int,
    piece: float | None = None,
) -> str:
    """Why `resource` was chosen; `count`: how many resources were ranked (0 when it was asked for by name)."""
    parts = []
    model = resource.gpu or (row.gpu_model if row else None) or "GPU"
    if need.gpus and row is not None and row.reachable and row.free_gpus is not None:
        if row.free_gpus >= need.gpus:
            parts.append(f"{row.free_gpus} of {row.total_gpus} {model} free")
        else:
            queue = f", {row.pending_jobs} jobs pending" if row.pending_jobs is not None else ""
            parts.append(f"{row.free_gpus} of {row.total_gpus} {model} free, so the run waits in its queue{queue}"
                         " (no resource that fits has enough free now)")
    elif row is not None and not row.reachable:
        parts.append(f"availability unknown ({row.error})")
    if piece is not None:
        pieces = math.ceil(need.time_limit_hours / piece - 1e-9)
        parts.append(f"in pieces (--in-pieces): {need.time_limit_hours:g} h as {pieces} attempts of at most {piece:g} h, "
                     "each resumed from the last one's checkpoint")
    elif tier is not None:
        if need.time_limit_hours is None:
            parts.append(f"no time limit asked: the longest tier ({tier.max_hours:g} h)")
        else:
            parts.append(f"the {tier.max_hours:g} h tier covers {need.time_limit_hours:g} h")
    if resource.name in order:
        parts.append(f"{_ordinal(order[resource.name] + 1)} in [selection] {need.kind}")
    elif count == 1:
        parts.append("the only resource declared" if resource.declared else "this machine (no resources declared)")
    if resource.cost_per_gpu_hour:
        parts.append(f"${resource.cost_per_gpu_hour:.2f}/GPU-h")
    return ", ".join(parts) or "it fits"


def _ranked_below(
    need: Need, resource: Resource, best: Resource, available: dict[str, Availability], order: dict[str, int]
) -> str:
    row = available.get(resource.name)
    if not _free_now(need, row) and _free_now(need, available.get(best.name)):
        if row is None or not row.reachable:
            return f"availability unknown ({row.error if row else 'not looked up'})"
        queue = f", {row.pending_jobs} jobs pending" if row.pending_jobs is not None else ""
        return f"{row.free_gpus} of {row.total_gpus} GPUs free{queue}"
    mine, theirs = order.get(resource.name), order.get(best.name)
    if mine != theirs:
        place = f"{_ordinal(mine + 1)}" if mine is not None else "not listed"
        return f"{place} in [selection] {need.kind}, after {best.name}"
    if resource.cost_per_gpu_hour != best.cost_per_gpu_hour:
        return f"${resource.cost_per_gpu_hour:.2f}/GPU-h against ${best.cost_per_gpu_hour:.2f} for {best.name}"
    return f"declared after {best.name}, which fits as well"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
