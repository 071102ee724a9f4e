"""Where an attempt goes: the run's request (a resource's name, or auto) turned into a resource, a QoS tier and reasons.

Attempt 1 of an `auto` run is placed by resources/selection.py against live availability. A
retry stays where the previous attempt ran (its checkpoints, caches and queue position are
there) unless that attempt ran out of memory: then it moves to a resource with more GPU memory
per GPU when one fits, which the retry policy counts as a changed memory footprint. A run asked
for by name goes there, with the tier its time limit needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.resources.availability import look_up
from trackway.settings.resources import Resource
from trackway.resources.run_preflight import peak_gib
from trackway.resources.selection import AUTO, Need, NoResourceFits, Selection, capacity_gib, select
from trackway.settings import CONFIG_FILE_NAME, Settings, load_settings
from trackway.taxonomy import TerminationReason


def requested(run: Mapping[str, Any]) -> str:
    """What the run asked for; runs recorded before selection existed asked for their `resource` by name."""
    return run.get("resource_request") or run["resource"]


def need_of(run: Mapping[str, Any], gpu_memory_min_gb: float | None = None) -> Need:
    limit = run["time_limit_s"]
    preflight = peak_gib(run.get("preflight"))
    return Need(
        kind=run["kind"],
        gpus=run["gpus"],
        gpu_memory_min_gb=gpu_memory_min_gb if gpu_memory_min_gb is not None else run.get("gpu_memory_min_gb"),
        time_limit_hours=limit / 3600 if limit else None,
        memory_peak_gib=preflight[0] if preflight is not None else None,
        nodes=run.get("nodes") or 1,  # runs recorded before 0018 ran on one node
        # Set by the launcher from the run's retry policy (`in_pieces`, supervisor/policy.py); not a column.
        in_pieces=bool(run.get("in_pieces")),
    )


def _strict(run: Mapping[str, Any]) -> bool:
    preflight = peak_gib(run.get("preflight"))
    return preflight is not None and preflight[1] == "strict"

# The projects' settings read last, by (home, ledger, working directory, the file's bytes): each end
# of a burst prices its attempt and places its retry by its project's file, and load_settings costs
# about 0.14 ms even when the file's checked tables are remembered.
PROJECT_SETTINGS_KEPT = 64
_PROJECT_SETTINGS: dict[tuple[Path, str, Path, bytes], Settings] = {}


def candidates(settings: Settings) -> list[Resource]:
    """The declared resources; this machine alone when trackway.toml declares none."""
    return list(settings.resources.values()) or [settings.resource("local")]


def project_settings(settings: Settings, run: Mapping[str, Any]) -> Settings:
    """The settings of the run's own project: the trackway.toml in its working directory, where it was submitted.

    A supervisor started elsewhere (a background one, another project's) must place a retry
    among the resources the run was submitted with, not among its own. Without such a file, or
    with one that no longer reads, the supervisor's settings stand.
    """
    workdir = Path(run["workdir"]) if run.get("workdir") else None
    if workdir is None or not (workdir / CONFIG_FILE_NAME).is_file():
        return settings
    # What load_settings reads here is the file alone (home and ledger are given): settings made from
    # the same bytes are the same, and a burst of ends of one project's runs reads them once.
    key = (settings.home, settings.db_url, workdir, (workdir / CONFIG_FILE_NAME).read_bytes())
    found = _PROJECT_SETTINGS.get(key)
    if found is not None:
        return found
    try:
        found = load_settings(home=settings.home, db=settings.db_url, cwd=workdir)
    except InputError:
        return settings
    if len(_PROJECT_SETTINGS) >= PROJECT_SETTINGS_KEPT:
        _PROJECT_SETTINGS.clear()
    _PROJECT_SETTINGS[key] = found
    return found


def place(settings: Settings, run: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> Selection:
    """The resource and QoS tier for the run's next attempt (`previous`: its latest attempt, if any)."""
    asked = requested(run)
    need = need_of(run)
    strict = _strict(run)
    if asked != AUTO and not strict:
        need = replace(need, memory_peak_gib=None)  # asked for by name: the preflight warned, the user decides
    if asked != AUTO:
        resource = settings.resource(asked)
        if not resource.declared and resource.name != "local":
            # Removed from trackway.toml after the run was recorded: it runs as it was, locally.
            return Selection(asked, asked, None, "asked for by name (no longer declared: runs locally)")
        # This machine's GPU count (NVML) and a Slurm partition's limits need asking; an SSH resource's are declared,
        # and no queue matters to a run asked for by name.
        asked_of = look_up([resource]) if resource.executor in ("local", "slurm") and previous is None else {}
        return _kept_pieces(select(need, [resource], asked_of, requested=asked), previous)
    pool = candidates(settings)
    if previous is not None:
        moved = _after_oom(settings, run, previous, pool, need)
        if moved is not None:
            return moved
        stay = settings.resources.get(previous.get("resource") or run["resource"])
        if stay is not None:
            try:
                kept = select(need, [stay], {}, requested=stay.name)
            except NoResourceFits:
                pass  # its declaration changed so that it no longer fits: choose again
            else:
                number = previous["attempt_number"]
                return _kept_pieces(Selection(AUTO, kept.resource, kept.qos,
                                              f"where attempt {number} ran: a retry stays with its checkpoints and queue"
                                              + (f"; {kept.reason}" if kept.reason != "it fits" else "")), previous)
    return _select_warned(run, need, pool, settings, strict)


def _kept_pieces(chosen: Selection, previous: Mapping[str, Any] | None) -> Selection:
    """A retry of a run in pieces on the resource it ran on keeps the pieces' length planned for its first
    attempt (the partition's MaxTime included, which a retry does not ask Slurm for again)."""
    if previous is None:
        return chosen
    before = Selection.from_json(previous.get("selection"))
    if before is None or before.piece_hours is None or before.resource != chosen.resource:
        return chosen
    return replace(chosen, piece_hours=before.piece_hours, qos=before.qos)


def _select_warned(run: Mapping[str, Any], need: Need, pool: list[Resource], settings: Settings,
                   strict: bool) -> Selection:
    """Selection among `pool`; a run the preflight predicts to OOM everywhere still runs unless it is strict."""
    available = look_up(pool, home=settings.home)
    priority = settings.selection.get(run["kind"], ())
    try:
        return select(need, pool, available, priority, preferred=run.get("resource_preferred"))
    except NoResourceFits:
        if need.memory_peak_gib is None or strict:
            raise
        chosen = select(replace(need, memory_peak_gib=None), pool, available, priority)
    return replace(chosen, reason=f"{chosen.reason}; the memory preflight predicts OOM on every resource "
                                  f"({need.memory_peak_gib:.1f} GiB per GPU): warned at submit")


def _after_oom(
    settings: Settings, run: Mapping[str, Any], previous: Mapping[str, Any], pool: list[Resource], need: Need
) -> Selection | None:
    """After an OOM, a resource with more memory per GPU than where it ran; None when none fits (it stays)."""
    if previous.get("termination_reason") != TerminationReason.OOM.value:
        return None
    where = settings.resources.get(previous.get("resource") or run["resource"])
    had = capacity_gib(where) if where is not None else None
    if had is None:
        return None
    bigger = [r for r in pool if (capacity_gib(r) or 0.0) > had]
    if not bigger:
        return None
    roomier = replace(need, gpu_memory_min_gb=None)
    try:
        chosen = select(roomier, bigger, look_up(bigger, home=settings.home), settings.selection.get(run["kind"], ()))
    except NoResourceFits:
        return None
    memory = capacity_gib(settings.resource(chosen.resource))
    return Selection(AUTO, chosen.resource, chosen.qos,
                     f"attempt {previous['attempt_number']} ran out of memory on {where.name} "
                     f"({had:g} GiB per GPU), {chosen.resource} has {memory:g} GiB: {chosen.reason}",
                     chosen.skipped)


def resource_after_oom(settings: Settings, run: Mapping[str, Any], attempt: Mapping[str, Any]) -> str | None:
    """Where the retry of `attempt`, which ran out of memory, would go: a resource with more memory per GPU,
    or None when it would stay (a run asked for by name, or nothing bigger fits). Asks live availability."""
    if requested(run) != AUTO:
        return None
    project = project_settings(settings, run)
    moved = _after_oom(project, run, {**attempt, "termination_reason": TerminationReason.OOM.value},
                       candidates(project), need_of(run))
    return moved.resource if moved is not None else None
