"""`trackway.init()` and the `Run` a training script holds: log, checkpoints, preemption notice, finish.

Inside an attempt started by trackway, `init()` joins it from the `TRACKWAY_*` environment.
Run alone (a laptop, a notebook), it records its own run and attempt in the ledger and ingests
its spool itself, so the same script works in both places.

A preemption notice (SIGTERM, SIGUSR1) is never swallowed. Its endings, by what the script does next:

    reads run.should_stop in time, then exit_preempted()     -> preempted (the script saved first)
    reads run.should_stop, then finish() or just exits       -> preempted: the work was cut short
    logs a second step without reading it                    -> preempted by trackway at that run.log
    neither, for $TRACKWAY_NOTICE_POLL_S (10 s)              -> preempted by trackway, from any call
    any notice after finish()                                -> ignored: nothing ends, nothing resumes
"""

from __future__ import annotations

import atexit
import json
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from trackway.sdk.context import AttemptContext
from trackway.sdk.cuda_memory import PeakRecorder
from trackway.sdk.exceptions import NonFiniteLoss, SpoolPointsLost
from trackway.sdk.hooks import (
    describe_exception,
    install_excepthook,
    install_notice_handlers,
    reason_for_exception,
    redeliver_notice,
    restore_handlers,
)
from trackway.sdk.writer import DEFAULT_LOSS_KEYS, LossKeys, SpoolWriter
from trackway.spool import NOTE_FILE, read_json, write_json_atomic
from trackway.taxonomy import TerminationReason

if TYPE_CHECKING:
    from trackway.checkpoints.manager import CheckpointManager
    from trackway.sdk.standalone import StandaloneSession

# EX_TEMPFAIL: "try again later", which is what a preempted attempt asks of its supervisor.
EXIT_PREEMPTED = 75
# How long a script has after a notice to read `run.should_stop` before the SDK ends the attempt
# itself: long enough for a slow training step to reach its poll, and a third of the 30 s grace
# executors give by default, so the forced ending (a checkpoint in flight, the note) fits in the rest.
NOTICE_POLL_S = 10.0
_NO_STEP = object()
_ALWAYS = -sys.maxsize - 1  # `Run._plain_below` when every `log` needs attention (no real step is below it)
_now = time.time


class Run:
    """One process's handle on its attempt."""

    def __init__(
        self,
        context: AttemptContext,
        config: dict[str, Any] | None = None,
        *,
        checkpoint_every_steps: int | None = None,
        checkpoint_every_minutes: float | None = None,
        log_all_ranks: bool = True,
        install_hooks: bool = True,
        standalone: StandaloneSession | None = None,
        loss_keys: str | None = None,
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
        self._is_loss = LossKeys(loss_keys or os.environ.get("TRACKWAY_LOSS_KEYS") or DEFAULT_LOSS_KEYS)
        self._writer = SpoolWriter(
            context.spool_dir,
            rank=context.rank,
            heartbeat_interval_s=_heartbeat_interval(),
            loss_keys=self._is_loss,
        )
        self._append = self._writer.queue.append
        self._writer.on_non_finite = self._attend
        # Each rank's own devices' peaks, on heartbeats and at the end (sdk/cuda_memory.py): calibration reads them.
        self._writer.on_heartbeat = PeakRecorder(self._writer.event)
        self._step: int | None = None
        self.max_steps = context.max_steps
        # Past this step, the test run has done what it was asked.
        self._stop_at = context.max_steps if context.max_steps is not None else sys.maxsize
        # One comparison per log call: below this step nothing needs attention, so `log` only appends.
        # A non-finite loss found, a notice not yet read or a rank that does not log lower it to _ALWAYS.
        self._plain_below = self._stop_at if self._logging else _ALWAYS
        self._reached_at: int | None = None  # the step at which max steps was reached
        self._notice: int | None = None
        self._notice_seen = False  # the script read `should_stop` after the notice: it handles it
        self._notice_step: Any = _NO_STEP  # the step of the first `log` after the notice
        self._notice_poll_s = _env_seconds("TRACKWAY_NOTICE_POLL_S", NOTICE_POLL_S)
        self._unanswered = False  # set by the watchdog: the next notice handler call ends the attempt
        self._noticed = threading.Event()  # wakes the watchdog (set from the handler: no thread starts there)
        self._done = threading.Event()  # finished or closed: the watchdog has nothing left to do
        self._ending = False
        self._finished = False
        self._closed = False
        self._previous_handlers: dict[int, Any] = {}
        self._uninstall_excepthook = None
        if install_hooks:
            self._previous_handlers = install_notice_handlers(self._on_notice)
            self._uninstall_excepthook = install_excepthook(self._on_uncaught)
        if self._previous_handlers:
            threading.Thread(target=self._watch_notice, name="trackway-notice", daemon=True).start()
        atexit.register(self._at_exit)
        self._writer.event("started", pid=os.getpid(), resume_from=context.resume_from, world_size=context.world_size)
        if config and standalone is None and context.rank == 0:
            # Under `trackway submit` the receipt holds the submitted config; the ingester merges this into it.
            self._writer.event("init_config", config=_json_safe(config))

    # -- logging ---------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record scalar metrics at `step` (default: the last step + 1). Never blocks on I/O.

        A non-finite value under a key naming a loss (`loss`, `*_loss`, `*/loss`, and `grad_norm`;
        `init(loss_keys=REGEX)` or $TRACKWAY_LOSS_KEYS to change) ends the attempt as nan_loss:
        NonFiniteLoss, naming that step, is raised by the first `log` after the writer thread met
        it (within a flush interval, 0.25 s), and at the latest by the next checkpoint save,
        `finish()` or `exit_preempted()`, which check everything logged before them first. So no
        checkpoint saved after a non-finite loss is ever committed.
        """
        if step is None:
            step = 0 if self._step is None else self._step + 1
        elif step.__class__ is not int:
            step = _step_number(step)
        self._step = step
        if step < self._plain_below:
            # No per-value work here: checking five floats in Python costs more than the rest of
            # the call. The writer checks every value of a loss key in C loops, tensors included.
            # A copy: a script may reuse its dict for the next step before the writer reads this one.
            self._append((step, _now(), metrics.copy() if metrics.__class__ is dict else dict(metrics)))
        else:
            self._log_attended(step, metrics)

    def _log_attended(self, step: int, metrics: Mapping[str, Any]) -> None:
        """`log` off its plain path: max steps reached, a non-finite loss found, a notice unread, or a rank that does not log."""
        if step >= self._stop_at:
            self._at_max_steps(step)
        if self._logging:
            if self._writer.non_finite is not None:
                self._non_finite(*self._writer.non_finite)
            self._append((step, _now(), metrics.copy() if metrics.__class__ is dict else dict(metrics)))
        else:
            self._writer.progress(step, _now())  # its heartbeat still says how far this rank got
        if self._notice is not None and not self._notice_seen:
            self._logged_after_notice(step)
        self._plain_below = self._stop_at if self._logging else _ALWAYS
        # Read after that store: a notice (a signal handler) or a non-finite loss (the writer's thread) that
        # came just before it is seen here; one that comes after it lowers the bound again itself (`_attend`).
        if (self._notice is not None and not self._notice_seen) or self._writer.non_finite is not None:
            self._plain_below = _ALWAYS

    def _attend(self) -> None:
        """The next `log` takes the attended path (called by the writer's thread, and for a notice)."""
        self._plain_below = _ALWAYS

    def _at_max_steps(self, step: int) -> None:
        """The first step at or past a test run's max steps turns `should_stop` true; a later step ends the attempt."""
        if self._reached_at is None:
            self._reached_at = step
            return
        if step > self._reached_at:
            print(f"trackway: step {step} is past this test run's max steps ({self.max_steps}) and the script did "
                  "not stop: ending it as completed", file=sys.stderr, flush=True)
            self._end_at_max_steps()

    def _end_at_max_steps(self) -> NoReturn:
        self._writer.event("max_steps_reached", step=self._step, max_steps=self.max_steps)
        self.finish()
        sys.exit(0)

    def _logged_non_finite(self) -> tuple[str, float, int] | None:
        """Everything logged so far, checked now rather than on the writer's next pass: (key, value, step) or None."""
        if not self._logging:
            return None
        self._writer.flush()
        return self._writer.non_finite

    def _raise_if_non_finite(self) -> None:
        """Before a checkpoint commits or the attempt ends: a loss that went non-finite ends it as nan_loss."""
        found = self._logged_non_finite()
        if found is not None:
            self._non_finite(*found)

    def _non_finite(self, key: str, value: Any, step: int) -> NoReturn:
        self._note_non_finite(key, value, step)
        raise NonFiniteLoss(key, float(value), step)

    def _note_non_finite(self, key: str, value: Any, step: int, then: str | None = None) -> None:
        self._writer.non_finite = None
        last = self._last_committed_name()
        hint = f"; last good checkpoint: {last}" if last else "; no checkpoint committed yet"
        after = f"; then the script raised {then}" if then else ""
        self.note(TerminationReason.NAN_LOSS, f"non-finite {key} = {value} at step {step}{hint}{after}", step=step,
                  key=key)

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
                remote_url=self.context.checkpoint_url,
                on_upload=self._on_upload,
                on_round_trip=self._on_round_trip if self.context.restore_check and self.rank == 0 else None,
                before_save=self._raise_if_non_finite,
            )
        return self._checkpoints

    def _on_round_trip(self, said: dict[str, Any]) -> None:
        """The test run's first checkpoint, read back from storage: the experiment's gate reads this event."""
        if not said["ok"]:
            print(f"trackway: checkpoint {said['name']} read back from storage: {said['problem']}",
                  file=sys.stderr, flush=True)
        self._writer.event("restore_check", **said)

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

    def _on_upload(self, remote, seconds: float) -> None:
        """Called on the uploader's thread once the checkpoint's marker is up in the remote store."""
        self._writer.event(
            "checkpoint_uploaded",
            step=remote.step,
            name=remote.name,
            url=remote.url,
            size_bytes=remote.size_bytes,
            uploaded_at=remote.committed_at.isoformat() if remote.committed_at else None,
            seconds=round(seconds, 3),
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
        """True once a preemption notice (SIGTERM or SIGUSR1) arrived: checkpoint, then `exit_preempted()`.

        Reading it is how the script says it handles the notice. One that has not read it within
        $TRACKWAY_NOTICE_POLL_S seconds (default 10), or that logs a second step after the notice
        without reading it, is ended by trackway as preempted (exit code 75, after any checkpoint in
        flight), rather than training on until the executor's SIGKILL.

        Also true once a test run (`TRACKWAY_MAX_STEPS`) logged its last step: the script saves and
        calls `exit_preempted()` as for a notice, and the attempt ends completed.
        """
        if self._notice is None:
            return self._reached_at is not None
        self._notice_seen = True
        return True

    def _on_notice(self, signum: int) -> None:
        if self._finished or self._closed or self._ending:
            return  # the work is done (or ending): a notice now ends nothing and resumes nothing
        if self._unanswered and not self._notice_seen:
            self._end_unanswered(f"did not read run.should_stop within {self._notice_poll_s:g} s")
        if self._notice is None:
            self._notice = signum
            self._attend()
            # Written from the signal handler on purpose: a notice is rare and must not be lost.
            self._writer.event("preemption_notice", signal=signal.Signals(signum).name, step=self._step)
            self._noticed.set()

    def _logged_after_notice(self, step: int) -> None:
        # The step under way when the notice came may still be polled after its log; a second one will not be.
        if self._notice_step is _NO_STEP:
            self._notice_step = step
        elif step != self._notice_step:
            self._end_unanswered(f"logged step {step} without reading run.should_stop")

    def _watch_notice(self) -> None:
        """Off the main thread: end an attempt whose script has not read `should_stop` in time after a notice."""
        self._noticed.wait()
        if self._done.wait(self._notice_poll_s) or self._notice_seen:
            return
        self._unanswered = True
        # The handler, run in the main thread, ends the attempt there: checkpoints and finally blocks behave.
        redeliver_notice(self._notice)
        if self._done.wait(self._notice_poll_s) or self._ending:
            # Ended there (or waiting on a checkpoint in flight): the process is gone within a window, unless
            # the script swallowed the SystemExit and trains on, unrecorded.
            self._done.wait()
            time.sleep(self._notice_poll_s)
        elif self._notice_seen:
            return  # read at the last moment: the script handles it after all
        else:
            # The handler never ran (the main thread is stuck in native code): end the attempt from here.
            self._end_preempted(
                f"the script did not read run.should_stop within {self._notice_poll_s:g} s nor stop when told, "
                "so trackway ended the attempt", exit_code=EXIT_PREEMPTED, strict=False,
            )
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(EXIT_PREEMPTED)

    def _end_unanswered(self, why: str) -> NoReturn:
        print(f"trackway: the script {why} after a preemption notice; ending the attempt as preempted",
              file=sys.stderr, flush=True)
        self._end_preempted(f"the script {why}, so trackway ended the attempt", exit_code=EXIT_PREEMPTED)
        sys.exit(EXIT_PREEMPTED)

    def note(self, reason: TerminationReason | str, message: str, **extra: Any) -> None:
        """Write the attempt's own termination note: the most trusted evidence of why it ends."""
        self._note(reason, message, extra)

    def _note(self, reason: TerminationReason | str, message: str, extra: dict[str, Any], fsync: bool = True) -> None:
        """`note`; `fsync=False` when the spool is closed (and its files synced) right after, as in `finish()`."""
        reason = TerminationReason(reason)
        payload = {"reason": reason.value, "message": message, "step": self._step, "rank": self.rank, "t": time.time(), **extra}
        path = self.context.spool_dir / NOTE_FILE
        replace = True
        if self.context.world_size > 1:
            # One note per attempt, shared by its ranks. The first rank to end says why: what ends the others
            # (most often "connection closed by peer" in their next collective) is a consequence, kept in
            # their own event. Rank 0 may restate the same reason with its own step; no rank writes over
            # another's different reason.
            earlier = read_json(path)
            if earlier is None:
                replace = False  # the first: a rank that wrote in between keeps its word
            elif earlier.get("rank") != self.rank and not (self.rank == 0 and earlier.get("reason") == reason.value):
                self._writer.event("termination_note", fsync, **payload, superseded_by_rank=earlier.get("rank"))
                return
        try:
            if not write_json_atomic(path, payload, replace=replace):
                self._writer.event("termination_note", fsync, **payload,
                                   superseded_by_rank=(read_json(path) or {}).get("rank"))
                return
        except OSError as exc:
            # A full disk must not turn a clear ending into a traceback: the event below may still land.
            print(f"trackway: could not write the termination note: {exc}", file=sys.stderr, flush=True)
        self._writer.event("termination_note", fsync, **payload)

    def exit_preempted(self, code: int = EXIT_PREEMPTED) -> NoReturn:
        """End this attempt as preempted, after any checkpoint in flight is durable.

        When `should_stop` was true because a test run reached its max steps (and no notice came),
        the attempt did all it was asked: it ends completed, exit code 0.
        """
        self._raise_if_non_finite()  # a diverged run resumed would only diverge again
        if self._notice is None and self._reached_at is not None:
            self._end_at_max_steps()
        self._end_preempted(None, exit_code=code)
        sys.exit(code)

    def _end_preempted(self, forced: str | None, exit_code: int | None, strict: bool = True) -> None:
        """Write the preempted note and close; `forced` says why trackway ended it, not the script's exit_preempted().

        A checkpoint in flight is waited for first, so the note names it. Not `strict`: a failed save
        is told and the attempt still ends preempted (from the watchdog or at exit, nobody could catch it).
        """
        if self._closed:
            return
        self._ending = True
        if self._checkpoints is not None:
            try:
                self._checkpoints.wait()
            except Exception as exc:  # noqa: BLE001 - see the docstring
                if strict:
                    raise
                self._save_failed(exc)
        name = self._last_committed_name()
        cause = signal.Signals(self._notice).name if self._notice else "exit_preempted()"
        detail = f"; {forced}" if forced else ""
        self.note(
            TerminationReason.PREEMPTED,
            f"preemption notice ({cause}) "
            + (f"at step {self._step}" if self._step is not None else "before any step was logged")
            + f"{detail}; "
            f"resume from {name or 'the start (no checkpoint yet)'}",
            **({"ended_by": "trackway"} if forced else {}),
        )
        self._close(TerminationReason.PREEMPTED, exit_code=exit_code)

    def finish(self) -> None:
        """The script is done: wait for checkpoints, flush the spool, and (alone) record the end.

        After a preemption notice the attempt did not finish its work, whatever the loop thinks (a
        framework's own SIGTERM handling ends fit() early and the script goes on to `finish()`; a
        script saves on the notice and breaks out of its loop): `finish()` then ends the attempt as
        preempted, exit code 75, so it is resumed. An attempt that got a notice is never `completed`.
        After `finish()`, a notice is ignored: it ends nothing and resumes nothing.
        """
        if self._standalone is not None and not self._finished:
            self._standalone.finishing()  # its ingester takes the last flush as it lands
        if not self._finished:
            self._raise_if_non_finite()  # a loss that went non-finite in the last steps: nan_loss, never completed
        if self._notice is not None and not self._finished:
            self._end_preempted("run.finish() came after it, with the work cut short", exit_code=EXIT_PREEMPTED)
            sys.exit(EXIT_PREEMPTED)
        self._finished = True
        self._done.set()
        if self._checkpoints is not None:
            self._checkpoints.wait()
        # Not synced one by one: `_close` syncs the spool's files once, before anything waits on them.
        if self._standalone is not None:
            self._note(TerminationReason.COMPLETED, f"run.finish() at step {self._step}", {}, fsync=False)
        self._writer.event("finished", fsync=False, step=self._step)
        self._close(TerminationReason.COMPLETED, exit_code=0)
        if self._writer.points_lost:
            # A run whose curve has holes must not end as a clean completion: the script exits non-zero.
            raise SpoolPointsLost(self._writer.points_lost, str(self.context.spool_dir))

    def _on_uncaught(self, exc: BaseException) -> None:
        if self._closed:
            return
        found = self._logged_non_finite() if not isinstance(exc, NonFiniteLoss) else None
        if found is not None:
            # The loss went non-finite first; what the script raised after it (its own FloatingPointError,
            # a check that tripped on the NaN) is a consequence: the ending is the divergence's.
            self._note_non_finite(*found, then=describe_exception(exc))
        elif not isinstance(exc, NonFiniteLoss):
            reason = reason_for_exception(exc, made_progress=self._step is not None)
            if reason is TerminationReason.CODE_ERROR and self._notice is not None and not self._finished:
                # An unexplained error after a notice is most often its doing (a DataLoader worker it killed).
                self._end_preempted(f"then the script raised {describe_exception(exc)}", exit_code=1, strict=False)
                return
            self.note(reason, describe_exception(exc), exception=type(exc).__name__)
        self._close(None, exit_code=1)

    def _at_exit(self) -> None:
        if self._closed:
            return
        found = self._logged_non_finite() if not self._finished else None
        if found is not None:
            # The script exited without finish() after a loss went non-finite: nothing is left to raise into.
            print(f"trackway: non-finite {found[0]} = {found[1]} at step {found[2]}: ending the attempt as nan_loss",
                  file=sys.stderr, flush=True)
            self._note_non_finite(*found)
            self._close(None, exit_code=1)
        elif self._notice is not None and not self._finished:
            # Exit code 0 or not, an attempt that got a notice and never finished was cut short.
            self._end_preempted("the script exited without run.finish()", exit_code=None, strict=False)
        else:
            self._close(None, exit_code=None)

    def _close(self, reason: TerminationReason | None, exit_code: int | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._done.set()
        self._noticed.set()  # lets the watchdog thread return
        if self._checkpoints is not None:
            try:
                self._checkpoints.close()
            except Exception as exc:  # noqa: BLE001 - a failed final save must not hide the real ending
                self._save_failed(exc)
        self._writer.close()
        if self._writer.points_lost and exit_code == 0:
            exit_code = 1  # alone, the standalone receipt must not say completed either
        if not (self._finished and self._standalone is None):
            # Under `trackway submit` the handlers stay after finish(): SIGTERM's default action would
            # kill a finished process by a signal, which reads as a preemption and resumes the run.
            restore_handlers(self._previous_handlers)
        if self._uninstall_excepthook is not None:
            self._uninstall_excepthook()
        atexit.unregister(self._at_exit)
        if self._standalone is not None:
            self._standalone.close(exit_code=exit_code)

    def _save_failed(self, exc: Exception) -> None:
        # Not silent: the log says it too (a full disk keeps its errno in the event).
        error = f"{type(exc).__name__}: {exc}"
        print(f"trackway: the last checkpoint save failed: {error}", file=sys.stderr, flush=True)
        self._writer.event("checkpoint_error", error=error, errno=getattr(exc, "errno", None))


def _step_number(step: Any) -> int:
    """A step given as a numpy or torch integer, or as a float with no fraction, as an int; TypeError otherwise."""
    try:
        return operator.index(step)
    except TypeError:
        if isinstance(step, float) and step.is_integer():
            return int(step)
    raise TypeError(f"run.log(step={step!r}): a step is an integer")


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment; `default` when unset or not one."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _json_safe(node: Any) -> Any:
    """`node` as JSON can hold it: tables and lists kept, any other value that is not JSON as its repr."""
    if isinstance(node, Mapping):
        return {str(key): _json_safe(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_json_safe(value) for value in node]
    if node is None or isinstance(node, (str, bool, int, float)):
        return node
    return repr(node)


def _heartbeat_interval() -> float:
    # Every rank beats, each in its own file: the supervisor compares their steps to name a rank that stopped.
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
    log_all_ranks: bool = True,
    install_hooks: bool = True,
    loss_keys: str | None = None,
) -> Run:
    """Join the attempt trackway started for this process, or (run alone) record a new run and attempt.

    Every rank's `log` is kept as that rank's own series (read back with `--rank N`; rank 0's by
    default); `log_all_ranks=False` keeps only rank 0's, and the other ranks' heartbeats still say their step.

    `loss_keys`: a regular expression over whole metric keys whose non-finite values end the attempt
    as nan_loss, case-insensitive (default: $TRACKWAY_LOSS_KEYS, else `loss`, `*_loss`, `*/loss`, `grad_norm`).
    """
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
        loss_keys=loss_keys,
    )
