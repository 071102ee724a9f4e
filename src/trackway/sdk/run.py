"""`trackway.init()` and the `Run` a training script holds: log, checkpoints, preemption notice, finish.

Inside an attempt started by trackway, `init()` joins it from the `TRACKWAY_*` environment.
Run alone (a laptop, a notebook), it records its own run and attempt in the ledger and ingests
its spool itself, so the same script works in both places.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from trackway.sdk.exceptions import NonFiniteLoss, SpoolPointsLost
from trackway.sdk.hooks import (
    describe_exception,
    install_excepthook,
    install_notice_handlers,
    reason_for_exception,
    restore_handlers,
)
from trackway.sdk.writer import SpoolWriter
from trackway.spool import NOTE_FILE, write_json_atomic
from trackway.taxonomy import TerminationReason

if TYPE_CHECKING:
    from trackway.checkpoints.manager import CheckpointManager
    from trackway.sdk.standalone import StandaloneSession

# EX_TEMPFAIL: "try again later", which is what a preempted attempt asks of its supervisor.
EXIT_PREEMPTED = 75
FINITE_KEYS = ("loss", "grad_norm")


@dataclass(frozen=True)
class AttemptContext:
    """Where this process stands: which run and attempt, where to spool and checkpoint, which rank."""

    run_id: str
    attempt_id: str
    attempt_number: int
    spool_dir: Path
    checkpoint_dir: Path
    resume_from: str | None = None
    config_path: Path | None = None
    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AttemptContext | None:
        env = os.environ if env is None else env
        attempt_id = env.get("TRACKWAY_ATTEMPT_ID")
        if not attempt_id:
            return None
        config = env.get("TRACKWAY_CONFIG")
        return cls(
            run_id=env["TRACKWAY_RUN_ID"],
            attempt_id=attempt_id,
            attempt_number=int(env.get("TRACKWAY_ATTEMPT_NUMBER", "1")),
            spool_dir=Path(env["TRACKWAY_SPOOL_DIR"]),
            checkpoint_dir=Path(env["TRACKWAY_CHECKPOINT_DIR"]),
            resume_from=env.get("TRACKWAY_RESUME_FROM") or None,
            config_path=Path(config) if config else None,
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
        )


class Run:
    """One process's handle on its attempt."""

    def __init__(
        self,
        context: AttemptContext,
        config: dict[str, Any] | None = None,
        *,
        checkpoint_every_steps: int | None = None,
        checkpoint_every_minutes: float | None = None,
        log_all_ranks: bool = False,
        install_hooks: bool = True,
        standalone: StandaloneSession | None = None,
    ):
        self.context = context
        self.run_id = context.run_id
        self.attempt_id = context.attempt_id
        self.rank = context.rank
        self.config = config if config is not None else _load_config(context.config_path)
        self._standalone = standalone
        self._checkpoint_every = (checkpoint_every_steps, checkpoint_every_minutes)
        self._checkpoints: CheckpointManager | None = None
        self._logging = log_all_ranks or context.rank == 0
        self._writer = SpoolWriter(
            context.spool_dir,
            rank=context.rank,
            heartbeat_interval_s=_heartbeat_interval(context.rank),
            finite_keys=FINITE_KEYS,
        )
        self._append = self._writer.queue.append
        self._step: int | None = None
        self._notice: int | None = None
        self._closed = False
        self._previous_handlers: dict[int, Any] = {}
        self._uninstall_excepthook = None
        if install_hooks:
            self._previous_handlers = install_notice_handlers(self._on_notice)
            self._uninstall_excepthook = install_excepthook(self._on_uncaught)
        atexit.register(self._at_exit)
        self._writer.event("started", pid=os.getpid(), resume_from=context.resume_from, world_size=context.world_size)

    # -- logging ---------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record scalar metrics at `step` (default: the last step + 1). Never blocks on I/O."""
        if step is None:
            step = 0 if self._step is None else self._step + 1
        self._step = step
        if not self._logging:
            return
        for key in FINITE_KEYS:
            value = metrics.get(key)
            # A plain float is checked here (v - v is NaN for NaN and ±inf). Anything else (a tensor)
            # would force a device sync, so the writer thread checks it and reports on the next call.
            if value.__class__ is float and value - value != 0.0:
                self._non_finite(key, value, step)
        if self._writer.non_finite is not None:
            self._non_finite(*self._writer.non_finite)
        self._append((step, time.time(), dict(metrics)))

    def _non_finite(self, key: str, value: Any, step: int) -> NoReturn:
        self._writer.non_finite = None
        last = self._last_committed_name()
        hint = f"; last good checkpoint: {last}" if last else "; no checkpoint committed yet"
        self.note(TerminationReason.NAN_LOSS, f"non-finite {key} = {value} at step {step}{hint}", step=step, key=key)
        raise NonFiniteLoss(key, float(value), step)

    # -- checkpoints -----------------------------------------------------------------------

    @property
    def checkpoints(self) -> CheckpointManager:
        """The run's checkpoints (created on first use, so scripts without torch never import it)."""
        if self._checkpoints is None:
            from trackway.checkpoints.manager import CheckpointManager

            every_steps, every_minutes = self._checkpoint_every
            self._checkpoints = CheckpointManager(
                self.context.checkpoint_dir,
                run_id=self.run_id,
                attempt_id=self.attempt_id,
                resume_from=self.context.resume_from,
                every_steps=every_steps,
                every_minutes=every_minutes,
                on_commit=self._on_commit,
                on_restore=self._on_restore,
            )
        return self._checkpoints

    def _on_commit(self, info) -> None:
        manifest = info.manifest or {}
        self._writer.event(
            "checkpoint_committed",
            step=info.step,
            name=info.name,
            path=str(info.path),
            size_bytes=info.size_bytes,
            parent=manifest.get("parent"),
            metrics=manifest.get("metrics"),
            committed_at=info.committed_at.isoformat() if info.committed_at else None,
        )

    def _on_restore(self, record: dict[str, Any]) -> None:
        """Record what this attempt really resumed from: the receipt's resumed-from is taken from this event."""
        for skipped in record["fallback_from"]:
            # Said where the user looks first (the attempt's log), once per checkpoint set aside.
            where = f" as {skipped['set_aside_as']}" if skipped["set_aside_as"] else ""
            print(
                f"trackway: checkpoint {skipped['name']} set aside{where} ({skipped['reason']}); "
                f"resuming from {record['name'] or 'the start'}",
                file=sys.stderr, flush=True,
            )
        self._writer.event("checkpoint_restored", **record)

    def _last_committed_name(self) -> str | None:
        if self._checkpoints is None:
            return self.context.resume_from
        committed = [c for c in self._checkpoints.list() if c.state.value == "committed"]
        # The manager's parent is what it really resumed from (after any fallback), not what the launch expected.
        return committed[-1].name if committed else self._checkpoints.parent

    # -- ending ----------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once a preemption notice (SIGTERM or SIGUSR1) arrived: checkpoint, then `exit_preempted()`."""
        return self._notice is not None

    def _on_notice(self, signum: int) -> None:
        first = self._notice is None
        self._notice = signum
        if first:
            # Written from the signal handler on purpose: a notice is rare and must not be lost.
            self._writer.event("preemption_notice", signal=signal.Signals(signum).name, step=self._step)

    def note(self, reason: TerminationReason | str, message: str, **extra: Any) -> None:
        """Write the attempt's own termination note: the most trusted evidence of why it ends."""
        reason = TerminationReason(reason)
        payload = {"reason": reason.value, "message": message, "step": self._step, "rank": self.rank, "t": time.time(), **extra}
        try:
            write_json_atomic(self.context.spool_dir / NOTE_FILE, payload)
        except OSError as exc:
            # A full disk must not turn a clear ending into a traceback: the event below may still land.
            print(f"trackway: could not write the termination note: {exc}", file=sys.stderr, flush=True)
        self._writer.event("termination_note", **payload)

    def exit_preempted(self, code: int = EXIT_PREEMPTED) -> NoReturn:
        """End this attempt as preempted, after any checkpoint in flight is durable."""
        if self._checkpoints is not None:
            self._checkpoints.wait()
        name = self._last_committed_name()
        cause = signal.Signals(self._notice).name if self._notice else "exit_preempted()"
        self.note(
            TerminationReason.PREEMPTED,
            f"preemption notice ({cause}) at step {self._step}; resume from {name or 'the start (no checkpoint yet)'}",
        )
        self._close(TerminationReason.PREEMPTED, exit_code=code)
        sys.exit(code)

    def finish(self) -> None:
        """The script is done: wait for checkpoints, flush the spool, and (alone) record the end."""
        if self._checkpoints is not None:
            self._checkpoints.wait()
        if self._standalone is not None:
            self.note(TerminationReason.COMPLETED, f"run.finish() at step {self._step}")
        self._writer.event("finished", step=self._step)
        self._close(TerminationReason.COMPLETED, exit_code=0)
        if self._writer.points_lost:
            # A run whose curve has holes must not end as a clean completion: the script exits non-zero.
            raise SpoolPointsLost(self._writer.points_lost, str(self.context.spool_dir))

    def _on_uncaught(self, exc: BaseException) -> None:
        if self._closed:
            return
        if not isinstance(exc, NonFiniteLoss):
            reason = reason_for_exception(exc, made_progress=self._step is not None)
            self.note(reason, describe_exception(exc), exception=type(exc).__name__)
        self._close(None, exit_code=1)

    def _at_exit(self) -> None:
        if not self._closed:
            self._close(None, exit_code=None)

    def _close(self, reason: TerminationReason | None, exit_code: int | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._checkpoints is not None:
            try:
                self._checkpoints.close()
            except Exception as exc:  # noqa: BLE001 - a failed final save must not hide the real ending
                # Not silent: the log says it too (a full disk keeps its errno in the event).
                error = f"{type(exc).__name__}: {exc}"
                print(f"trackway: the last checkpoint save failed: {error}", file=sys.stderr, flush=True)
                self._writer.event("checkpoint_error", error=error, errno=getattr(exc, "errno", None))
        self._writer.close()
        if self._writer.points_lost and exit_code == 0:
            exit_code = 1  # alone, the standalone receipt must not say completed either
        restore_handlers(self._previous_handlers)
        if self._uninstall_excepthook is not None:
            self._uninstall_excepthook()
        atexit.unregister(self._at_exit)
        if self._standalone is not None:
            self._standalone.close(exit_code=exit_code)


def _heartbeat_interval(rank: int) -> float:
    if rank != 0:
        return float("inf")  # one heartbeat per attempt: rank 0's
    return float(os.environ.get("TRACKWAY_HEARTBEAT_S", "5"))


def _load_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def init(
    config: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    project: str | None = None,
    model_family: str | None = None,
    checkpoint_every_steps: int | None = None,
    checkpoint_every_minutes: float | None = None,
    log_all_ranks: bool = False,
    install_hooks: bool = True,
) -> Run:
    """Join the attempt trackway started for this process, or (run alone) record a new run and attempt."""
    context = AttemptContext.from_env()
    standalone = None
    if context is None:
        from trackway.sdk.standalone import StandaloneSession

        standalone = StandaloneSession.start(
            config=dict(config) if config is not None else None,
            name=name,
            project=project or "default",
            model_family=model_family,
        )
        context = standalone.context
    return Run(
        context,
        dict(config) if config is not None else None,
        checkpoint_every_steps=checkpoint_every_steps,
        checkpoint_every_minutes=checkpoint_every_minutes,
        log_all_ranks=log_all_ranks,
        install_hooks=install_hooks,
        standalone=standalone,
    )
