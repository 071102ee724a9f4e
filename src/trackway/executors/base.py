"""The executor seam: what a supervisor asks of any place to run (submit / poll / cancel / logs).

An executor starts one attempt per `submit()` and afterwards answers from its own
durable state, so that a supervisor restarted after a crash can `poll()` handles
it did not create in this process. Phases of a job as `poll()` reports them:

    submit() ──► QUEUED ──► RUNNING ──► ENDED      exit code or signal known; timed_out / cancelled set
                   │           │
                   └───────────┴──────► VANISHED   gone without an exit status (the executor lost it)

QUEUED is for executors with a queue (Slurm: submitted, not yet running); local jobs start RUNNING.
ENDED and VANISHED are terminal. `cancel()` only asks; the end shows up in `poll()`.
`preview()` says, as text, what `submit()` would send (`trackway submit --dry-run`), touching nothing:
each executor renders it with the code its `submit()` uses, so the two cannot drift.
`poll_many()` answers for many jobs at once: an executor with a remote queue asks it once per
call, never once per job (the base implementation just loops over `poll()`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from trackway.executors.code_snapshot import CodeSnapshot
    from trackway.settings.resources import Resource


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt to start: an argv (no shell), where to run it and what it may use."""

    attempt_id: str
    command: list[str]
    cwd: Path
    env: dict[str, str]
    state_dir: Path
    log_path: Path
    gpus: int = 0  # in all, over every node
    time_limit_s: float | None = None
    grace_s: float = 30.0
    nodes: int = 1  # the nodes the attempt spans: one task per node, with the rendezvous variables
    # True: `env` is the whole environment (the run's submitted one plus TRACKWAY_*); False: `env`
    # is added to the executor's own, for runs recorded before environments were stored.
    env_is_complete: bool = False
    # Where to run, as trackway.toml declares it (Slurm: partition, account, sbatch options, setup
    # prologue, nodes); None: the executor's defaults. `qos`: the QoS tier the selection chose.
    resource: "Resource | None" = None
    qos: str | None = None
    # For executors that run elsewhere (ssh): the run's own variables and TRACKWAY_*, without the
    # submitting machine's environment; and the code to send there, rebuilt from the receipt.
    run_env: dict[str, str] | None = None
    code: "CodeSnapshot | None" = None


@dataclass(frozen=True)
class JobHandle:
    """Enough to find a job again from another process: executor name, its job id, its state directory."""

    executor: str
    job_id: str
    state_dir: Path


@dataclass(frozen=True)
class Submission:
    """What `submit()` learned once the job started: the handle and the placement."""

    handle: JobHandle
    host: str
    gpu_ids: list[int]
    gpu_model: str | None
    started_at: datetime
    pid: int | None


class JobPhase(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
    VANISHED = "vanished"

    def is_terminal(self) -> bool:
        return self in (JobPhase.ENDED, JobPhase.VANISHED)


@dataclass(frozen=True)
class JobStatus:
    """A job as the executor sees it now; `evidence` holds executor-state lines for the receipt.

    `reason`: a `trackway.taxonomy.TerminationReason` value, set only when the executor knows the
    cause for certain (Slurm PREEMPTED -> "preempted", TIMEOUT -> "timeout", ...); None leaves it to
    the classifier. `placement`: where the job runs or ran, as the executor knows it (Slurm: job
    id, node list, partition, QoS, allocated GPUs), None when it has nothing to add.
    """

    phase: JobPhase
    exit_code: int | None = None
    signal: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    timed_out: bool = False
    cancelled: bool = False
    evidence: tuple[str, ...] = ()
    reason: str | None = None
    placement: dict | None = None
    # It ended without ever running (a queue that would never start it, a cancel while it waited): no compute spent.
    never_started: bool = False


# Below this much room, a shim that left no exit status most likely could not write one.
FULL_DISK_BYTES = 1 << 20


def full_disk_evidence(state_dir: Path) -> tuple[str, ...]:
    """`disk full: STATE_DIR, N bytes free` when the attempt's directory sits on a (nearly) full disk, else nothing.

    Said beside a vanished job: the classifier reads it as a full disk, and the policy stops
    instead of resuming into the same disk.
    """
    import shutil

    try:
        free = shutil.disk_usage(state_dir).free
    except OSError:
        return ()
    if free >= FULL_DISK_BYTES:
        return ()
    return (f"disk full: {state_dir}, {free} bytes free (so the exit status could not be written there)",)


def status_to_json(status: JobStatus) -> dict:
    """A terminal status as an executor keeps it on disk, so that later polls need not ask again."""
    return {
        "phase": status.phase.value,
        "exit_code": status.exit_code,
        "signal": status.signal,
        "started_at": status.started_at.isoformat() if status.started_at else None,
        "ended_at": status.ended_at.isoformat() if status.ended_at else None,
        "timed_out": status.timed_out,
        "cancelled": status.cancelled,
        "evidence": list(status.evidence),
        "reason": status.reason,
        "placement": status.placement,
        "recorded_at": time.time(),
    }


def status_from_json(data: dict) -> JobStatus:
    def when(text: str | None) -> datetime | None:
        return datetime.fromisoformat(text) if text else None

    return JobStatus(
        phase=JobPhase(data["phase"]),
        exit_code=data["exit_code"],
        signal=data["signal"],
        started_at=when(data["started_at"]),
        ended_at=when(data["ended_at"]),
        timed_out=data["timed_out"],
        cancelled=data["cancelled"],
        evidence=tuple(data["evidence"]),
        reason=data["reason"],
        placement=data["placement"],
    )


class Executor(ABC):
    """A place to run attempts. Implementations keep their state where another process can read it."""

    name: str
    # True for executors that run the command on another machine: the launcher then sends the
    # code snapshot (LaunchRequest.code) and the run's own environment (run_env).
    remote: bool = False

    @abstractmethod
    def submit(self, request: LaunchRequest) -> Submission:
        """Start the command; return once it runs (or is known to have failed to start)."""

    @abstractmethod
    def poll(self, handle: JobHandle) -> JobStatus:
        """Say whether the job runs, ended (and how), or vanished."""

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        """`poll()` for many jobs, keyed by job id. Executors with a remote queue override it to ask once."""
        return {handle.job_id: self.poll(handle) for handle in handles}

    @abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Ask the job to stop; returns promptly. Cancelling an ended job does nothing."""

    @abstractmethod
    def logs(self, handle: JobHandle) -> Path:
        """The file holding the job's timestamped stdout and stderr."""

    def adopt(self, state_dir: Path) -> Submission | None:
        """The job a launcher started in `state_dir` but died before recording, if this executor can find it."""
        return None

    def ended_signal(self) -> int | None:
        """A descriptor that turns readable when one of this executor's jobs may have ended (its reader drains
        it), so that a supervisor polls then rather than at its next interval; None where there is none."""
        return None

    def preview(self, request: LaunchRequest) -> str:
        """What submit would send, as text; starts and records nothing."""
        raise NotImplementedError(f"executor {self.name!r} cannot say what it would submit")
