"""The control loop: each `tick()` polls the executors of unfinished attempts and records the ends it finds.

Recording an end is idempotent: the attempt row is updated only while it is not yet `ended`,
so two processes reconciling at once (a foreground `submit` and a `trackway runs`) record
each end exactly once.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from select import select as select_fds  # sqlalchemy's select is the other one here
from typing import Any, Protocol

from sqlalchemy import RowMapping, or_, select, update

from trackway.errors import InputError, LedgerError, TrackwayError
from trackway.executors.base import Executor, JobHandle, JobPhase, JobStatus
from trackway.executors.node_sampler import newest_sample
from trackway.executors.registry import get_executor
from trackway.ledger import Ledger
from trackway.ledger.event_kinds import PLACED_EVENT
from trackway.ledger.ingest import ingest_attempt, spool_dir_of, spool_offsets
from trackway.ledger.supervisor_events import QUEUED_EVENT, add_supervisor_event, set_supervisor_event
from trackway.ledger.metrics import recent_points
from trackway.ledger.registration import register_all_pending
from trackway.ledger.schema import attempt_events, attempts, runs
from trackway.ledger.records import active_attempts, resolve_run, unhanded_attempts, update_run
from trackway.settings import Settings
from trackway.supervisor import burst_split
from trackway.supervisor.endings import AttemptEnd, attempts_by_id, notices_without_finish, prepare_end, record_ends, runs_by_id
from trackway.supervisor.launch import run_secret_values, start_attempt
from trackway.supervisor.retry import due_retries
from trackway.supervisor.log_metrics import LogReport, NonFiniteLoss, ingest_log_metrics, logged_gpu_utilization
from trackway.supervisor.outside_checkpoints import OutsideCheckpoints
from trackway.supervisor.watchers import (
    ALWAYS_STOP,
    STOP_MARKER,
    GPU_UNDERUSED_DEFAULTS,
    gpu_underused,
    loss_trends,
    memory_growing,
    rank_positions,
    rank_stalled,
    stall_evidence,
)
from trackway.settings.run_watchers import for_run as watchers_for_run
from trackway.settings.windows import Window
from trackway.supervisor.node_samples import ingest_node_samples
from trackway.supervisor.trends import Points
from trackway.receipts.placement import gpu_utilization
from trackway.spool import fallback_dirs_present, read_heartbeats, read_json, write_json_atomic
from trackway.taxonomy import AttemptState, RunKind, RunState, TerminationReason

# A launch this old that never reached its executor was interrupted (submit waits ~10 s at most).
STALE_LAUNCH_S = 120
# A run queued this long without any attempt lost its submitter between recording the run and
# launching it (kill -9, a closed laptop): a supervisor launches attempt 1. Short, because
# `start_attempt(first=True)` makes a slow-but-alive submitter and a supervisor never both launch.
ORPHANED_RUN_S = 10
# Past this, a tick leaves the remaining attempts to the next one (each end costs a write).
TICK_BUDGET_S = 0.7
# Woken by an executor's word that a job ended, the next tick starts this long after the last one
# began, at the soonest: the ends of a burst are polled and recorded in batches, not one tick each.
MIN_TICK_GAP_S = 0.2
STOP_LOOK_S = 0.1  # how often a pause looks at its stop event (Supervisor.pause)
# How recent a logged `gpu_util` value must be to count as the GPUs' utilization now.
GPU_LOG_WINDOW_S = 300
GPU_STATE_FILE = "gpu-watch.json"  # since when every GPU read low, and the last logged reading (see _gpu_state)
# The newest loss points the trend watchers read: a window and the history its noise is measured on
# (supervisor/trends.py groups a long window's points, so more would change little and cost a read).
TREND_POINTS = 4000
LOG_TAIL_BYTES = 64 * 1024
LOG_TAIL_LINES = 200
# Ends recorded in one write transaction: a burst's first receipts are readable long before its last,
# and each batch's statements are one executemany each, not one per end. A batch's commit and its
# reads cost about as much for 1,000 ends as for 500, but its first receipt waits for all of them:
# the first batch is small, so that a burst's oldest ends are readable a moment after they are polled.
END_BATCH = 1000
FIRST_END_BATCH = 100


def read_log_tail(path: str | os.PathLike, max_bytes: int = LOG_TAIL_BYTES, max_lines: int = LOG_TAIL_LINES
                  ) -> list[str]:
    # os.open and one pread, not a buffered file object: a burst reads the tails of thousands of logs in a tick.
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return []
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, max_bytes), max(0, size - max_bytes))
    finally:
        os.close(fd)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line is cut mid-way
    return lines[-max_lines:]


def _drain(fd: int) -> None:
    """Read a wake-up descriptor empty (it is non-blocking)."""
    try:
        while os.read(fd, 4096):
            pass
    except OSError:  # BlockingIOError: empty now
        pass


def end_batches(ended: Sequence[tuple[Any, JobStatus]], size: int,
                first: int | None = None) -> Iterator[list[tuple[Any, JobStatus]]]:
    """The ends in order, in batches of `size` at most (the first of `first` at most), none holding two ends of one
    run: a run's second end opens the next batch, so that it is decided after the first is recorded."""
    todo = deque(ended)
    limit = size if first is None else first
    while todo:
        batch, deferred, runs_in = [], [], set()
        while todo and len(batch) < limit:
            attempt, status = todo.popleft()
            if attempt["run_id"] in runs_in:
                deferred.append((attempt, status))
            else:
                batch.append((attempt, status))
                runs_in.add(attempt["run_id"])
        todo.extendleft(reversed(deferred))
        limit = size
        yield batch


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off inside (and left as it was found): for a tick, which is bounded in time.

    A tick keeps what it reads alive until it ends: every unfinished attempt's row, each ended
    one's receipt. The collector, counting them as they are made, ran over them again and again:
    recording 10,000 ends, about 300 times (twice over everything the process holds), 0.3 s of a
    2.5 s burst; with 10,000 attempts running, 70–100 ms of every second, a full pass of 55–80 ms
    among them, which an end heard just then waited for. It found almost nothing (0–10 objects a
    pass): a tick's rows are freed as it returns, without ever having been counted as long-lived,
    and the few cycles it made are collected once the collector runs again after it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _EndsHeard:
    """Whether an executor said a job ended while this tick watches the running attempts (Executor.ended_signal).

    With thousands running, watching them takes a tick its whole budget (0.7 s for 10,000 here), tick
    after tick: an end announced meanwhile would wait for the rest of it. Looked at every
    LOOK_EVERY attempts once MIN_TICK_GAP_S has passed since the tick began (so that a burst is still
    taken a batch a tick); what it hears is drained here, so it cuts one tick short, not every one after.
    """

    LOOK_EVERY = 32

    def __init__(self, fds: list[int], tick_started: float) -> None:
        self._fds = fds
        self._from = tick_started + MIN_TICK_GAP_S
        self._looks = 0

    def now(self) -> bool:
        if not self._fds:
            return False
        self._looks += 1
        if self._looks % self.LOOK_EVERY or time.monotonic() < self._from:
            return False
        ready, _, _ = select_fds(self._fds, [], [], 0)
        for fd in ready:
            _drain(fd)
        return bool(ready)


def handle_of(attempt: RowMapping) -> JobHandle:
    return JobHandle(executor=attempt["executor"], job_id=attempt["executor_job_id"] or "", state_dir=Path(attempt["state_dir"]))


class Duty(Protocol):
    """Work a layer above the control loop asks of every tick (experiments moved on, notifications sent).

    The loop knows its duties only through this: `supervisor/` imports nothing from the packages
    that give them (trackway/supervision.py puts them together).
    """

    def tick(self, supervisor: Supervisor) -> Iterable[tuple[str, str]]:
        """Do this tick's share; return (attempt, what was noticed) lines for the live status."""

    def settle(self, timeout: float) -> None:
        """Finish what the ticks started (a message being sent) before the process exits."""


class Supervisor:
    """Drives attempts to their ends and writes each end into the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        settings: Settings,
        executor_for: Callable[[str], Executor] | None = None,
        duties: Sequence[Duty] = (),
    ):
        self.ledger = ledger
        self.settings = settings
        self._executors: dict[str, Executor] = {}
        self.tick_budget_s = TICK_BUDGET_S
        self.orphaned_run_s = ORPHANED_RUN_S
        self.findings: list[tuple[str, str]] = []  # (attempt, what a watcher noticed), for live status lines
        self._first_rss: dict[str, int | None] = {}
        self._samples_read: dict[str, tuple[str, int]] = {}  # attempt → (cursor, bytes) of its node samples stored
        self._gpu_measured: set[str] = set()  # attempts whose GPU utilization was read (`gpu_measured` recorded)
        self._queue_said: dict[str, str] = {}  # attempt → the queue's reason last recorded (Slurm PENDING's)
        self._cursor = ""  # the running attempt a time-bounded tick stopped at
        self._read_offsets: dict[str, dict[str, int]] = {}  # how far each running attempt's spool was read
        self._handles: dict[str, JobHandle] = {}  # each polled attempt's, made once: a tick polls every attempt
        # Each running run's own secret values, masked in what its events say. Fixed at submit (its
        # variables and command line), so read from its files once, not on every tick.
        self._secrets: dict[str, tuple[str, ...]] = {}
        self._run_watchers: dict[str, str | None] = {}  # each running run's own watcher thresholds, as stored
        self.backlog = False  # the last tick left ends or running attempts for the next one
        # Each running run's row as this supervisor first read it. Only what is set at submit is read from it
        # (its command, workdir, resource, policy, log patterns...): its state, approval and verdict move on.
        self._runs: dict[str, RowMapping] = {}
        self.outside_checkpoints = OutsideCheckpoints()
        self._executor_for = executor_for or (lambda name: get_executor(name, settings.home))
        self.duties = tuple(duties)
        self._resume_checked: set[str] = set()  # attempts whose first logged step was compared with their resume

    def executor(self, name: str) -> Executor:
        if name not in self._executors:
            self._executors[name] = self._executor_for(name)
        return self._executors[name]

    def tick(self) -> list[AttemptEnd]:
        """One pass: poll every unfinished attempt and record those that ended."""
        with collector_paused():
            return self._tick()

    def _tick(self) -> list[AttemptEnd]:
        self.findings = []
        register_all_pending(self.ledger, self.settings.home)
        ends = self._recover_interrupted_launches()
        self._launch_orphaned_runs()
        with self.ledger.read() as conn:
            pending = [a for a in active_attempts(conn) if a["executor_job_id"]]
        live = {a["attempt_id"] for a in pending}
        self._read_offsets = {key: value for key, value in self._read_offsets.items() if key in live}
        self._handles = {key: value for key, value in self._handles.items() if key in live}
        running = {a["run_id"] for a in pending}
        self._secrets = {key: value for key, value in self._secrets.items() if key in running}
        self._runs = {key: value for key, value in self._runs.items() if key in running}
        self._run_watchers = {key: value for key, value in self._run_watchers.items() if key in running}
        # A tick is bounded in time. Every attempt is polled (a few file reads each), and every end
        # found is recorded first: a receipt and a retry are what people wait for, while ingesting and
        # watching the attempts still running can wait a tick. What the budget leaves undone is
        # the next tick's, started at once (`backlog`); running attempts are taken in turn from
        # where the last tick stopped, so that every one is watched.
        pending = [a for a in pending if a["attempt_id"] >= self._cursor] + [
            a for a in pending if a["attempt_id"] < self._cursor
        ]
        tick_started = time.monotonic()
        deadline = tick_started + self.tick_budget_s
        self.backlog = False
        polled = self._poll(pending)
        self._note_queue(polled)
        self._note_placements(polled)
        self._note_host_reach(polled)
        # The longest-ended first: a burst of ends (a node lost, a sweep failing at its first step)
        # is recorded oldest first, so none waits for the whole burst.
        ended = sorted(((attempt, status) for attempt, status in polled if status.phase.is_terminal()),
                       key=lambda pair: pair[1].ended_at.timestamp() if pair[1].ended_at else math.inf)
        ends += self._end_all(ended)
        self._cursor = ""
        watched = [attempt for attempt, status in polled if status.phase is JobPhase.RUNNING]  # a queued job: nothing yet
        ends_heard = _EndsHeard(self._ended_signals(), tick_started)
        fallbacks = fallback_dirs_present() if watched else None
        for number, attempt in enumerate(watched):
            if time.monotonic() > deadline or ends_heard.now():
                # Watching the rest can wait; an end an executor just announced is recorded by the next tick.
                self._cursor = attempt["attempt_id"]
                self.backlog = True
                break
            if number % END_BATCH == 0:
                # Attempts met for the first time (a supervisor started beside thousands) would each cost
                # their run's and their offsets' reads: read for the next many at once.
                self._read_all(watched[number:number + END_BATCH])
            report = ingest_attempt(self.ledger, attempt, self._read_offsets, self._run_secrets(attempt["run_id"]),
                                    fallbacks)
            run = self._run(attempt["run_id"])
            logged = self._ingest_log(attempt, run)
            self._watch(attempt, new_points=report.points > 0 or logged.points > 0, nan=logged.nan)
            self._note_resume_not_taken_up(attempt)
            self._look_at_checkpoint_paths(run, attempt)
        self.launch_due_retries(deadline)
        self.start_evaluations(deadline)
        for duty in self.duties:
            self.findings.extend(duty.tick(self))
        return ends

    def settle(self, timeout: float) -> None:
        """Let every duty finish what this process's ticks started (see `Duty.settle`)."""
        for duty in self.duties:
            duty.settle(timeout)

    def _poll(self, pending: list) -> list[tuple[Any, JobStatus]]:
        """Every attempt's status, asked of each executor once for all its jobs (one `squeue` per tick, not per job).

        An executor that cannot answer now (a Slurm controller that is down) leaves its attempts
        for the next tick: a job is never taken for ended because its queue did not answer.
        """
        by_executor: dict[str, list] = {}
        for attempt in pending:
            by_executor.setdefault(attempt["executor"], []).append(attempt)
        polled = []
        for name, group in by_executor.items():
            try:
                statuses = self.executor(name).poll_many([self._handle_of(attempt) for attempt in group])
            except TrackwayError as exc:
                self.findings.append((group[0]["attempt_id"], f"{name}: {exc}"))
                continue
            polled += [(attempt, statuses[attempt["executor_job_id"]]) for attempt in group
                       if attempt["executor_job_id"] in statuses]
        return polled

    def _handle_of(self, attempt: RowMapping) -> JobHandle:
        handle = self._handles.get(attempt["attempt_id"])
        if handle is None or handle.job_id != attempt["executor_job_id"] or handle.executor != attempt["executor"]:
            handle = self._handles[attempt["attempt_id"]] = handle_of(attempt)
        return handle

    def _note_queue(self, polled: list[tuple[Any, JobStatus]]) -> None:
        """An attempt the executor holds in its queue is `queued` (its run too), with the queue's reason; `running`
        once the executor says it started.

        A run whose attempt waits is queued, as one waiting for its retry is: nothing of it runs yet, and
        every launch path passes over a run with an unfinished attempt.
        """
        moved = [(attempt, status) for attempt, status in polled
                 if (status.phase is JobPhase.QUEUED and attempt["state"] != AttemptState.QUEUED.value)
                 or (status.phase is JobPhase.RUNNING and attempt["state"] == AttemptState.QUEUED.value)
                 or (status.phase is JobPhase.QUEUED and status.evidence
                     and self._queue_said.get(attempt["attempt_id"]) != status.evidence[0])]
        if not moved:
            return
        with self.ledger.write() as conn:
            for attempt, status in moved:
                queued = status.phase is JobPhase.QUEUED
                state = AttemptState.QUEUED if queued else AttemptState.RUNNING
                was, now = ((RunState.RUNNING, RunState.QUEUED) if queued else (RunState.QUEUED, RunState.RUNNING))
                if attempt["state"] != state.value:
                    conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"],
                                                        attempts.c.state != AttemptState.ENDED.value)
                                 .values(state=state.value))
                    conn.execute(update(runs).where(runs.c.run_id == attempt["run_id"], runs.c.state == was.value)
                                 .values(state=now.value))
                if queued and status.evidence:
                    set_supervisor_event(conn, attempt["attempt_id"], QUEUED_EVENT, {"message": status.evidence[0]})
                    self._queue_said[attempt["attempt_id"]] = status.evidence[0]
                else:
                    self._queue_said.pop(attempt["attempt_id"], None)

    def _note_placements(self, polled: list[tuple[Any, JobStatus]]) -> None:
        """Where a queued job started (its node, its GPUs), recorded once its executor knows it."""
        # Only once the command runs ("host" known) or the job ended: before that the GPUs are not known yet.
        # A gang (SSH over several hosts) knows its first host at submit: its nodes are noted at its end.
        changed = [(attempt, status) for attempt, status in polled
                   if status.placement and ((not attempt["host"]
                                             and ("host" in status.placement or status.phase.is_terminal()))
                                            or ("nodes" in status.placement and status.phase.is_terminal()))]
        if not changed:
            return
        with self.ledger.write() as conn:
            for attempt, status in changed:
                where = status.placement
                gpus = [str(gpu) for gpu in where.get("gpu_ids") or []]
                values = {"host": where.get("host") or where.get("node_list")}
                if gpus:
                    values |= {"gpu_ids": ",".join(gpus), "gpu_count": len(gpus)}
                if status.started_at is not None:
                    values["started_at"] = status.started_at
                conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(**values))
                add_supervisor_event(conn, attempt["attempt_id"], PLACED_EVENT, where)

    def _note_host_reach(self, polled: list[tuple[Any, JobStatus]]) -> None:
        """A host that stopped answering, and one that answered again with the job still running (SSH).

        Recorded once each per attempt, as watcher lines: `explain` and `show` say "unreachable since".
        """
        noted = []
        for attempt, status in polled:
            if status.phase is not JobPhase.RUNNING or not status.evidence:
                continue
            if (status.placement or {}).get("unreachable_since"):
                noted.append((attempt, "host_unreachable", status.evidence[0]))
            elif any("adopted" in line for line in status.evidence):
                noted.append((attempt, "host_answered_again", "; ".join(status.evidence)))
        if not noted:
            return
        with self.ledger.write() as conn:
            for attempt, kind, message in noted:
                if add_supervisor_event(conn, attempt["attempt_id"], kind, {"message": message}):
                    self.findings.append((attempt["attempt_id"], message))

    def _end_all(self, ended: list[tuple[Any, JobStatus]]) -> list[AttemptEnd]:
        """Record the ends its executors report, oldest first, in batches: each batch's receipts in one transaction.

        Every end polled, whatever the tick's budget: leaving some to the next tick would make them
        wait for its reads and its poll of every attempt again, the most of a tick's cost in a burst,
        while each batch committed is readable at once. One end per run in a batch: a second end of
        one run waits for the next batch, decided after the first. An attempt whose end cannot be
        prepared (its files unreadable, a bug) leaves the others to be recorded, and is raised after them.
        A burst of thousands is recorded in two processes where a second core is there (supervisor/burst_split.py).
        """
        if burst_split.worth_splitting(len(ended), self.ledger):
            ends, failure = self._end_in_two(ended)
        else:
            ends, failure = self._end_these(ended)
        if failure is not None:
            raise failure
        return ends

    def _end_these(self, ended: list[tuple[Any, JobStatus]]) -> tuple[list[AttemptEnd], Exception | None]:
        """`_end_all` in this process: the ends recorded, and the first error met (a ledger's failure is raised)."""
        ends: list[AttemptEnd] = []
        failure: Exception | None = None
        # A burst: SQLite's checkpoint waits for its last batch instead of delaying the next one's receipts.
        burst = len(ended) > FIRST_END_BATCH
        with self.ledger.checkpoints_after() if burst else contextlib.nullcontext():
            for batch in end_batches(ended, END_BATCH, first=FIRST_END_BATCH):
                prepared = []
                for attempt, status, note, run, notice in self._gathered(batch):
                    try:
                        prepared.append(prepare_end(self.ledger, self.settings, attempt, status, note, run,
                                                    self._run_secrets(run["run_id"]), notice,
                                                    read_log_tail(attempt["log_path"])))
                    except Exception as exc:  # noqa: BLE001 - raised once the others are recorded
                        failure = failure or exc
                try:
                    ends += record_ends(self.ledger, self.settings, prepared)
                except LedgerError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the others were recorded (see endings.record_ends)
                    failure = failure or exc
        return ends, failure

    def _end_in_two(self, ended: list[tuple[Any, JobStatus]]) -> tuple[list[AttemptEnd], Exception | None]:
        """`_end_these` over every other run's ends, a forked child's over the rest (supervisor/burst_split.py)."""
        mine, theirs = burst_split.by_run(ended)
        if not theirs:  # the ends of one run: a batch at a time, in order, in this process
            return self._end_these(ended)
        found = len(self.findings)

        def their_part() -> burst_split.Answer:
            try:
                return burst_split.Answer(*self._end_these(theirs), self.findings[found:])
            except Exception as exc:  # noqa: BLE001 - the ledger's failure: raised by the parent
                return burst_split.Answer([], exc, self.findings[found:])

        try:
            helper = burst_split.Helper(their_part, self.ledger)
        except OSError:  # no fork now (out of memory, of processes): one process records them all
            return self._end_these(ended)
        try:
            ends, failure = self._end_these(mine)
        finally:
            answer = helper.answer()  # waited for whatever this process met: the child writes to the same ledger
            for attempt, _ in theirs:  # what the child forgot of the attempts it ended, forgotten here too
                self.outside_checkpoints.forget(attempt["attempt_id"])
                self._resume_checked.discard(attempt["attempt_id"])
        if answer is None:
            self.findings.append((theirs[0][0]["attempt_id"], (
                f"the child recording {len(theirs)} of this burst's ends (pid {helper.pid}) ended without an answer "
                f"({helper.ended_how}): the receipts it committed are in the ledger, the next tick records the rest")))
            return ends, failure
        self.findings += answer.findings
        return ends + answer.ends, failure or answer.failure

    def _gathered(self, batch: list[tuple[Any, JobStatus]]) -> list[tuple[Any, JobStatus, dict | None, dict, bool]]:
        """What each ended attempt wrote last brought in, then its row and its notice read, for all at once.

        (attempt as it is now, status, the SDK's note, run as first read, a preemption notice without `finish()`).
        """
        self._read_all([attempt for attempt, _ in batch])
        # Listed after the poll: an attempt seen ended has made every fallback directory it will.
        fallbacks = fallback_dirs_present()
        noted = []
        for attempt, status in batch:
            # Ingest after polling: an attempt seen ended has written all it will write.
            report = ingest_attempt(self.ledger, attempt, self._read_offsets, self._run_secrets(attempt["run_id"]),
                                    fallbacks)
            run = self._run(attempt["run_id"])
            logged = self._ingest_log(attempt, run)
            if logged.nan is not None:
                # It ended before a tick saw the NaN (exit 0 included): the end is the NaN's, not `completed`.
                self._mark_stop(attempt, "nan_in_log", logged.nan.why(), at=logged.nan.at)
            self._note_resume_not_taken_up(attempt)
            self._look_at_checkpoint_paths(run, attempt, final=True, exit_code=status.exit_code)
            self.outside_checkpoints.forget(attempt["attempt_id"])
            self._resume_checked.discard(attempt["attempt_id"])
            noted.append((attempt, status, report.note))
        ids = [attempt["attempt_id"] for attempt, _ in batch]
        with self.ledger.read() as conn:
            now = attempts_by_id(conn, ids)
            notices = notices_without_finish(conn, [attempt["attempt_id"] for attempt, status in batch
                                                    if status.exit_code == 0])
        # The runs as read when first met: what an end reads of its run is set at submit (see `_runs`).
        return [(now[attempt["attempt_id"]], status, note, self._run(attempt["run_id"]), attempt["attempt_id"] in notices)
                for attempt, status, note in noted if attempt["attempt_id"] in now]

    def _read_all(self, batch: list[RowMapping]) -> None:
        """Fill, in one read, the per-run and per-attempt caches that ingesting, watching and recording ends read
        one by one."""
        run_ids = {attempt["run_id"] for attempt in batch}
        unread = [attempt["attempt_id"] for attempt in batch if attempt["attempt_id"] not in self._read_offsets]
        if not unread and run_ids <= self._secrets.keys() and run_ids <= self._runs.keys():
            return
        with self.ledger.read() as conn:
            found = runs_by_id(conn, run_ids - (self._secrets.keys() & self._runs.keys()))
            descriptions: dict = {}
            for run_id, run in found.items():
                if run_id not in self._secrets:
                    self._secrets[run_id] = run_secret_values(conn, self.settings, run, descriptions)
                self._runs.setdefault(run_id, run)
            self._read_offsets.update(spool_offsets(conn, unread))

    def start_evaluations(self, deadline: float | None = None) -> list[str]:
        """Request the evaluations new checkpoints call for, then start queued evaluation seeds.

        At most `[evals] max_running` evaluation attempts run at once, so evaluators queue
        behind each other instead of crowding out the training they evaluate.
        """
        from trackway.evals.launch import evaluate_new_checkpoints
        from trackway.evals.records import queued_eval_runs, running_eval_attempts

        requests, problems = evaluate_new_checkpoints(self.ledger, self.settings)
        if problems:
            with self.ledger.write() as conn:
                for attempt_id, message in problems:
                    if "/" in attempt_id and add_supervisor_event(conn, attempt_id, "eval_not_started", {"message": message}):
                        self.findings.append((attempt_id, message))
        with self.ledger.read() as conn:
            room = self.settings.eval_max_running - running_eval_attempts(conn)
            queued = queued_eval_runs(conn, limit=max(room, 0))
        started: list[str] = []
        for run_id, executor in queued:
            if started and deadline is not None and time.monotonic() > deadline:
                break
            try:
                attempt_id = start_attempt(self.ledger, self.settings, run_id, self.executor(executor), from_queue=True)
            except TrackwayError:
                continue  # recorded on the attempt by start_attempt
            if attempt_id is not None:
                started.append(attempt_id)
        return started

    def launch_due_retries(self, deadline: float | None = None) -> list[str]:
        """Start the next attempt of runs whose retry is due (at least one, then until `deadline`)."""
        with self.ledger.read() as conn:
            due = due_retries(conn, datetime.now(timezone.utc))
        started: list[str] = []
        for run_id in due:
            if started and deadline is not None and time.monotonic() > deadline:
                break
            with self.ledger.read() as conn:
                executor = resolve_run(conn, run_id)["executor"]
            try:
                attempt_id = start_attempt(self.ledger, self.settings, run_id, self.executor(executor), from_queue=True)
            except TrackwayError as exc:
                # Recorded on the attempt by start_attempt when one was made. Before that (the run's
                # checkpoint store does not answer), the run stays queued for the next tick: said here.
                self.findings.append((run_id, f"retry not started yet: {exc}"))
                continue
            if attempt_id is not None:
                started.append(attempt_id)
        return started

    def run(
        self,
        should_stop: Callable[[], bool],
        interval_s: float = 1.0,
        on_ends: Callable[[list[AttemptEnd]], None] | None = None,
    ) -> None:
        """Tick until `should_stop()`, handing each tick's ends to `on_ends`; a tick starts every `interval_s`.

        Start to start, not a pause after each tick: with hundreds of attempts running a tick
        takes a few hundred milliseconds, and an end that came just after one tick's poll must not
        wait that long again on top of the interval before the next one records it. An executor
        that says when a job ended (the local one) starts the next tick sooner (see `pause`).
        """
        while not should_stop():
            started = time.monotonic()
            ends = self.tick()
            if on_ends is not None:
                on_ends(ends)
            if not self.backlog and not should_stop():
                self.pause(started, interval_s)

    def pause(self, started: float, interval_s: float, stop: threading.Event | None = None) -> None:
        """Wait for the next tick, due `interval_s` after this one `started` (time.monotonic()): sooner when an
        executor says one of its jobs ended (Executor.ended_signal), though never less than MIN_TICK_GAP_S after
        `started`, so that a burst of ends is taken a batch a tick. Returns as soon as `stop` is set.
        """
        signals = self._ended_signals()
        due = started + interval_s
        if not signals:
            left = max(0.0, due - time.monotonic())
            if stop is None:
                time.sleep(left)
            else:
                stop.wait(left)
            return
        while (left := due - time.monotonic()) > 0:
            if stop is not None and stop.is_set():
                return
            # Stop is looked at every STOP_LOOK_S at least: a signal handler sets it, and select() is
            # not woken by that.
            ready, _, _ = select_fds(signals, [], [], left if stop is None else min(left, STOP_LOOK_S))
            if ready:
                for fd in ready:
                    _drain(fd)
                due = min(due, started + MIN_TICK_GAP_S)

    def _ended_signals(self) -> list[int]:
        """The descriptors of the executors in use that say when a job ended (Executor.ended_signal)."""
        return [fd for fd in (executor.ended_signal() for executor in self._executors.values()) if fd is not None]

    def cancel(self, run_ref: str) -> list[str]:
        """Ask the executors to end every unfinished attempt of a run; return their ids.

        The ends themselves are recorded by a later tick, as `user_cancelled`, once the
        executor reports them (after the grace period at the latest).
        """
        with self.ledger.read() as conn:
            run = resolve_run(conn, run_ref)
            live = [a for a in active_attempts(conn) if a["run_id"] == run["run_id"]]
        if RunState(run["state"]).is_terminal():
            raise InputError(f"run {run_ref!r}: already {run['state']}; nothing to cancel")
        for attempt in live:
            if attempt["executor_job_id"]:
                self.executor(attempt["executor"]).cancel(handle_of(attempt))
        if not live:
            with self.ledger.write() as conn:
                update_run(
                    conn,
                    run["run_id"],
                    state=RunState.CANCELLED.value,
                    termination_reason=TerminationReason.USER_CANCELLED.value,
                    ended_at=datetime.now(timezone.utc),
                )
        return [a["attempt_id"] for a in live]

    def _launch_orphaned_runs(self) -> list[str]:
        """Start attempt 1 of training runs whose submitter died after recording them."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=self.orphaned_run_s)
        with self.ledger.read() as conn:
            orphans = orphaned_runs(conn, cutoff)
        started = []
        for run_id, executor in orphans:
            try:
                attempt_id = start_attempt(
                    self.ledger, self.settings, run_id, self.executor(executor), first=True,
                    started_by="supervisor: its submitter died before launching attempt 1",
                    code_from="receipt",  # the work tree may have changed since the submit
                )
            except TrackwayError:
                continue  # recorded on the attempt by start_attempt
            if attempt_id is not None:
                started.append(attempt_id)
        return started

    def _recover_interrupted_launches(self) -> list[AttemptEnd]:
        """Attempts recorded but never handed over (the launching process died): adopt the job, or end them."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=STALE_LAUNCH_S)
        with self.ledger.read() as conn:
            stale = [a for a in unhanded_attempts(conn) if a["started_at"] is not None and a["started_at"] < cutoff]
        ends = []
        for attempt in stale:
            try:
                adopted = self.executor(attempt["executor"]).adopt(Path(attempt["state_dir"]))
            except TrackwayError as exc:
                # Its queue did not answer (a Slurm controller down): ending the attempt now could start a
                # retry beside a job that is queued after all. Asked again next tick.
                self.findings.append((attempt["attempt_id"], f"{attempt['executor']}: {exc}"))
                continue
            if adopted is not None:
                with self.ledger.write() as conn:
                    conn.execute(
                        update(attempts)
                        .where(attempts.c.attempt_id == attempt["attempt_id"], attempts.c.executor_job_id.is_(None))
                        .values(
                            state=AttemptState.RUNNING.value,
                            executor_job_id=adopted.handle.job_id,
                            host=adopted.host,
                            started_at=adopted.started_at,
                        )
                    )
                continue
            status = JobStatus(
                phase=JobPhase.VANISHED,
                evidence=(f"the launch was interrupted: the process starting {attempt['attempt_id']} died "
                          "before the executor took it",),
            )
            end = self._record_end(attempt, status, None)
            if end is not None:
                ends.append(end)
        return ends

    def _run(self, run_id: str) -> RowMapping:
        """The run as this supervisor first read it (see `_runs`: what is set at submit), read once."""
        if run_id not in self._runs:
            with self.ledger.read() as conn:
                self._runs[run_id] = runs_by_id(conn, [run_id])[run_id]
        return self._runs[run_id]

    def _ingest_log(self, attempt: RowMapping, run: RowMapping) -> LogReport:
        """Metrics from the run's log patterns (a script without the SDK); never stops the tick."""
        if not run["log_patterns"]:
            return LogReport()
        import json

        try:
            return ingest_log_metrics(self.ledger, attempt, json.loads(run["log_patterns"]))
        except (OSError, ValueError, InputError) as exc:
            self._note_once(attempt, "log_metrics_failed", f"reading metrics from {attempt['log_path']}: {exc}")
            return LogReport()

    def _look_at_checkpoint_paths(self, run: RowMapping, attempt: RowMapping, final: bool = False,
                                  exit_code: int | None = None) -> None:
        """Commit what the run's declared checkpoint paths hold once complete (supervisor/outside_checkpoints.py)."""
        if not run["checkpoint_paths"]:
            return
        try:
            info = self.outside_checkpoints.look(
                self.ledger, self.settings.runs_dir, run, attempt, final=final, exit_code=exit_code
            )
        except (OSError, TrackwayError) as exc:
            self._note_once(attempt, "checkpoint_path_failed", f"committing the declared checkpoint path: {exc}")
            return
        if info is not None:
            self.findings.append((attempt["attempt_id"], f"committed {info.name} from the declared checkpoint path"))

    def _note_resume_not_taken_up(self, attempt: RowMapping) -> None:
        """An attempt given a checkpoint whose script then logged a step before it started from scratch: said once.

        trackway can restore a checkpoint; whether the script reads it is the script's (nanoGPT resumes
        only with init_from=resume). The receipt's `resumed_from_checkpoint` is what was offered; this
        says when the logs show it was not taken up.
        """
        offered = attempt["resumed_from_checkpoint"]
        if not offered or attempt["attempt_id"] in self._resume_checked:
            return
        match = re.fullmatch(r"step-(\d+)", offered)
        with self.ledger.read() as conn:
            first = conn.execute(select(attempts.c.first_step).where(
                attempts.c.attempt_id == attempt["attempt_id"])).scalar()
        if first is None or match is None:
            return
        self._resume_checked.add(attempt["attempt_id"])
        step = int(match[1])
        if first >= step:
            return
        self._note_once(attempt, "resume_not_taken_up", (
            f"resume not taken up: trackway gave this attempt {offered}, but the script's first logged step was "
            f"{first}, before the checkpoint's step {step}: it started over rather than from the checkpoint "
            "(does it need a resume flag, such as nanoGPT's init_from=resume, or `{resume_from}` in its command?)"))

    def _note_once(self, attempt: RowMapping, kind: str, message: str) -> None:
        with self.ledger.write() as conn:
            if add_supervisor_event(conn, attempt["attempt_id"], kind, {"message": message}):
                self.findings.append((attempt["attempt_id"], message))

    def _mark_stop(self, attempt: RowMapping, kind: str, why: str, at: float | None = None) -> bool:
        """Write the stop marker (unless one is there); True if this call wrote it. `at`: when what it saw happened."""
        marker = Path(attempt["state_dir"]) / STOP_MARKER
        if marker.exists():
            return False
        write_json_atomic(marker, {"t": time.time(), "kind": kind, "why": why, "at": at})
        with self.ledger.write() as conn:
            add_supervisor_event(conn, attempt["attempt_id"], kind, {"message": why})
        return True

    def _watch(self, attempt: RowMapping, new_points: bool, nan: NonFiniteLoss | None = None) -> None:
        """Run the watchers over a live attempt: record each finding once per kind as an event, and end
        the attempt when it stalled, its log showed a non-finite loss, or a finding's kind is in
        `[supervisor] stop_on` (marked first, so its end is classified by what the watcher saw, not as
        a cancel)."""
        beats = read_heartbeats(spool_dir_of(attempt))  # every rank's, by rank
        heartbeat = beats.get(0)
        findings = self._trend_findings(attempt, heartbeat, new_points)
        marker = Path(attempt["state_dir"]) / STOP_MARKER
        nan_marked = False
        if nan is not None:
            findings.insert(0, ("nan_in_log", nan.why()))
            if not marker.exists():
                # With the line's time, before the checkpoint look: a declared checkpoint written after the
                # loss went non-finite is never committed (supervisor/outside_checkpoints.py).
                write_json_atomic(marker, {"t": time.time(), "kind": "nan_in_log", "why": nan.why(), "at": nan.at})
                nan_marked = True
        if attempt["started_at"] is not None:
            now = time.time()
            why = stall_evidence(heartbeat, attempt["started_at"].timestamp(), now, self.settings.stall_seconds)
            if why is not None:
                where = rank_positions(beats, now)  # which rank the others wait for, when several ran
                findings.append(("stalled", f"{why}; {where}" if where else why))
            elif (behind := rank_stalled(beats, now, self.settings.stall_seconds / 2)) is not None:
                findings.append(("rank_stalled", behind))
        stop = None
        if findings:
            with self.ledger.write() as conn:
                for kind, message in findings:
                    if add_supervisor_event(conn, attempt["attempt_id"], kind, {"message": message}):
                        self.findings.append((attempt["attempt_id"], message))
                    if stop is None and (kind in ALWAYS_STOP or kind in self.settings.stop_on):
                        stop = (kind, message)
        if stop is not None and (not marker.exists() or (nan_marked and stop[0] == "nan_in_log")):
            if not marker.exists():
                write_json_atomic(marker, {"t": time.time(), "kind": stop[0], "why": stop[1]})
            self.findings.append((attempt["attempt_id"], f"ending it ({stop[0]}): {stop[1]}"))
            self.executor(attempt["executor"]).cancel(handle_of(attempt))

    def _trend_findings(self, attempt: RowMapping, heartbeat: dict | None, new_points: bool) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        # The shim's sample covers the attempt's whole process tree (data loader workers, ranks) and every script;
        # the SDK's heartbeat, its own process. The starting value is taken once training stepped: loading a
        # model is not a leak.
        ingest_node_samples(self.ledger, attempt, self._samples_read)
        sample = newest_sample(spool_dir_of(attempt))
        rss = (sample or {}).get("rss_bytes") or (heartbeat or {}).get("rss_bytes")
        stepping = (heartbeat or {}).get("step") is not None or attempt["first_step"] is not None
        baseline = self._rss_baseline(attempt, rss if stepping else None)
        if (message := memory_growing(baseline, rss)) is not None:
            found.append(("memory_growing", message))
        # The shim's nvidia-smi reading on the attempt's own node, else NVML here (this machine's GPUs only:
        # another executor's GPUs are on another node), else what the script logged.
        local = attempt["executor"] == "local"
        node_gpus = [g["util"] for g in (sample or {}).get("gpus") or () if isinstance(g.get("util"), (int, float))]
        if node_gpus:
            seen, source = node_gpus, "nvidia-smi on the attempt's node"
        else:
            seen = gpu_utilization(attempt["gpu_ids"]) if local and attempt["gpu_ids"] else []
            source = "NVML"
        if not seen and new_points:
            # Where NVML cannot see them, what the script said about its GPUs (`gpu_util` series) in the last
            # window: read only when points came in, as only they can change it, and held as the reading
            # until the window has passed since.
            with self.ledger.read() as conn:
                seen = logged_gpu_utilization(conn, attempt, since=time.time() - GPU_LOG_WINDOW_S)
            source = "the run's gpu_util metric"
            if seen:
                self._gpu_state(attempt, logged=seen, logged_at=time.time())
        elif not seen:
            held = self._gpu_state(attempt)
            if held.get("logged") and time.time() - float(held.get("logged_at") or 0) < GPU_LOG_WINDOW_S:
                seen, source = list(held["logged"]), "the run's gpu_util metric"
        if seen:
            found += self._gpu_findings(attempt, seen, source)
        if new_points:
            with self.ledger.read() as conn:
                points = recent_points(conn, attempt["run_id"], "loss", attempt["attempt_number"], limit=TREND_POINTS)
            series = Points.of([p["step"] for p in points], [p["logged_at"] for p in points], [p["value"] for p in points])
            found += loss_trends(series, self._watchers_of(attempt))
        return found

    def _watchers_of(self, attempt: RowMapping) -> dict[str, dict[str, Any]]:
        """The thresholds the attempt's run is judged by: trackway.toml's as this supervisor holds it now (an edit
        reaches running runs), under what the run set for itself at submit (`runs.watchers`, fixed: read once)."""
        run_id = attempt["run_id"]
        if run_id not in self._run_watchers:
            with self.ledger.read() as conn:
                self._run_watchers[run_id] = conn.execute(
                    select(runs.c.watchers).where(runs.c.run_id == run_id)).scalar()
        return watchers_for_run(self.settings.watchers, self._run_watchers[run_id])

    def _rss_baseline(self, attempt: RowMapping, rss: int | None) -> int | None:
        """The first RSS seen for the attempt, kept in the ledger (`memory_baseline`) so a restarted supervisor
        judges growth from the same start; None until a heartbeat said one (a look before it sets nothing)."""
        attempt_id = attempt["attempt_id"]
        if attempt_id in self._first_rss or not rss:
            return self._first_rss.get(attempt_id)
        with self.ledger.read() as conn:
            kept = conn.execute(select(attempt_events.c.payload).where(
                attempt_events.c.attempt_id == attempt_id, attempt_events.c.kind == "memory_baseline")).first()
        if kept is not None:
            self._first_rss[attempt_id] = json.loads(kept[0]).get("rss_bytes") or rss
        else:
            with self.ledger.write() as conn:
                add_supervisor_event(conn, attempt_id, "memory_baseline", {
                    "rss_bytes": rss, "message": f"host memory at the first reading once training stepped: RSS {rss / 2**30:.2f} GiB"})
            self._first_rss[attempt_id] = rss
        return self._first_rss[attempt_id]

    def _gpu_findings(self, attempt: RowMapping, seen: list[float], source: str) -> list[tuple[str, str]]:
        """`gpu_underused` once the GPUs were below the threshold in every reading for its duration; the first reading
        is kept as `gpu_measured`, so that a gate can tell "not measured" from "fine"."""
        attempt_id = attempt["attempt_id"]
        rule = {**GPU_UNDERUSED_DEFAULTS, **(self._watchers_of(attempt).get("gpu_underused") or {})}
        threshold, duration = float(rule["threshold"]), Window.parse(rule["duration"]).size
        now = time.time()
        if attempt_id not in self._gpu_measured:
            with self.ledger.write() as conn:
                add_supervisor_event(conn, attempt_id, "gpu_measured", {"message": f"GPU utilization read from {source}"})
            self._gpu_measured.add(attempt_id)
        if max(seen) >= threshold:
            self._gpu_state(attempt, low_since=None)
            return []
        since = self._gpu_state(attempt).get("low_since")
        if since is None:
            since = now
            self._gpu_state(attempt, low_since=now)
        message = gpu_underused(seen, threshold, source, low_for=now - since, duration=duration)
        return [("gpu_underused", message)] if message is not None else []

    def _gpu_state(self, attempt: RowMapping, **update: Any) -> dict[str, Any]:
        """What the GPU watcher carries from one pass to the next, in the attempt's state directory: a one-pass
        supervisor (`supervise --once`, every listing's tick) is a new process each time. `update` is written."""
        path = Path(attempt["state_dir"]) / GPU_STATE_FILE
        state = read_json(path) or {}
        if update:
            state.update(update)
            try:
                write_json_atomic(path, state)
            except OSError:
                pass  # a state directory that cannot be written: the next pass starts the count again
        return state

    def _run_secrets(self, run_id: str) -> tuple[str, ...]:
        if run_id not in self._secrets:
            with self.ledger.read() as conn:
                self._secrets[run_id] = run_secret_values(conn, self.settings, resolve_run(conn, run_id))
        return self._secrets[run_id]

    def _record_end(self, attempt: RowMapping, status: JobStatus, note: dict | None) -> AttemptEnd | None:
        """Record one end on its own (an interrupted launch); a tick's polled ends go through `_end_all`."""
        with self.ledger.read() as conn:
            run = resolve_run(conn, attempt["run_id"])
            # Before the write lock: the values are read from the run's files.
            secrets = run_secret_values(conn, self.settings, run)
            notice = status.exit_code == 0 and bool(notices_without_finish(conn, [attempt["attempt_id"]]))
        prepared = prepare_end(self.ledger, self.settings, attempt, status, note, run, secrets, notice,
                               read_log_tail(Path(attempt["log_path"])))
        ends = record_ends(self.ledger, self.settings, [prepared])
        return ends[0] if ends else None


def orphaned_runs(conn, recorded_before: datetime) -> list[tuple[str, str]]:
    """(run id, executor) of queued training runs with no attempt at all, recorded before then.

    Evaluation seeds are queued without attempts by design (they wait for a free evaluator slot), and so are
    runs awaiting a person's approval.
    """
    has_attempt = select(attempts.c.run_id).where(attempts.c.run_id == runs.c.run_id).exists()
    query = (
        select(runs.c.run_id, runs.c.executor)
        .where(runs.c.state == RunState.QUEUED.value, runs.c.kind != RunKind.EVAL.value, ~has_attempt)
        # A run awaiting a person's approval was recorded without an attempt on purpose (agents/approval.py).
        .where(or_(runs.c.approval.is_(None), runs.c.approval != "awaiting"))
        .where(runs.c.created_at < recorded_before)
        .order_by(runs.c.created_at)
    )
    return [(row.run_id, row.executor) for row in conn.execute(query)]
