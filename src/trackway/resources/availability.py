"""Live availability of each resource: free and total GPUs, jobs running and waiting, and how long asking took.

Local: NVML's GPUs, free when no process holds one. Slurm: one `sinfo` (GPUs configured and
allocated per node of the partition) and one `squeue` (jobs of the partition by state), run side
by side with a timeout, so that an unreachable controller makes a row that says so instead of a
hang. SSH: each host asked once (its `nvidia-smi`, where it has one: a GPU with a compute process
is taken), less the GPUs trackway's own leases hold there (executors/ssh.py). On local and SSH resources
trackway is the only queue: their running and pending counts are its ledger's (resources/own_queue.py),
when the caller passes them. Kubernetes: the GPUs allocatable and requested on each node pool its pods
may use, and its namespace's pods running and pending (executors/kube_nodes.py). Resources are looked
up in parallel: a listing costs the slowest look-up, not their sum.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trackway.settings.resources import Resource

LOOKUP_TIMEOUT_S = float(os.environ.get("TRACKWAY_RESOURCE_TIMEOUT_S", "5"))


@dataclass(frozen=True)
class Availability:
    """What a resource can take now. None: not known (the row's `error` or `note` says why)."""

    resource: str
    reachable: bool
    free_gpus: int | None = None
    total_gpus: int | None = None
    gpu_model: str | None = None
    gpu_memory_gb: float | None = None
    running_jobs: int | None = None
    pending_jobs: int | None = None
    lookup_ms: float = 0.0
    error: str | None = None
    pools: tuple[dict, ...] | None = None  # Kubernetes: GPUs allocatable and requested per node pool
    note: str | None = None  # what could not be read, beside a row that answered
    # A Slurm partition's limits, as `scontrol show partition` says them: the longest job (hours, and Slurm's
    # own words) and the most nodes one job may span (MaxNodes, at most the nodes it has); None: no limit, or unknown.
    partition: str | None = None
    max_time_hours: float | None = None
    max_time_text: str | None = None
    max_nodes: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """`2 of 8 GPUs free, 3 running, 41 pending` / `unreachable: sinfo timed out after 5 s`."""
        if not self.reachable:
            return f"unreachable: {self.error}"
        parts = []
        if self.total_gpus is not None:
            parts.append(f"{self.free_gpus} of {self.total_gpus} GPUs free" if self.total_gpus else "no GPUs")
        if self.running_jobs is not None:
            parts.append(f"{self.running_jobs} running, {self.pending_jobs} pending")
        return ", ".join(parts) or "available"


def look_up(resources: list[Resource], timeout_s: float = LOOKUP_TIMEOUT_S,
            home: Path | None = None, own_jobs: dict[str, tuple[int, int]] | None = None) -> dict[str, Availability]:
    """Every resource's availability, looked up side by side; `home`: where SSH hosts' GPU leases are kept.

    `own_jobs`: the ledger's running and pending counts by resource (resources/own_queue.py), for the
    resources trackway alone schedules (local, SSH); without them those counts are not known (None).
    """
    if not resources:
        return {}
    from concurrent.futures import ThreadPoolExecutor  # here: `show` imports this module to render a selection

    with ThreadPoolExecutor(max_workers=min(8, len(resources))) as pool:
        found = list(pool.map(lambda resource: availability(resource, timeout_s, home, own_jobs), resources))
    return {row.resource: row for row in found}


def availability(resource: Resource, timeout_s: float = LOOKUP_TIMEOUT_S, home: Path | None = None,
                 own_jobs: dict[str, tuple[int, int]] | None = None) -> Availability:
    started = time.perf_counter()
    if resource.executor == "slurm":
        row = _slurm(resource, timeout_s)
    elif resource.executor == "ssh":
        row = _ssh(resource, timeout_s, home)
    elif resource.executor == "kubernetes":
        row = _kubernetes(resource, timeout_s)
    else:
        row = _local(resource)
    # Slurm and Kubernetes have queues of their own; on the others the ledger knows them, host reached or not.
    if own_jobs is not None and resource.executor not in ("slurm", "kubernetes"):
        running, pending = own_jobs.get(resource.name, (0, 0))
        row = Availability(**{**row.as_dict(), "running_jobs": running, "pending_jobs": pending})
    return Availability(**{**row.as_dict(), "lookup_ms": (time.perf_counter() - started) * 1000})


def _local(resource: Resource) -> Availability:
    from trackway.receipts.placement import gpu_inventory

    gpus = gpu_inventory()
    free = sum(1 for gpu in gpus if gpu.processes == 0)
    memory = min((gpu.memory_total_bytes for gpu in gpus), default=None)
    return Availability(
        resource=resource.name,
        reachable=True,
        free_gpus=free,
        total_gpus=len(gpus),
        gpu_model=gpus[0].name if gpus else resource.gpu,
        gpu_memory_gb=round(memory / 1e9, 1) if memory else resource.gpu_memory_gb,
    )


def _kubernetes(resource: Resource, timeout_s: float) -> Availability:
    """The node pools the resource's pods may use: GPUs allocatable less those requested; its namespace's pods."""
    from trackway.errors import ExecutorError

    try:
        from trackway.executors.kube_nodes import gpus_of

        found = gpus_of(resource, timeout_s)
    except ImportError as exc:
        return Availability(resource=resource.name, reachable=False, gpu_model=resource.gpu,
                            error=f"the kubernetes client is not installed ({exc.name})")
    except ExecutorError as exc:
        return Availability(resource=resource.name, reachable=False, gpu_model=resource.gpu,
                            gpu_memory_gb=resource.gpu_memory_gb, error=str(exc))
    return Availability(
        resource=resource.name, reachable=True, free_gpus=found.free, total_gpus=found.total, gpu_model=resource.gpu,
        gpu_memory_gb=resource.gpu_memory_gb, running_jobs=found.running, pending_jobs=found.pending,
        pools=tuple(pool.as_dict() for pool in found.pools), note=found.note)


# One call a host: its GPUs and the bus ids of GPUs with a compute process, or that it has no nvidia-smi.
_SSH_GPU_PROBE = ("if command -v nvidia-smi >/dev/null 2>&1; then "
                  "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader && echo '--apps--' && "
                  "nvidia-smi --query-compute-apps=gpu_bus_id --format=csv,noheader; "
                  "else echo 'no nvidia-smi'; fi")


def _ssh(resource: Resource, timeout_s: float, home: Path | None = None) -> Availability:
    """Which of the resource's hosts answer now, and their free GPUs (side by side, each within the timeout).

    A host's GPUs are what its nvidia-smi lists, else the declared `gpus_per_node`; free are those no
    compute process holds (where nvidia-smi says) and no live lease of trackway's holds. Running: the
    attempts of this home holding leases on the resource's hosts. Without `home`, leases are not read.
    """
    from trackway.errors import ExecutorError
    from trackway.executors.ssh import leased_gpus
    from trackway.executors.ssh_transport import SshClient, SshTarget

    def probe(spec: str) -> tuple[str | None, str]:
        try:
            out = SshClient(SshTarget.parse(spec), resource.key_file, resource.ssh_options,
                            connect_timeout_s=timeout_s).run(_SSH_GPU_PROBE, timeout_s=timeout_s + 1)
            return None, out.decode(errors="replace")
        except ExecutorError as exc:
            return str(exc), ""

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, len(resource.hosts))) as pool:
        answers = dict(zip(resource.hosts, pool.map(probe, resource.hosts)))
    answering = [spec for spec, (failure, _) in answers.items() if failure is None]
    down = "; ".join(failure for failure, _ in answers.values() if failure)
    total = free = 0
    known = True
    running: set[str] = set()
    for spec in answering:
        seen, busy = _nvidia_smi_gpus(answers[spec][1])
        count = len(seen) if seen is not None else resource.gpus_per_node
        if count is None:
            known = False
            continue
        leases = leased_gpus(home, spec) if home is not None else {}
        running.update(leases)
        held = {index for ids in leases.values() for index in ids} | busy
        total += count
        free += max(0, count - len(held & set(range(count))))
    return Availability(
        resource=resource.name,
        reachable=bool(answering),
        free_gpus=free if answering and known else None,
        total_gpus=total if answering and known else None,
        gpu_model=resource.gpu,
        gpu_memory_gb=resource.gpu_memory_gb,
        running_jobs=len(running) if home is not None and answering else None,
        # trackway is the one scheduler of these hosts: an attempt it could not place stays queued in the ledger.
        pending_jobs=0 if home is not None and answering else None,
        error=(f"{len(answering)} of {len(resource.hosts)} hosts answer: {down}" if down else None),
    )


def _nvidia_smi_gpus(out: str) -> tuple[list[int] | None, set[int]]:
    """(the host's GPU indices, those with a compute process) from _SSH_GPU_PROBE's answer; None: no nvidia-smi."""
    if "--apps--" not in out:
        return None, set()
    listed, apps = out.split("--apps--", 1)
    by_bus: dict[str, int] = {}
    for line in listed.splitlines():
        index, _, bus = (part.strip() for part in line.partition(","))
        if index.isdigit():
            by_bus[bus.lower()] = int(index)
    busy = {by_bus[bus] for bus in (line.strip().lower() for line in apps.splitlines()) if bus in by_bus}
    return sorted(by_bus.values()), busy


def _slurm(resource: Resource, timeout_s: float) -> Availability:
    partition = ["--partition", resource.partition] if resource.partition else []
    commands = {
        # One line per node: its configured GRES, the GRES allocated now, and its state.
        "sinfo": ["sinfo", "--noheader", "--Node", *partition, "--Format=NodeHost:64,Gres:200,GresUsed:200,StateCompact:32"],
        "squeue": ["squeue", "--noheader", *partition, "--format=%T"],
        # The partition's limits (MaxTime, MaxNodes, TotalNodes); without one named, every partition (the default's).
        "scontrol": ["scontrol", "show", "partition", *([resource.partition] if resource.partition else []), "--oneliner"],
    }
    try:
        out = _run_side_by_side(commands, timeout_s, optional=("scontrol",))
    except _LookupFailed as exc:
        return Availability(resource=resource.name, reachable=False, gpu_model=resource.gpu,
                            gpu_memory_gb=resource.gpu_memory_gb, error=str(exc))
    if not out["sinfo"].strip():
        where = f"partition {resource.partition!r}" if resource.partition else "the cluster"
        return Availability(resource=resource.name, reachable=False, gpu_model=resource.gpu,
                            gpu_memory_gb=resource.gpu_memory_gb, error=f"sinfo lists no node in {where}")
    total = used = 0
    seen: set[str] = set()
    for line in out["sinfo"].splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0] in seen:
            continue  # a node in two partitions is listed twice without --partition
        seen.add(fields[0])
        if _unusable(fields[3]):
            continue
        total += gres_gpus(fields[1])
        used += gres_gpus(fields[2])
    states = out["squeue"].split()
    limits = partition_limits(out["scontrol"], resource.partition)
    return Availability(
        resource=resource.name,
        reachable=True,
        free_gpus=max(total - used, 0),
        total_gpus=total,
        gpu_model=resource.gpu,
        gpu_memory_gb=resource.gpu_memory_gb,
        running_jobs=sum(1 for state in states if state in ("RUNNING", "COMPLETING")),
        pending_jobs=sum(1 for state in states if state in ("PENDING", "REQUEUED", "CONFIGURING")),
        **limits,
    )


def partition_limits(scontrol: str, name: str | None) -> dict:
    """The `partition`, `max_time_hours`, `max_time_text` and `max_nodes` of partition `name` (None: the default
    one) in `scontrol show partition --oneliner`'s answer; {} when it is not there."""
    for line in scontrol.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if not fields.get("PartitionName") or (fields["PartitionName"] != name if name else fields.get("Default") != "YES"):
            continue
        text = fields.get("MaxTime", "UNLIMITED")
        seconds = slurm_duration_s(text)
        nodes = [int(fields[key]) for key in ("MaxNodes", "TotalNodes") if fields.get(key, "").isdigit()]
        return {"partition": fields["PartitionName"], "max_time_hours": seconds / 3600 if seconds is not None else None,
                "max_time_text": text if seconds is not None else None, "max_nodes": min(nodes) if nodes else None}
    return {}


def slurm_duration_s(text: str) -> float | None:
    """Seconds in a Slurm duration (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`); None for UNLIMITED."""
    text = text.strip()
    days, _, rest = text.rpartition("-") if "-" in text else ("", "", text)
    parts = rest.split(":")
    if not (days == "" or days.isdigit()) or not all(part.isdigit() for part in parts) or not 1 <= len(parts) <= 3:
        return None
    numbers = [int(part) for part in parts]
    if days:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if len(numbers) == 1:
        return numbers[0] * 60.0  # a bare number is minutes
    if len(numbers) == 2:
        return numbers[0] * 60.0 + numbers[1]
    return float((numbers[0] * 60 + numbers[1]) * 60 + numbers[2])


_GRES = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gres_gpus(text: str) -> int:
    """GPUs in a Slurm GRES string: `gpu:2`, `gpu:b200:8(S:0-1)`, `gpu:(null):1(IDX:0)`, `gpu:a100:2,gpu:h100:4`."""
    return sum(int(count) for count in _GRES.findall(text.replace("(null)", "null")))


def _unusable(state: str) -> bool:
    """A node that takes no jobs now: down, drained or draining, failing, powered off, or not responding (`*`)."""
    state = state.lower()
    return state.endswith("*") or any(word in state for word in ("down", "drain", "fail", "maint", "powered", "unk"))


class _LookupFailed(Exception):
    pass


def _run_side_by_side(commands: dict[str, list[str]], timeout_s: float,
                      optional: tuple[str, ...] = ()) -> dict[str, str]:
    """Every command's stdout; _LookupFailed (one line) when one cannot start, fails or takes too long.

    A command in `optional` that fails answers "" instead (what it would have said is then not known).
    """
    started = {}
    try:
        for name, argv in commands.items():
            started[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError as exc:
        _kill(started)
        raise _LookupFailed(f"{exc.filename} not found: is the Slurm client installed here?") from None
    deadline = time.monotonic() + timeout_s
    out = {}
    try:
        for name, process in started.items():
            try:
                stdout, stderr = process.communicate(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                raise _LookupFailed(f"{name} did not answer within {timeout_s:g} s") from None
            if process.returncode != 0:
                if name in optional:
                    out[name] = ""
                    continue
                first = (stderr.strip().splitlines() or [f"exit status {process.returncode}"])[0]
                raise _LookupFailed(f"{name} failed: {first}")
            out[name] = stdout
    finally:
        _kill(started)
    return out


def _kill(started: dict[str, subprocess.Popen]) -> None:
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def resource_record(resource, row: Availability) -> dict:
    """A resource with what it can take now, as `trackway resources --json` and `GET /api/resources` show it."""
    return {
        "resource": resource.name, "executor": resource.executor, "declared": resource.declared,
        "gpu": resource.gpu or row.gpu_model, "gpu_memory_gb": resource.gpu_memory_gb or row.gpu_memory_gb,
        "gpus_per_node": resource.gpus_per_node, "nodes": resource.nodes,
        "cost_per_gpu_hour": resource.cost_per_gpu_hour, "preemptible": resource.preemptible,
        "grace_seconds": resource.grace_seconds, "use_for": list(resource.use_for),
        "partition": resource.partition, "account": resource.account,
        "qos": [{"name": tier.name, "max_hours": tier.max_hours} for tier in resource.qos],
        "reachable": row.reachable, "free_gpus": row.free_gpus, "total_gpus": row.total_gpus,
        "running_jobs": row.running_jobs, "pending_jobs": row.pending_jobs,
        "partition_max_time": row.max_time_text, "partition_max_nodes": row.max_nodes,
        "lookup_ms": round(row.lookup_ms, 1), "error": row.error,
        **({"namespace": resource.namespace, "pools": list(row.pools or []), "note": row.note}
           if resource.executor == "kubernetes" else {}),
    }
