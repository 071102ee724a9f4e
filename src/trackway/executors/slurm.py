"""The Slurm executor: one sbatch job per attempt, run through the local shim, read back in batches.

`submit()` renders an sbatch script into the attempt's state directory and returns as soon as
`sbatch --parsable` does: the job may wait in the queue (phase QUEUED). The script exports the
run's environment, runs the resource's `setup` prologue, then execs the local shim in the
foreground (`local_shim --foreground`), so the attempt's `output.log` is timestamped exactly as
on the local executor and its exit status is written durably (`exit.json`) where any process can
read it. The shim sends on the `--signal=B:USR1@<grace>` notice (time limit or preemption) and
Slurm's SIGTERM to the training process; the SDK treats both as a preemption notice.

    STATE_DIR/
      slurm.sbatch     the rendered script (0600: it holds the run's environment)
      shim.py          a copy of local_shim.py (stdlib only): compute nodes need no trackway install;
                       process_tree.py and node_sampler.py beside it, which it imports
      launch.json      what the shim runs (command, cwd, log path, grace)
      slurm-job.json   the Slurm job id, written the moment sbatch returned it
      slurm.out        the batch step's own output: the setup prologue, the shim's errors and
                       slurmstepd's lines ("*** JOB 7 ON node CANCELLED AT ... DUE TO PREEMPTION ***")
      job.json, exit.json   written by the shim (see local_shim), with Slurm's job variables
      cancel.json      trackway asked to cancel (before `scancel`): CANCELLED is then ours
      slurm-final.json the end once known: later polls read it instead of asking Slurm again
      node-K.json      over several nodes: where node K's task runs (host, CUDA_VISIBLE_DEVICES)

Over several nodes (`LaunchRequest.nodes`, `submit --nodes`) the job asks one task a node, the
batch script exports the rendezvous (NNODES, WORLD_SIZE, MASTER_ADDR from the first node,
MASTER_PORT) and the shim runs `srun`, which runs the command once on every node with its
NODE_RANK (see slurm_nodes.py). The attempt is still one job, one output.log, one exit status.

Polling is batched: `poll_many()` asks `squeue` once for every job still open (finished jobs stay
in squeue for MinJobAge), then `sacct` once for the ones squeue no longer lists (`sacct -c`, the
job-completion log, where there is no slurmdbd) and, with slurmdbd, for jobs someone else
cancelled (only its sacct says who). Never one process per job.

How Slurm's ends map (reason: a TerminationReason value, only when certain):

    PREEMPTED, or any end after Slurm set PreemptTime   reason "preempted"
    TIMEOUT / DEADLINE, or an end of its own after the  reason "timeout", timed_out
      time-limit notice (SIGUSR1 in the notice window)
    NODE_FAIL / BOOT_FAIL                               reason "infra_transient"
    OUT_OF_MEMORY; FAILED by SIGKILL with slurmstepd's  reason "oom"
      "exceeded memory limit" line (OverMemoryKill)
    CANCELLED after our own cancel()                    cancelled=True (the supervisor knows why)
    CANCELLED by anyone else                            reason "user_cancelled" (never resumed), or
                                                        "preempted" / "timeout" when slurmstepd says
                                                        DUE TO PREEMPTION / DUE TO TIME LIMIT;
                                                        evidence says who, when known
    COMPLETED / FAILED                                  no reason: exit code, SDK note and log decide

Every Slurm command runs with a timeout; a missing client or an unreachable controller is an
ExecutorError with one line. `TRACKWAY_SLURM_TIMEOUT_S` (default 30) bounds each call.
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from trackway.errors import ExecutorError, NotFound
from trackway.executors import local_shim, node_sampler, process_tree
from trackway.executors.base import (
    Executor,
    JobHandle,
    JobPhase,
    JobStatus,
    LaunchRequest,
    Submission,
    status_from_json,
    status_to_json,
)
from trackway.executors.local_shim import read_json, utc_now, write_json_atomic
from trackway.executors.slurm_nodes import first_failed_task, node_command, node_placements, rendezvous_lines

SLURM_TIMEOUT_S = float(os.environ.get("TRACKWAY_SLURM_TIMEOUT_S", "30"))
# A shim that exited writes exit.json before its job ends; on a shared file system the file may
# show up here a moment after Slurm reports the end. Until then the job is still reported RUNNING.
SETTLE_S = 5.0
# `--signal=B:USR1@N` fires up to 60 s early (Slurm checks limits about every 30 s).
NOTICE_EARLY_S = 90.0
MAX_SIGNAL_LEAD_S = 0xFFFF

SCRIPT = "slurm.sbatch"
SHIM = "shim.py"
JOB_ID_FILE = "slurm-job.json"
SLURM_OUT = "slurm.out"
FINAL = "slurm-final.json"
CANCEL = "cancel.json"

# Any state in neither set (RUNNING, COMPLETING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT, …) reads as running.
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                   "OUT_OF_MEMORY", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
# Pending reasons that mean Slurm will never start the job as submitted (a limit of its partition, QoS or
# account, a constraint no node has): it ends at once `config_error` instead of waiting forever. Reasons
# that pass (Resources, Priority, a node down, a partition down, a group's running-jobs cap) keep it queued.
NEVER_STARTS = {
    "PartitionTimeLimit": "the time asked is over the partition's MaxTime",
    "PartitionNodeLimit": "the nodes asked are more than the partition allows or has",
    "PartitionConfig": "the request does not fit the partition's configuration",
    "BadConstraints": "no node has the constraints it asks for",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QoS is not valid",
    "QOSMaxWallDurationPerJobLimit": "the time asked is over the QoS's MaxWall per job",
    "QOSMaxNodePerJobLimit": "the nodes asked are over the QoS's MaxNodes per job",
    "QOSMaxGRESPerJob": "the GPUs asked are over the QoS's MaxTRES per job",
    "QOSMaxCpuPerJobLimit": "the CPUs asked are over the QoS's MaxTRES per job",
    "AssocMaxWallDurationPerJobLimit": "the time asked is over the association's MaxWall per job",
    "AssocMaxNodesPerJobLimit": "the nodes asked are over the association's MaxNodes per job",
}
NEVER_STARTED = "never-started.json"  # trackway cancelled a job Slurm would never start: why, for the end

STATE_REASONS = {"PREEMPTED": "preempted", "TIMEOUT": "timeout", "DEADLINE": "timeout",
                 "NODE_FAIL": "infra_transient", "BOOT_FAIL": "infra_transient", "OUT_OF_MEMORY": "oom"}

# What Slurm sets in a job's environment and a run's submitted environment must not override.
SLURM_OWNED_ENV = re.compile(r"^(SLURM_\w*|SLURMD_\w*|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES"
                             r"|ZE_AFFINITY_MASK)$")
SLURM_OWNED_CASE = "SLURM_*|SLURMD_*|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES|ZE_AFFINITY_MASK"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# slurmstepd's OverMemoryKill (no cgroups):
#   "StepId=47.batch exceeded memory limit (652435456 > 209715200), being killed"
_OVER_MEMORY = re.compile(r"exceeded (job )?memory limit", re.IGNORECASE)
_JOB_ID = re.compile(r"^\d+(_\d+)?$")
# squeue -O: the free-text fields last, `|` after each (field sizes unset: nothing is cut).
SQUEUE_FIELDS = ("JobID", "State", "Reason", "exit_code", "NodeList", "Partition", "QOS", "StartTime", "EndTime",
                 "PreemptTime", "TimeLimit", "STDOUT", "Name")
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Partition", "QOS", "Start", "End", "TimelimitRaw")


@dataclass(frozen=True)
class SlurmRecord:
    """One job as Slurm reports it (squeue, or sacct once squeue forgot it)."""

    job_id: str
    state: str  # the base state, upper case: RUNNING, PREEMPTED, CANCELLED ...
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    node_list: str | None = None
    partition: str | None = None
    qos: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    preempt_time: datetime | None = None
    time_limit_s: float | None = None
    cancelled_by: str | None = None  # sacct with slurmdbd says "CANCELLED by UID"
    source: str = "squeue"

    def line(self) -> str:
        parts = [f"slurm job {self.job_id}: {self.state}"]
        if self.reason and self.reason not in ("None", "(null)"):
            parts[0] += f" ({self.reason})"
        if self.exit_code is not None or self.signal is not None:
            parts.append(f"exit code {self.exit_code or 0}:{self.signal or 0}")
        if self.partition:
            parts.append(f"partition {self.partition}")
        if self.node_list and self.node_list not in ("(null)", "None assigned"):
            parts.append(f"nodes {self.node_list}")
        if self.preempt_time is not None:
            parts.append(f"preempted at {self.preempt_time.isoformat()}")
        return ", ".join(parts) + f" [{self.source}]"


class SlurmExecutor(Executor):
    """Runs attempts as Slurm batch jobs; see the module docstring for the files and the mapping."""

    name = "slurm"

    def __init__(self, home: Path, timeout_s: float | None = None):
        self.home = Path(home)
        self.timeout_s = SLURM_TIMEOUT_S if timeout_s is None else timeout_s
        self._sacct_jobcomp: bool | None = None  # None: not known yet whether slurmdbd answers

    # -- submit ------------------------------------------------------------------------------

    def submit(self, request: LaunchRequest) -> Submission:
        state_dir = Path(request.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        for name in (JOB_ID_FILE, "job.json"):
            if (state_dir / name).exists():
                raise ExecutorError(f"attempt {request.attempt_id}: {state_dir} already holds a submitted job")
        write_json_atomic(state_dir / "launch.json", launch_record(request, self.name))
        shutil.copyfile(local_shim.__file__, state_dir / SHIM)
        for module in (process_tree, node_sampler):  # the shim imports them from beside itself
            shutil.copyfile(module.__file__, state_dir / Path(module.__file__).name)
        script = state_dir / SCRIPT
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_script(request))
        submitted_at = utc_now()
        try:
            out = self._run(["sbatch", "--parsable", str(script)], cwd=state_dir, env=_sbatch_env(request))
        except _Timeout:
            # sbatch may have queued the job before the controller's answer was lost: look for it.
            job_id = self._find_by_name(state_dir, job_name(request.attempt_id))
            if job_id is None:
                raise ExecutorError(
                    f"sbatch did not answer within {self.timeout_s:g} s and no job named "
                    f"{job_name(request.attempt_id)} is queued: is slurmctld reachable?"
                ) from None
        except ExecutorError as exc:
            raise ExecutorError(f"attempt {request.attempt_id}: {exc}") from None
        else:
            job_id = out.strip().split(";")[0].strip()
            if not _JOB_ID.match(job_id):
                raise ExecutorError(f"sbatch printed {out.strip()[:200]!r}, not a job id")
        self._record_job_id(state_dir, job_id, submitted_at)
        return self._submission(state_dir, job_id, submitted_at, request)

    def preview(self, request: LaunchRequest) -> str:
        """The sbatch script submit() would write and submit, rendered by the same render_script()."""
        script = Path(request.state_dir) / SCRIPT
        resource = request.resource
        where = ", ".join(part for part in (
            f"partition {resource.partition}" if resource is not None and resource.partition else
            "the cluster's default partition",
            f"QoS {request.qos}" if request.qos else None,
            f"account {resource.account}" if resource is not None and resource.account else None) if part)
        return "\n".join([
            f"executor slurm: `sbatch --parsable {script}` ({where}); the batch step runs the local shim "
            f"({Path(request.state_dir) / SHIM}) on `{shlex.join(launch_record(request, self.name)['command'])}`",
            f"--- {script}",
            render_script(request).rstrip("\n"),
            "---",
        ])

    def _record_job_id(self, state_dir: Path, job_id: str, submitted_at: datetime) -> None:
        write_json_atomic(state_dir / JOB_ID_FILE, {"job_id": job_id, "submitted_at": submitted_at.isoformat()})

    def _submission(self, state_dir: Path, job_id: str, submitted_at: datetime,
                    request: LaunchRequest | None = None) -> Submission:
        resource = request.resource if request is not None else None
        return Submission(
            handle=JobHandle(executor=self.name, job_id=job_id, state_dir=state_dir),
            host="",  # not known while the job is queued; poll()'s placement says where it ran
            gpu_ids=[],
            gpu_model=resource.gpu if resource is not None else None,
            started_at=submitted_at,
            pid=None,
        )

    def adopt(self, state_dir: Path) -> Submission | None:
        """The job of a launch that died after sbatch: its recorded id, or the queued job of that name."""
        state_dir = Path(state_dir)
        recorded = read_json(state_dir / JOB_ID_FILE)
        if recorded and recorded.get("job_id"):
            return self._submission(state_dir, recorded["job_id"], datetime.fromisoformat(recorded["submitted_at"]))
        launch = read_json(state_dir / "launch.json")
        if launch is None or launch.get("executor") != self.name or not (state_dir / SCRIPT).exists():
            return None
        job_id = self._find_by_name(state_dir, job_name(launch["attempt_id"]))
        if job_id is None:
            return None
        submitted_at = datetime.fromtimestamp((state_dir / SCRIPT).stat().st_mtime, timezone.utc)
        self._record_job_id(state_dir, job_id, submitted_at)
        return self._submission(state_dir, job_id, submitted_at)

    def _find_by_name(self, state_dir: Path, name: str) -> str | None:
        """The job called `name` whose output file is this state directory's: ours, not a namesake's."""
        out = self._squeue(["--name", name], ("JobID", "STDOUT"))
        wanted = str(state_dir / SLURM_OUT)
        for line in out.splitlines():
            job_id, _, stdout = line.removesuffix("|").partition("|")  # the path last: it may hold a "|"
            if stdout == wanted and _JOB_ID.match(job_id):
                return job_id
        return None

    # -- poll --------------------------------------------------------------------------------

    def poll(self, handle: JobHandle) -> JobStatus:
        return self.poll_many([handle])[handle.job_id]

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        handles = list(handles)
        statuses: dict[str, JobStatus] = {}
        open_handles = []
        for handle in handles:
            final = read_json(Path(handle.state_dir) / FINAL)
            if final is not None and final.get("job_id") == handle.job_id:
                statuses[handle.job_id] = status_from_json(final)
            elif not _JOB_ID.match(handle.job_id):
                statuses[handle.job_id] = JobStatus(
                    phase=JobPhase.VANISHED, evidence=(f"{handle.job_id!r} is not a Slurm job id",))
            else:
                open_handles.append(handle)
        if not open_handles:
            return statuses
        records = self._squeue_records([h.job_id for h in open_handles])
        missing = [h.job_id for h in open_handles if h.job_id not in records]
        # Who cancelled a job trackway did not: only slurmdbd's sacct says ("CANCELLED by 1234").
        cancelled_by_others = [] if self._sacct_jobcomp else [
            h.job_id for h in open_handles if h.job_id in records and records[h.job_id].state == "CANCELLED"
            and not (Path(h.state_dir) / CANCEL).exists()]
        if missing or cancelled_by_others:
            found = self._sacct_records(missing + cancelled_by_others)
            records.update({job_id: found[job_id] for job_id in missing if job_id in found})
            for job_id in cancelled_by_others:
                if job_id in found and found[job_id].cancelled_by:
                    records[job_id] = replace(records[job_id], cancelled_by=found[job_id].cancelled_by)
        for handle in open_handles:
            status = self._status(handle, records.get(handle.job_id))
            if status.phase.is_terminal():
                try:
                    write_json_atomic(Path(handle.state_dir) / FINAL, {"job_id": handle.job_id,
                                                                       **status_to_json(status)})
                except OSError:
                    pass  # not ours to write (or a full disk): the next poll asks Slurm again

            statuses[handle.job_id] = status
        return statuses

    def _status(self, handle: JobHandle, record: SlurmRecord | None) -> JobStatus:
        state_dir = Path(handle.state_dir)
        job = read_json(state_dir / "job.json")
        ended = read_json(state_dir / "exit.json")
        ours = (state_dir / CANCEL).exists()
        started_at = _iso(job.get("started_at")) if job else None
        placement = _placement(handle.job_id, record, job, state_dir)
        if placement.get("nodes_expected") and record is not None and record.state not in TERMINAL_STATES:
            # Over several nodes the job is placed once every node's task said where it runs: the
            # placement is recorded once, and then it lists them all.
            if len(placement.get("nodes", ())) < placement["nodes_expected"]:
                placement.pop("host", None)
        if record is None:
            if ended is not None:
                return JobStatus(
                    phase=JobPhase.ENDED, exit_code=ended["exit_code"], signal=ended["signal"],
                    started_at=started_at, ended_at=_iso(ended["ended_at"]), cancelled=bool(ended.get("cancelled")),
                    evidence=(f"slurm job {handle.job_id}: no longer known to squeue or sacct; the shim's exit.json "
                              "tells the end", *ended["evidence"]),
                    placement=placement,
                )
            return JobStatus(
                phase=JobPhase.VANISHED, started_at=started_at, cancelled=ours, placement=placement,
                evidence=(f"slurm job {handle.job_id}: neither squeue nor sacct knows it, and it left no exit status "
                          f"in {state_dir}",),
            )
        if record.state in PENDING_STATES:
            why = record.reason if record.reason not in (None, "None", "(null)") else record.state.lower()
            waiting = f"slurm job {handle.job_id}: {record.state} ({why})"
            never = self._never_starts(record, state_dir) if not ours else None
            if never is not None:
                return self._end_never_started(handle, state_dir, (waiting, never), placement)
            return JobStatus(phase=JobPhase.QUEUED, cancelled=ours, placement=placement, evidence=(waiting,))
        if record.state not in TERMINAL_STATES:
            return JobStatus(phase=JobPhase.RUNNING, started_at=started_at or record.start, cancelled=ours,
                             placement=placement)
        if ended is None and job is not None and record.end is not None:
            if (datetime.now(timezone.utc) - record.end).total_seconds() < SETTLE_S:
                # The shim may have written exit.json a moment ago, out of this file system's sight yet.
                return JobStatus(phase=JobPhase.RUNNING, started_at=started_at, cancelled=ours, placement=placement)
        return self._ended(state_dir, record, job, ended, ours, started_at, placement)

    def _never_starts(self, record: SlurmRecord, state_dir: Path) -> str | None:
        """Why Slurm will never start this pending job, or None while it may still start.

        PartitionNodeLimit also stands for a partition whose nodes are down or drained: that one
        passes, so it is taken as never only when the partition's limits say so.
        """
        said = NEVER_STARTS.get(record.reason or "")
        if said is None:
            return None
        limits = self._partition_limits(record.partition) if record.partition else {}
        asked_nodes = int((read_json(state_dir / "launch.json") or {}).get("nodes") or 1)
        if record.reason == "PartitionNodeLimit":
            most = [int(v) for v in (limits.get("MaxNodes"), limits.get("TotalNodes")) if (v or "").isdigit()]
            if not most or asked_nodes <= min(most):
                return None
        if limits:
            asked_time = f"{record.time_limit_s / 60:g} min" if record.time_limit_s else "no time limit"
            said += (f" (asks {asked_time} on {asked_nodes} node(s); partition {record.partition}: MaxTime "
                     f"{limits.get('MaxTime', '?')}, MaxNodes {limits.get('MaxNodes', '?')}, TotalNodes "
                     f"{limits.get('TotalNodes', '?')})")
        return f"Slurm will never start it ({record.reason}): {said}"

    def _partition_limits(self, name: str) -> dict[str, str]:
        """`scontrol show partition NAME`'s fields (MaxTime, MaxNodes, TotalNodes, ...); empty if it does not answer."""
        try:
            out = self._run(["scontrol", "show", "partition", name, "--oneliner"])
        except ExecutorError:
            return {}
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def _end_never_started(self, handle: JobHandle, state_dir: Path, evidence: tuple[str, ...],
                           placement: dict) -> JobStatus:
        """Cancel a job Slurm would never start and end its attempt `config_error`, having spent nothing."""
        write_json_atomic(state_dir / NEVER_STARTED, {"evidence": list(evidence), "at": utc_now().isoformat()})
        try:
            self._run(["scancel", handle.job_id])
        except ExecutorError as exc:
            evidence += (f"scancel {handle.job_id} failed: {exc}; cancel it by hand",)
        return JobStatus(phase=JobPhase.ENDED, ended_at=utc_now(), reason="config_error", never_started=True,
                         evidence=(*evidence, f"trackway cancelled slurm job {handle.job_id}: it would have waited "
                                              "forever"), placement=placement)

    def _ended(self, state_dir: Path, record: SlurmRecord, job: dict | None, ended: dict | None, ours: bool,
               started_at: datetime | None, placement: dict) -> JobStatus:
        evidence = [record.line()]
        never_started = False
        evidence += _slurmstepd_lines(state_dir / SLURM_OUT)
        if ended is not None:
            exit_code, signum = ended["exit_code"], ended["signal"]
            evidence += ended["evidence"]
        else:
            exit_code, signum = record.exit_code, record.signal
            if job is None and not (state_dir / SLURM_OUT).exists():
                # Slurm reports 0:0 for a job that never ran: that is no exit status, let alone a success.
                exit_code, signum = None, None
                never_started = True
                evidence.append("the job ended before it ever ran")
            elif job is None:
                evidence.append("the command never started (no job.json): see slurm.out for the batch script's output")
                evidence += _tail(state_dir / SLURM_OUT, 3)
            else:
                evidence.append("the executor shim left no exit status (killed with its job): Slurm's exit code stands")
        if placement.get("nodes_expected") and exit_code not in (None, 0):
            failed = first_failed_task(_tail(_log_path(state_dir), 400))
            if failed is not None and failed.exit_code != exit_code:
                evidence.append(failed.line(exit_code))
                exit_code, signum = failed.exit_code, None
        reason = STATE_REASONS.get(record.state)
        timed_out = reason == "timeout"
        cancelled = False
        never = read_json(state_dir / NEVER_STARTED)
        if never is not None and record.state == "CANCELLED" and job is None:
            return JobStatus(phase=JobPhase.ENDED, ended_at=record.end or utc_now(), reason="config_error",
                             never_started=True, placement=placement,
                             evidence=(*never["evidence"], "trackway cancelled the job: it would have waited forever"))
        if record.state == "CANCELLED":
            if ours:
                cancelled = True
            else:
                reason = _cancelled_because(evidence, record)
                timed_out = reason == "timeout"
                who = _who(record.cancelled_by)
                evidence.append(f"cancelled outside trackway by {who} (trackway did not ask to)" if who else
                                "cancelled outside trackway (trackway did not ask to); who did it only slurmdbd's "
                                "sacct records, and it does not answer here")
        elif reason is None and record.preempt_time is not None:
            reason = "preempted"
            evidence.append("Slurm preempted the job (PreemptTime set); it ended on its own after the notice")
        elif reason is None and ended is not None and not ours:
            notice = _time_limit_notice(ended.get("notices") or (), started_at or record.start, record.time_limit_s)
            if notice is not None:
                reason, timed_out = "timeout", True
                evidence.append(notice)
        if reason is None and record.state == "FAILED" and signum == 9:
            memory = [line for line in evidence if _OVER_MEMORY.search(line)]
            if memory:
                reason = "oom"
        return JobStatus(
            phase=JobPhase.ENDED,
            exit_code=exit_code,
            signal=signum,
            started_at=started_at or record.start,
            ended_at=_iso(ended["ended_at"]) if ended is not None else (record.end or utc_now()),
            timed_out=timed_out,
            cancelled=cancelled,
            evidence=tuple(evidence),
            reason=reason,
            placement=placement,
            never_started=never_started,
        )

    # -- cancel, logs ------------------------------------------------------------------------

    def cancel(self, handle: JobHandle) -> None:
        """Note that trackway asked, then `scancel`: Slurm sends SIGTERM, SIGKILL after its KillWait."""
        state_dir = Path(handle.state_dir)
        if not (state_dir / JOB_ID_FILE).exists() and not (state_dir / SCRIPT).exists():
            raise NotFound(f"job {handle.job_id}: no Slurm job was submitted from {state_dir}")
        if (state_dir / "exit.json").exists() or (state_dir / FINAL).exists():
            return
        if not (state_dir / CANCEL).exists():
            write_json_atomic(state_dir / CANCEL, {"requested_at": utc_now().isoformat(), "job_id": handle.job_id})
        try:
            self._run(["scancel", handle.job_id])
        except ExecutorError as exc:
            if "already completing or completed" in str(exc) or "Invalid job id" in str(exc):
                return
            raise

    def logs(self, handle: JobHandle) -> Path:
        launch = read_json(Path(handle.state_dir) / "launch.json")
        if launch is None:
            raise NotFound(f"job {handle.job_id}: no Slurm job was launched from {handle.state_dir}")
        return Path(launch["log_path"])

    # -- Slurm commands ----------------------------------------------------------------------

    def _run(self, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
             ok_errors: tuple[str, ...] = ()) -> str:
        """Run one Slurm client command with the timeout; its stdout, or an ExecutorError in one line."""
        binary = shutil.which(argv[0], path=(env or os.environ).get("PATH"))
        if binary is None:
            raise ExecutorError(f"{argv[0]} is not on PATH: install the Slurm client (Debian: slurm-client), "
                                "or run trackway where Slurm's commands are")
        try:
            done = subprocess.run([binary, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise _Timeout(f"{argv[0]} did not answer within {self.timeout_s:g} s: is slurmctld reachable?") from None
        except OSError as exc:
            raise ExecutorError(f"{argv[0]} could not run: {exc}") from None
        if done.returncode != 0:
            prefix = re.compile(rf"^{re.escape(argv[0])}: (error: )?")
            said = [prefix.sub("", line.strip()) for line in done.stderr.splitlines()]
            err = "; ".join(line for line in said if line) or f"exit code {done.returncode}"
            if any(text in err for text in ok_errors):
                return ""
            raise ExecutorError(f"{argv[0]} failed: {err[:300]}")
        return done.stdout

    def _squeue(self, selection: list[str], fields: tuple[str, ...]) -> str:
        fmt = ",".join(f"{field}:|" for field in fields)
        # squeue rejects a list of job ids none of which it knows; that is an empty answer here.
        return self._run(["squeue", "--noheader", "--states=all", *selection, "-O", fmt],
                         ok_errors=("Invalid job id specified",))

    def _squeue_records(self, job_ids: list[str]) -> dict[str, SlurmRecord]:
        out = self._squeue(["--jobs", ",".join(job_ids)], SQUEUE_FIELDS)
        records = {}
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) < len(SQUEUE_FIELDS):
                continue
            (job_id, state, reason, exit_code, nodes, partition, qos, start, end, preempt, limit) = fields[:11]
            code, signum = _wait_status(exit_code)
            records[job_id] = SlurmRecord(
                job_id=job_id, state=_base_state(state), reason=reason or None, exit_code=code, signal=signum,
                node_list=_value(nodes), partition=_value(partition), qos=_value(qos), start=_slurm_time(start),
                end=_slurm_time(end), preempt_time=_slurm_time(preempt), time_limit_s=_limit_seconds(limit),
            )
        return records

    def _sacct_records(self, job_ids: list[str]) -> dict[str, SlurmRecord]:
        """Jobs squeue forgot (past MinJobAge): slurmdbd's sacct, or the job-completion log (`sacct -c`)."""
        base = ["sacct", "--noheader", "--parsable2", "--jobs", ",".join(job_ids), "--format", ",".join(SACCT_FIELDS)]
        if not self._sacct_jobcomp:
            try:
                out = self._run([*base, "--allocations"])
                self._sacct_jobcomp = False
                return _parse_sacct(out, "sacct")
            except ExecutorError as exc:
                if "accounting storage is disabled" not in str(exc):
                    raise
                self._sacct_jobcomp = True
        return _parse_sacct(self._run([*base, "--completion"]), "sacct -c")


class _Timeout(ExecutorError):
    pass


def job_name(attempt_id: str) -> str:
    return "trackway-" + re.sub(r"[^A-Za-z0-9_.-]", "_", attempt_id)


def launch_record(request: LaunchRequest, executor: str = "slurm") -> dict:
    """What the batch step's shim runs (launch.json): submit() writes it, preview() shows its command."""
    return {
        "attempt_id": request.attempt_id,
        # Over several nodes the shim runs srun, which runs the command once on every node.
        "command": node_command(request) if request.nodes > 1 else list(request.command),
        "nodes": request.nodes,
        "cwd": str(request.cwd),
        # The script sets the environment; the shim passes its own on (see render_script).
        "env": {},
        "env_is_complete": False,
        "log_path": str(request.log_path),
        "time_limit_s": None,  # Slurm enforces the limit (TIMEOUT), with its notice before it
        "grace_s": request.grace_s,
        "gpu_ids": [],
        "lease_dir": None,
        "executor": executor,
    }


def render_script(request: LaunchRequest) -> str:
    """The sbatch script for one attempt: Slurm options, the run's environment, setup, then the shim."""
    state_dir = Path(request.state_dir)
    lines = [
        "#!/bin/bash",
        f"# trackway attempt {request.attempt_id}: written by trackway's Slurm executor and submitted with",
        "# `sbatch --parsable`; the batch step runs the command through the local shim (output.log, exit.json).",
        *(f"#SBATCH {_sbatch_option(option)}" for option in _sbatch_options(request)),
        "",
        "# A notice (USR1) before the shim's handler is up must not kill the job: ignored until then.",
        "trap '' USR1",
        "",
        *_environment_lines(request),
        *_setup_lines(request),
        *rendezvous_lines(request),
        "",
        "# The shim is stdlib-only Python: this interpreter where the node has it, else python3.",
        f"trackway_python={shlex.quote(sys.executable)}",
        "[ -x \"$trackway_python\" ] || trackway_python=$(command -v python3) || {",
        "  echo 'trackway: no python3 on this node to run the executor shim' >&2; exit 127; }",
        f"exec \"$trackway_python\" {shlex.quote(str(state_dir / SHIM))} --foreground {shlex.quote(str(state_dir))}",
        "",
    ]
    return "\n".join(lines)


def _sbatch_options(request: LaunchRequest) -> list[str]:
    """The #SBATCH options: where the job's files go, how it is told to stop, and what the resource asks for."""
    resource = request.resource
    state_dir = Path(request.state_dir)
    options = [
        f"--job-name={job_name(request.attempt_id)}",
        f"--output={state_dir / SLURM_OUT}",
        "--open-mode=append",
        f"--chdir={state_dir}",
        # trackway decides retries: a job Slurm requeued would run an attempt twice.
        "--no-requeue",
        # The notice before a time limit or a preemption; the shim sends it on to the command.
        f"--signal=B:USR1@{min(max(1, math.ceil(request.grace_s)), MAX_SIGNAL_LEAD_S)}",
        "--export=ALL",
    ]
    nodes = request.nodes
    options.append(f"--nodes={nodes}")
    if nodes > 1:
        options.append("--ntasks-per-node=1")  # one task per node: srun runs the command once on each
    if resource is not None and resource.partition:
        options.append(f"--partition={resource.partition}")
    if resource is not None and resource.account:
        options.append(f"--account={resource.account}")
    if request.qos:
        options.append(f"--qos={request.qos}")
    if request.time_limit_s is not None:
        options.append(f"--time={max(1, math.ceil(request.time_limit_s / 60))}")
    if request.gpus:
        if nodes > 1 and request.gpus % nodes:
            options.append(f"--gpus={request.gpus}")
        else:
            options.append(f"--gres=gpu:{request.gpus // nodes if nodes > 1 else request.gpus}")
    if resource is not None:
        options.extend(resource.sbatch)
    return options


def _environment_lines(request: LaunchRequest) -> list[str]:
    """The run's variables exported, over what the job inherited or (a complete environment) instead of it."""
    lines: list[str] = []
    skipped = sorted(name for name in request.env if not _ENV_NAME.match(name) or SLURM_OWNED_ENV.match(name))
    if request.env_is_complete:
        lines += [
            "# The run's environment as submitted is the whole environment: drop what the job inherited,",
            "# except what Slurm set for this job.",
            "for trackway_var in $(compgen -e); do",
            f"  case $trackway_var in {SLURM_OWNED_CASE}) ;; *) unset \"$trackway_var\" 2>/dev/null ;; esac",
            "done",
            "unset trackway_var",
        ]
    else:
        lines.append("# The run's variables, over the environment sbatch passed on.")
    if skipped:
        lines.append(f"# not exported (set by Slurm for the job, or not a shell name): {' '.join(skipped)}")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(request.env.items())
              if name not in skipped]
    if not request.gpus:
        lines.append("export CUDA_VISIBLE_DEVICES=  # no GPU asked: none to be taken")
    return lines


def _setup_lines(request: LaunchRequest) -> list[str]:
    """The resource's setup prologue, run in the batch shell; its failure is written to output.log and ends the job."""
    resource = request.resource
    if resource is None or not resource.setup:
        return []
    state_dir = Path(request.state_dir)
    log_q = shlex.quote(str(request.log_path))
    return [
        "",
        f"# The setup prologue of resource {resource.name}, in this shell (module loads, venv activation).",
        "trackway_setup() {",
        resource.setup,
        "}",
        "trackway_setup || {",
        "  trackway_rc=$?",
        f"  mkdir -p {shlex.quote(str(Path(request.log_path).parent))}",
        "  printf '%s err trackway: the setup prologue of resource %s failed with exit code %d;'\\",
        "' its output is in %s\\n' \\",
        f"    \"$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)\" {shlex.quote(resource.name)} \"$trackway_rc\" "
        f"{shlex.quote(str(state_dir / SLURM_OUT))} >>{log_q}",
        "  exit \"$trackway_rc\"",
        "}",
        "unset -f trackway_setup",
    ]


def _sbatch_option(option: str) -> str:
    name, sep, value = option.partition("=")
    if sep and re.search(r"[\s\"']", value):
        return f'{name}="{value}"'
    return option


def _sbatch_env(request: LaunchRequest) -> dict[str, str]:
    """sbatch's own environment: no SBATCH_*/SLURM_* input variables to override the script's options.

    With a complete run environment the script sets every variable itself, so sbatch gets only
    what it needs to run; otherwise the job inherits this process's environment, as locally.
    """
    if request.env_is_complete:
        keep = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "SLURM_CONF")
        return {name: os.environ[name] for name in keep if name in os.environ}
    return {name: value for name, value in os.environ.items()
            if not name.startswith("SBATCH_") and (not name.startswith("SLURM_") or name == "SLURM_CONF")}


def _parse_sacct(out: str, source: str) -> dict[str, SlurmRecord]:
    records = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) < len(SACCT_FIELDS) or not _JOB_ID.match(fields[0]):
            continue  # a step (123.batch) or a malformed line
        job_id, state, exit_code, nodes, partition, qos, start, end, limit_minutes = fields[:9]
        words = state.split()
        code, _, signum = exit_code.partition(":")
        records[job_id] = SlurmRecord(  # the last record of a job wins (a requeued job has several)
            job_id=job_id, state=_base_state(state), exit_code=_int(code), signal=_int(signum) or None,
            node_list=_value(nodes), partition=_value(partition), qos=_value(qos), start=_slurm_time(start),
            end=_slurm_time(end), cancelled_by=words[2] if len(words) >= 3 and words[1] == "by" else None,
            time_limit_s=60.0 * minutes if (minutes := _int(limit_minutes)) is not None else None,
            source=source,
        )
    return records


def _base_state(state: str) -> str:
    return state.split()[0].rstrip("+").upper() if state.strip() else "UNKNOWN"


def _wait_status(text: str) -> tuple[int | None, int | None]:
    """squeue's exit_code is a wait status: 768 is exit code 3, 9 is SIGKILL."""
    raw = _int(text)
    if raw is None:
        return None, None
    if raw & 0x7F:
        return None, raw & 0x7F
    return raw >> 8, None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _value(text: str) -> str | None:
    return None if text in ("", "(null)", "N/A", "None") else text


def _slurm_time(text: str) -> datetime | None:
    """Slurm prints local time without a zone (`2026-11-25T15:26:59`); None for N/A, None, Unknown."""
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        return None


def _limit_seconds(text: str) -> float | None:
    """squeue's TimeLimit: `MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, or UNLIMITED / INVALID."""
    match = re.match(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(part) if part else 0 for part in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _iso(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _cancelled_because(evidence: list[str], record: SlurmRecord) -> str:
    """Why a job trackway did not cancel was: Slurm's own preemption or time limit, else a person or a tool.

    An operator's `scancel` is a decision about this job, not an accident of the cluster: the
    attempt ends `user_cancelled` and the run is not resumed behind the operator's back.
    """
    said = " ".join(line for line in evidence if "slurmstepd" in line).upper()
    if "DUE TO PREEMPTION" in said or record.preempt_time is not None:
        return "preempted"
    if "DUE TO TIME LIMIT" in said:
        return "timeout"
    return "user_cancelled"


def _who(uid_text: str | None) -> str | None:
    uid = _int(uid_text) if uid_text else None
    if uid is None:
        return uid_text
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _placement(job_id: str, record: SlurmRecord | None, job: dict | None, state_dir: Path | None = None) -> dict:
    batch = (job or {}).get("batch_env") or {}
    placement: dict = {"slurm_job_id": job_id}
    if record is not None:
        placement.update(node_list=record.node_list, partition=record.partition, qos=record.qos)
    placement["node_list"] = placement.get("node_list") or batch.get("SLURM_JOB_NODELIST")
    placement["partition"] = placement.get("partition") or batch.get("SLURM_JOB_PARTITION")
    placement["qos"] = placement.get("qos") or batch.get("SLURM_JOB_QOS")
    launch = read_json(state_dir / "launch.json") if state_dir is not None else None
    expected = int((launch or {}).get("nodes") or 1)
    if expected > 1:
        # The batch step runs on the first node only: where the job ran is every node's task's word.
        placement["nodes_expected"] = expected
        placement["nodes"] = node_placements(state_dir)
        if job:
            placement["host"] = job.get("host")
        return {key: value for key, value in placement.items() if value is not None}
    if job:
        placement["host"] = job.get("host")
        placement["gpu_ids"] = list(job.get("gpu_ids") or [])
        if "CUDA_VISIBLE_DEVICES" in batch:
            placement["cuda_visible_devices"] = batch["CUDA_VISIBLE_DEVICES"]
    return {key: value for key, value in placement.items() if value is not None}


def _time_limit_notice(notices, started_at: datetime | None, limit_s: float | None) -> str | None:
    """A SIGUSR1 that came in the time-limit notice window: the job ended itself before Slurm's TIMEOUT."""
    if started_at is None or limit_s is None:
        return None
    for notice in notices:
        if notice.get("signal") != "SIGUSR1":
            continue
        left = limit_s - (datetime.fromisoformat(notice["at"]) - started_at).total_seconds()
        if left <= NOTICE_EARLY_S + 60:
            return (f"SIGUSR1 came {max(left, 0):.0f} s before the {limit_s / 60:g} min time limit (Slurm's "
                    "time-limit notice) and the job ended itself before Slurm's TIMEOUT")
    return None


def _tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip()][-n:]


def _log_path(state_dir: Path) -> Path:
    launch = read_json(state_dir / "launch.json") or {}
    return Path(launch.get("log_path") or state_dir / "output.log")


def _slurmstepd_lines(path: Path) -> list[str]:
    """slurmstepd's own lines in the batch output: `*** JOB 7 ON node CANCELLED AT ... DUE TO PREEMPTION ***`."""
    return [line for line in _tail(path, 40) if "slurmstepd" in line][-4:]
