"""The executor seam: what a supervisor asks of any place to run (submit / poll / cancel / logs).

An executor starts one attempt per `submit()` and afterwards answers from its own
durable state, so that a supervisor restarted after a crash can `poll()` handles
it did not create in this process. Phases of a job as `poll()` reports them:

    submit() ──► RUNNING ──► ENDED      exit code or signal known; timed_out / cancelled set
                    │
                    └──────► VANISHED   gone without an exit status (the executor lost it)

ENDED and VANISHED are terminal. `cancel()` only asks; the end shows up in `poll()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path

from trackway.errors import InputError


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt to start: an argv (no shell), where to run it and what it may use."""

    attempt_id: str
    command: list[str]
    cwd: Path
    env: dict[str, str]
    state_dir: Path
    log_path: Path
    gpus: int = 0
    time_limit_s: float | None = None
    grace_s: float = 30.0
    # True: `env` is the whole environment (the run's submitted one plus TRACKWAY_*); False: `env`
    # is added to the executor's own, for runs recorded before environments were stored.
    env_is_complete: bool = False


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
    RUNNING = "running"
    ENDED = "ended"
    VANISHED = "vanished"

    def is_terminal(self) -> bool:
        return self is not JobPhase.RUNNING


@dataclass(frozen=True)
class JobStatus:
    """A job as the executor sees it now; `evidence` holds executor-state lines for the receipt."""

    phase: JobPhase
    exit_code: int | None = None
    signal: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    timed_out: bool = False
    cancelled: bool = False
    evidence: tuple[str, ...] = ()


class Executor(ABC):
    """A place to run attempts. Implementations keep their state where another process can read it."""

    name: str

    @abstractmethod
    def submit(self, request: LaunchRequest) -> Submission:
        """Start the command; return once it runs (or is known to have failed to start)."""

    @abstractmethod
    def poll(self, handle: JobHandle) -> JobStatus:
        """Say whether the job runs, ended (and how), or vanished."""

    @abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Ask the job to stop; returns promptly. Cancelling an ended job does nothing."""

    @abstractmethod
    def logs(self, handle: JobHandle) -> Path:
        """The file holding the job's timestamped stdout and stderr."""

    def adopt(self, state_dir: Path) -> Submission | None:
        """The job a launcher started in `state_dir` but died before recording, if this executor can find it."""
        return None


def _local(home: Path) -> Executor:
    from trackway.executors.local import LocalExecutor

    return LocalExecutor(home)


# Factories import their module on use, so that naming an executor never loads the others.
def _inline(home: Path) -> Executor:
    from trackway.executors.inline import InlineExecutor

    return InlineExecutor(home)


_REGISTRY: dict[str, Callable[[Path], Executor]] = {"local": _local, "inline": _inline}


def known_executors() -> list[str]:
    return sorted(_REGISTRY)


def get_executor(name: str, home: Path) -> Executor:
    """The executor called `name`, keeping its state under `home`."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise InputError(f"executor {name!r}: expected one of {', '.join(known_executors())}")
    return factory(home)
