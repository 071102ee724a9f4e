"""The local executor: attempts on this machine, each run by the home's host shim, its state kept in files.

Per attempt, `state_dir` holds `launch.json` (written by `submit()`), then `job.json`, `exit.json`
and `shim.err` (written by the shim, see `local_shim`), and `cancel.json` once someone cancelled.
One host process per trackway home runs every attempt, each with a small keeper process of its
own that stands for it (job.json's `shim_pid`): see `local_host` for why and how.
Everything `poll()`, `cancel()` and `logs()` need is read from there, so any process can ask about
any attempt: a CLI that detached, or a supervisor restarted after a kill -9.

GPUs are leased with one file per GPU index under `home/local/gpu-leases/`, created with O_EXCL
under an flock and naming the live process that holds it (the submitter, then the shim). A lease
whose holder is dead is stale and is taken over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from trackway.errors import ExecutorError, InputError, NotFound
from trackway.executors.base import (
    Executor,
    JobHandle,
    JobPhase,
    JobStatus,
    LaunchRequest,
    Submission,
    full_disk_evidence,
)
from trackway.executors.local_host import HostUnavailable, open_ended_signal, request_start
from trackway.executors.local_shim import (
    LeaseFiles,
    StartFailed,
    read_json,
    settle_orphans,
    stop_job,
    write_json_atomic,
)
from trackway.executors.process_tree import name_processes, process_create_time, same_process, signal_group
from trackway.receipts.placement import GpuInfo
from trackway.receipts.placement import gpu_inventory as host_gpu_inventory

SHIM_START_TIMEOUT_S = 10.0
# What stops a job whose shim is gone (`--kill-tree`, see local_shim).
SHIM = [sys.executable, "-m", "trackway.executors.local_shim"]
HOST = [sys.executable, "-m", "trackway.executors.local_host"]


def choose_gpus(inventory: Iterable[GpuInfo], leased: set[int], n: int) -> list[int]:
    """The `n` lowest-numbered GPUs that no live attempt leases and no process computes on.

    Raises InputError (naming `--gpus`) when there are not enough.
    """
    if n < 0:
        raise InputError(f"--gpus {n}: expected a whole number of GPUs, 0 or more")
    if n == 0:
        return []
    gpus = sorted(inventory, key=lambda gpu: gpu.index)
    if len(gpus) < n:
        raise InputError(f"--gpus {n}: this machine has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}")
    free = [gpu.index for gpu in gpus if gpu.index not in leased and gpu.processes == 0]
    if len(free) < n:
        busy = ", ".join(str(gpu.index) for gpu in gpus if gpu.index not in free)
        verb = "is" if len(free) == 1 else "are"
        raise InputError(f"--gpus {n}: only {len(free)} of {len(gpus)} GPUs {verb} free (busy: {busy})")
    return free[:n]


class LocalExecutor(Executor):
    """Runs attempts as detached processes on this machine; see the module docstring for the files."""

    name = "local"

    def __init__(self, home: Path, gpu_inventory: Callable[[], list[GpuInfo]] | None = None):
        self.home = Path(home)
        self.gpu_inventory = gpu_inventory or host_gpu_inventory
        self.leases = LeaseFiles(self.home / "local" / "gpu-leases")
        # job.json of the jobs last seen running, by state_dir: the shim writes it once, so a
        # supervisor polling hundreds of attempts every second need not read and parse it each time.
        self._running_jobs: dict[str, dict] = {}
        self._ended_signal: int | None = None

    def submit(self, request: LaunchRequest) -> Submission:
        state_dir = Path(request.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        if (state_dir / "job.json").exists():
            raise ExecutorError(f"attempt {request.attempt_id}: {state_dir} already holds a started job")
        inventory = self.gpu_inventory()
        gpu_ids = self._lease(inventory, request)
        try:
            write_json_atomic(state_dir / "launch.json", self._launch_record(request, inventory, gpu_ids))
            job = self._start_shim(state_dir)
        except BaseException:
            self._release_own(gpu_ids, state_dir)
            raise
        names = {gpu.index: gpu.name for gpu in inventory}
        return self._submission(state_dir, job, names.get(gpu_ids[0]) if gpu_ids else None)

    def preview(self, request: LaunchRequest) -> str:
        """The shim's launch.json as submit() would write it, with the GPUs free now (nothing leased)."""
        import shlex

        from trackway.executors.previews import environment_lines, limit_line

        inventory = self.gpu_inventory()
        if request.gpus:
            leased = self._live_leases() if self.leases.directory.is_dir() else set()
            try:
                gpu_ids = choose_gpus(inventory, leased, request.gpus)
                gpus = f"{','.join(map(str, gpu_ids))}: the lowest-numbered GPUs free now (leased when it starts)"
            except InputError as exc:
                gpu_ids, gpus = [], f"none free now ({exc}): the attempt would not start"
        else:
            gpu_ids, gpus = [], "none asked"
        launch = self._launch_record(request, inventory, gpu_ids)
        return "\n".join([
            f"executor local: the host shim on this machine runs the command (started with "
            f"`{shlex.join([*HOST, str(self.home)])}` if none runs), a keeper process standing for the attempt",
            f"command: {shlex.join(launch['command'])}",
            f"working directory: {launch['cwd']}",
            f"GPUs: {gpus}",
            limit_line(launch["time_limit_s"], launch["grace_s"]),
            f"output: {launch['log_path']}",
            *environment_lines(launch["env"], request, added_to="this process's environment"),
            f"written first: {Path(request.state_dir) / 'launch.json'}",
        ])

    def _launch_record(self, request: LaunchRequest, inventory: list[GpuInfo], gpu_ids: list[int]) -> dict:
        """What the shim runs (launch.json): submit() writes it, preview() shows it."""
        env = dict(request.env)
        if gpu_ids:
            # NVML numbers GPUs in PCI order; CUDA's default order differs on mixed machines.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
        elif inventory:
            # A job that asked for no GPU must not grab one that another attempt leased.
            env["CUDA_VISIBLE_DEVICES"] = ""
        return {
            "attempt_id": request.attempt_id,
            "command": list(request.command),
            "cwd": str(request.cwd),
            "env": env,
            "env_is_complete": request.env_is_complete,
            "log_path": str(request.log_path),
            "time_limit_s": request.time_limit_s,
            "grace_s": request.grace_s,
            "gpu_ids": gpu_ids,
            "lease_dir": str(self.leases.directory),
        }

    def _submission(self, state_dir: Path, job: dict, gpu_model: str | None) -> Submission:
        return Submission(
            handle=JobHandle(executor=self.name, job_id=str(job["shim_pid"]), state_dir=state_dir),
            host=job["host"],
            gpu_ids=list(job["gpu_ids"]),
            gpu_model=gpu_model,
            started_at=datetime.fromisoformat(job["started_at"]),
            pid=job["child_pid"],
        )

    def adopt(self, state_dir: Path) -> Submission | None:
        """The shim writes job.json once the command runs: a launch that died after that is found here."""
        job = read_json(Path(state_dir) / "job.json")
        if not job or "shim_pid" not in job:
            return None
        return self._submission(Path(state_dir), job, None)

    def ended_signal(self) -> int | None:
        """The home's ended.fifo, which the host shim writes a byte into after each exit.json (local_host)."""
        if self._ended_signal is None:
            self._ended_signal = open_ended_signal(self.home)
        return self._ended_signal

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        statuses = {}
        polled = set()
        for handle in handles:
            statuses[handle.job_id] = self.poll(handle)
            polled.add(str(handle.state_dir))
        # Jobs no longer asked about ended (or were recorded by another supervisor): forget them.
        self._running_jobs = {key: job for key, job in self._running_jobs.items() if key in polled}
        return statuses

    def poll(self, handle: JobHandle) -> JobStatus:
        # String paths until one is needed: a tick polls every running attempt, and building Paths
        # cost a third of a poll (a thousand attempts ending at once wait for that poll).
        key = str(handle.state_dir)
        job = self._running_jobs.pop(key, None) or read_json(os.path.join(key, "job.json"))
        exit_json = os.path.join(key, "exit.json")
        # Asked first: a running job has none yet, and a failed open costs an exception (a thousand a tick).
        ended = read_json(exit_json) if os.access(exit_json, os.F_OK) else None
        shim_alive = ended is None and job is not None and same_process(job["shim_pid"], job["create_time"])
        if ended is None and job is not None and not shim_alive:
            # The shim may have written exit.json between the two reads above.
            ended = read_json(exit_json)
        started_at = datetime.fromisoformat(job["started_at"]) if job else None
        if ended is not None:
            return JobStatus(
                phase=JobPhase.ENDED,
                exit_code=ended["exit_code"],
                signal=ended["signal"],
                started_at=started_at,
                ended_at=datetime.fromisoformat(ended["ended_at"]),
                timed_out=ended["timed_out"],
                cancelled=ended["cancelled"],
                reason=ended.get("reason"),  # absent from the exit.json of an older shim
                evidence=tuple(ended["evidence"]),
            )
        cancelled = os.access(os.path.join(key, "cancel.json"), os.F_OK)
        if shim_alive:
            self._running_jobs[key] = job
            return JobStatus(phase=JobPhase.RUNNING, started_at=started_at, cancelled=cancelled)
        state_dir = Path(key)
        if job is None:
            return JobStatus(
                phase=JobPhase.VANISHED,
                cancelled=cancelled,
                evidence=(f"no job.json in {state_dir}: the executor shim never started the command",),
            )
        shim_gone = f"executor shim pid {job['shim_pid']} is gone"
        if same_process(job["child_pid"], job["child_create_time"]):
            return JobStatus(
                phase=JobPhase.RUNNING,
                started_at=started_at,
                cancelled=cancelled,
                evidence=(f"{shim_gone}; the command (pid {job['child_pid']}) still runs, unsupervised",),
            )
        # Ranks that left the command's session outlive it: the attempt ends once they are gone too.
        running, stopped = settle_orphans(state_dir, job, SHIM)
        if stopped is None:
            still = f"{len(running)} of its processes" if running else "its processes"
            return JobStatus(
                phase=JobPhase.RUNNING,
                started_at=started_at,
                cancelled=cancelled,
                evidence=(f"{shim_gone} and the command (pid {job['child_pid']}) has exited;"
                          f" stopping {still} still running{f' ({name_processes(running)})' if running else ''}",),
            )
        return JobStatus(
            phase=JobPhase.VANISHED,
            started_at=started_at,
            cancelled=cancelled,
            evidence=(f"{shim_gone} and left no exit status", *stopped, *full_disk_evidence(state_dir)),
        )

    def cancel(self, handle: JobHandle) -> None:
        """Ask the shim to stop the job (SIGTERM, then SIGKILL after the grace).

        If the shim itself is gone but processes of the job still run, a detached `--kill-tree`
        helper does the same escalation to all of them, so that the caller can exit at once. With no shim, nobody is
        left to record an exit status: poll() reports VANISHED, with cancelled=True.
        """
        state_dir = Path(handle.state_dir)
        job = read_json(state_dir / "job.json")
        if job is None:
            raise NotFound(f"job {handle.job_id}: no local job was started in {state_dir}")
        stop_job(state_dir, job, SHIM)

    def logs(self, handle: JobHandle) -> Path:
        launch = read_json(Path(handle.state_dir) / "launch.json")
        if launch is None:
            raise NotFound(f"job {handle.job_id}: no local job was launched in {handle.state_dir}")
        return Path(launch["log_path"])

    def _lease(self, inventory: list[GpuInfo], request: LaunchRequest) -> list[int]:
        if request.gpus == 0:
            return []
        me = {"pid": os.getpid(), "create_time": process_create_time(os.getpid()),
              "state_dir": str(request.state_dir), "attempt_id": request.attempt_id}
        with self.leases.locked():
            gpu_ids = choose_gpus(inventory, self._live_leases(), request.gpus)
            for index in gpu_ids:
                path = self.leases.path(index)
                path.unlink(missing_ok=True)  # stale: _live_leases() saw its holder dead
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(me, f)
        return gpu_ids

    def _live_leases(self) -> set[int]:
        live = set()
        for entry in self.leases.directory.iterdir():
            if not entry.name.isdigit():
                continue
            holder = self.leases.read(int(entry.name))
            if holder is not None and same_process(holder.get("pid"), holder.get("create_time")):
                live.add(int(entry.name))
        return live

    def _release_own(self, gpu_ids: list[int], state_dir: Path) -> None:
        if not gpu_ids:
            return
        with self.leases.locked():
            for index in gpu_ids:
                holder = self.leases.read(index)
                if holder is not None and holder.get("state_dir") == str(state_dir):
                    self.leases.path(index).unlink(missing_ok=True)

    def _start_shim(self, state_dir: Path) -> dict:
        """Have the host shim start the command and wait until it reports it started (or failed to)."""
        try:
            return request_start(self.home, state_dir, SHIM_START_TIMEOUT_S)
        except (StartFailed, HostUnavailable) as exc:
            # Nothing may start after the caller gave up: a command started late is killed.
            late = read_json(state_dir / "job.json")
            if late is not None and late.get("pgid"):
                signal_group(late["pgid"], signal.SIGKILL)
            raise ExecutorError(f"local shim {exc}") from None
