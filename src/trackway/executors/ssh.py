"""The SSH executor: attempts on machines reached over SSH (workstations, shared boxes, rented spot pods).

`submit()` picks a host of the resource, asks it what it already holds, then sends it what the
attempt needs in one tar (the remote agent and shim, once per host; the code snapshot, once per
commit and diff; the attempt's launch.json and config) and starts the shim there detached in its
own process group over the same SSH call, and returns: two calls a launch. The shim's contract is
the local executor's: exit status and signal in exit.json, a timestamped output.log, the time
limit, SIGTERM then SIGKILL to the group.

    on the host, under the resource's workdir W:
      .trackway/<hash>/agent.py, local_shim.py   stdlib only (python3 is all a host needs), with the
                                                 process_tree.py and node_sampler.py the shim imports
      code/<key>/                                the run's recorded commit + diff (code_snapshot.py)
      attempts/<attempt>/                        launch.json, job.json, exit.json, output.log, spool/
      runs/<run>/checkpoints/                    the run's local checkpoints: a cache, when the run's
                                                 checkpoint root is an object store

    here, in the attempt's state directory:
      ssh-job.json     host, remote paths, the host's boot id at launch, the resource's window
      ssh-reach.json   unreachable since when, and why (absent while the host answers)
      ssh-final.json   the end once known: later polls read it instead of asking the host
      output.log, spool/   copies of the host's, pulled by offset on every poll

`poll_many()` asks each host once for all of its attempts (the agent's `poll`, over the host's
long-lived session, ssh_session.py; the hosts side by side), and appends the new bytes of
output.log and the spool's files here, so that the supervisor ingests metrics, events and notes
while the attempt runs, never reading a byte twice.

Losing a host is not the job's death. A host that does not answer is polled again, with the
attempt shown `unreachable since ...`, for the resource's `unreachable_seconds`; if it comes back
with the job still running, the job is adopted. A host that comes back rebooted (its boot id
changed) or with the attempt's directory gone, or that never comes back within the window, ends
the attempt with the resource's reason: `preempted` when it is preemptible (a reclaimed spot
pod), `infra_transient` otherwise, with the evidence. The host is then avoided by the next
submits for that window, so a retry goes to another host of the resource.

A run over several nodes (`--nodes N`) is a gang of N such jobs, one a host, started all or none
and ended as one attempt: see ssh_gang.py.
"""

from __future__ import annotations

import base64
import fcntl
import fnmatch
import hashlib
import io
import json
import os
import posixpath
import shlex
import tarfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from trackway.errors import ExecutorError, NotFound
from trackway.executors import local_shim, node_sampler, process_tree, remote_agent, ssh_gang
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
from trackway.executors.ssh_session import AgentSession, SessionLost
from trackway.executors.ssh_transport import HostUnreachable, SshClient, SshTarget
from trackway.spool import LOCAL_ONLY_FILES

JOB_FILE = "ssh-job.json"
REACH_FILE = "ssh-reach.json"
FINAL_FILE = "ssh-final.json"
CANCEL_FILE = "cancel.json"
# Bytes pulled per host per poll, in all: a burst of logging catches up over a few polls.
PULL_BYTES = 8 << 20
POLL_THREADS = 16  # hosts asked at once by one poll_many()
# Environment that names this machine's paths or ledger: never sent to a host (it gets its own paths).
LOCAL_ONLY_ENV = ("TRACKWAY_HOME", "TRACKWAY_DB", "TRACKWAY_RESUME_PATH")


def _support_hash() -> str:
    digest = hashlib.sha256()
    for module in (remote_agent, local_shim, process_tree, node_sampler):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class RemoteJob:
    """What ssh-job.json holds: enough to reach and read the attempt from any process."""

    target: SshTarget
    key_file: str | None
    options: tuple[str, ...]
    python: str
    remote_dir: str  # the attempt's directory on the host
    agent: str  # the agent's path on the host
    boot_id: str | None
    unreachable_s: float
    lost_reason: str
    local_log: str
    resource: str | None
    local_dir: str | None = None  # where the spool is pulled; None: the state directory

    @classmethod
    def load(cls, state_dir: Path) -> RemoteJob:
        data = read_json(state_dir / JOB_FILE)
        if data is None:
            raise NotFound(f"no SSH job was launched from {state_dir}")
        return cls(target=SshTarget.parse(data["host"]), key_file=data.get("key_file"),
                   options=tuple(data.get("ssh_options") or ()), python=data["python"],
                   remote_dir=data["remote_dir"], agent=data["agent"], boot_id=data.get("boot_id"),
                   unreachable_s=float(data["unreachable_seconds"]), lost_reason=data["lost_reason"],
                   local_log=data["local_log"], resource=data.get("resource"), local_dir=data.get("local_dir"))

    def client(self) -> SshClient:
        return SshClient(self.target, self.key_file, self.options)


class SshExecutor(Executor):
    """Runs attempts on a resource's SSH hosts; see the module docstring for the files and the host-loss rules."""

    name = "ssh"
    remote = True

    def __init__(self, home: Path):
        self.home = Path(home)
        self._sessions: dict[tuple, AgentSession] = {}
        self._sessions_lock = threading.Lock()

    # -- submit ------------------------------------------------------------------------------

    def submit(self, request: LaunchRequest) -> Submission:
        resource = self._resource_of(request)
        state_dir = Path(request.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        if (state_dir / JOB_FILE).exists() or ssh_gang.is_gang(state_dir):
            raise ExecutorError(f"attempt {request.attempt_id}: {state_dir} already holds a started job")
        if request.nodes > 1:
            return ssh_gang.submit_gang(self, request)
        tried = []
        for spec in self._host_order(resource):
            client = SshClient(SshTarget.parse(spec), resource.key_file, resource.ssh_options)
            gpu_ids = self._lease(spec, resource, request)
            if gpu_ids is None:
                tried.append(f"{spec}: its {resource.gpus_per_node} GPUs are leased to running attempts")
                continue
            try:
                return self._submit_to(client, request, gpu_ids)
            except HostUnreachable as exc:
                self._note_lost(spec, str(exc))
                tried.append(str(exc))
            except BaseException:
                self._release(spec, state_dir)
                raise
            self._release(spec, state_dir)
        raise ExecutorError(f"attempt {request.attempt_id}: no host of resource {resource.name} could take it: "
                            + "; ".join(tried))

    def _submit_to(self, client: SshClient, request: LaunchRequest, gpu_ids: list[int],
                   local_dir: Path | None = None) -> Submission:
        """Start the attempt on one host. `local_dir`: where its spool is pulled, when not its state directory
        (the first node of a gang: the attempt's own)."""
        resource = request.resource
        support = _support_hash()
        # `{host}` in the workdir: hosts that share a file system (an NFS home) keep their own directories.
        workdir_q = shlex.quote(resource.workdir.replace("{host}", client.target.host))
        code = request.code
        probe = [f"mkdir -p {workdir_q} && cd {workdir_q} && pwd",
                 "cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -",
                 f"test -f .trackway/{support}/agent.py && echo agent || echo -",
                 f"test -f code/{code.key}/.complete && echo code || echo -" if code is not None else "echo -"]
        lines = client.run(" ; ".join(probe)).decode("utf-8", "replace").split("\n")
        remote_root, boot_id, has_agent, has_code = (lines + ["-"] * 4)[:4]
        if not remote_root.startswith("/"):
            raise ExecutorError(f"{client.target.spec}: could not enter the working directory {resource.workdir}")
        attempt_rel, remote_dir, launch, inputs = self._launch_of(request, remote_root, gpu_ids)
        files: dict[str, bytes] = {f"{attempt_rel}/launch.json": json.dumps(launch, indent=1).encode()}
        files.update({f"{attempt_rel}/{rel}": Path(local).read_bytes() for rel, local in inputs.items()})
        if has_agent != "agent":
            files.update(_support_files(support))
        bundle = _bundle(files, code if code is not None and has_code != "code" else None)
        agent = posixpath.join(remote_root, ".trackway", support, "agent.py")
        # The files and the start over one call: each call is a login on the host, which runs its shell's rc files
        # (with pyenv's init, about 0.1 s of the host's CPU), and a failed extract stops the call before the start.
        answer = self._agent(client, resource.python, agent, ["start", remote_dir], stdin=bundle,
                             setup=f"cd {workdir_q} && mkdir -p {shlex.quote(attempt_rel)}/spool && tar -xzf - "
                                   f"&& chmod 700 {shlex.quote(attempt_rel)}")
        if "error" in answer or "job" not in answer:
            said = answer.get("error") or "the agent vanished from the host while starting the attempt"
            raise ExecutorError(f"attempt {request.attempt_id} on {client.target.spec}: {said}")
        job = answer["job"]
        write_json_atomic(Path(request.state_dir) / JOB_FILE, {
            "host": client.target.spec, "key_file": resource.key_file, "ssh_options": list(resource.ssh_options),
            "python": resource.python, "remote_dir": remote_dir, "agent": agent,
            "boot_id": answer.get("boot_id") or (boot_id if boot_id != "-" else None),
            "unreachable_seconds": resource.unreachable_seconds,
            "lost_reason": "preempted" if resource.preemptible else "infra_transient",
            "local_log": str(request.log_path), "resource": resource.name, "job": job,
            "local_dir": str(local_dir) if local_dir is not None else None,
            "code": {"key": code.key, "source": code.source, "missing": code.missing} if code is not None else None,
            "submitted_at": utc_now().isoformat(),
        })
        return self._submission(Path(request.state_dir), client.target.spec, job)

    def _launch_of(self, request: LaunchRequest, remote_root: str,
                   gpu_ids: list[int]) -> tuple[str, str, dict, dict[str, str]]:
        """The attempt's directory on the host (relative to the workdir, and whole), its launch.json, and the files
        it reads (their path there -> the file here): submit() sends them, preview() shows them."""
        resource = request.resource
        code = request.code
        attempt_rel = f"attempts/{request.attempt_id}"
        remote_dir = posixpath.join(remote_root, attempt_rel)
        run_id = request.env.get("TRACKWAY_RUN_ID") or request.attempt_id.split("/")[0]
        cwd = posixpath.normpath(posixpath.join(remote_root, "code", code.key, code.cwd)) if code is not None \
            else str(request.cwd)
        env, inputs = self._remote_env(request, remote_dir, posixpath.join(remote_root, "runs", run_id, "checkpoints"))
        if gpu_ids:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
        command = list(request.command)
        if resource.setup:
            # The prologue (venv activation, module loads) in the shell that then becomes the command.
            command = ["/bin/bash", "-c", resource.setup + "\nexec \"$@\"", "trackway-setup", *command]
        launch = {
            "attempt_id": request.attempt_id, "command": command, "cwd": cwd, "env": env, "env_is_complete": False,
            "log_path": posixpath.join(remote_dir, "output.log"), "time_limit_s": request.time_limit_s,
            "grace_s": request.grace_s, "gpu_ids": gpu_ids, "lease_dir": None, "executor": self.name,
        }
        return attempt_rel, remote_dir, launch, inputs

    def preview(self, request: LaunchRequest) -> str:
        """The host submit() would choose now (nothing leased), and what it would send and run there."""
        from trackway.executors.previews import environment_lines, limit_line

        resource = self._resource_of(request)
        chosen, passed = None, []
        for spec in self._host_order(resource):
            gpu_ids = self._free_on(spec, resource, request)
            if gpu_ids is None:
                passed.append(f"{spec}: its {resource.gpus_per_node} GPUs are leased to running attempts")
                continue
            chosen = (spec, gpu_ids)
            break
        if chosen is None:
            return f"executor ssh: no host of resource {resource.name} could take it now: " + "; ".join(passed)
        spec, gpu_ids = chosen
        target = SshTarget.parse(spec)
        workdir = resource.workdir.replace("{host}", target.host)
        attempt_rel, remote_dir, launch, inputs = self._launch_of(request, workdir, gpu_ids)
        agent = posixpath.join(workdir, ".trackway", _support_hash(), "agent.py")
        gang = f"; node 0 of a gang over {request.nodes} hosts (ssh_gang.py: the next hosts in this order)" \
            if request.nodes > 1 else ""
        code = request.code
        lines = [
            f"executor ssh: host {spec} (the first of resource {resource.name}'s hosts {', '.join(self._host_order(resource))} "
            f"with room now{gang})" + (f"; passed over: {'; '.join(passed)}" if passed else ""),
            f"over ssh: `mkdir -p {shlex.quote(workdir)}`, then one tar into it: {attempt_rel}/launch.json"
            + "".join(f", {attempt_rel}/{rel}" for rel in sorted(inputs))
            + (f", code/{code.key}/ ({code.source}, {len(code.tar_gz)} bytes gzipped, unless the host holds it)"
               if code is not None else "")
            + ", and the agent and shim unless the host holds them",
            f"then: `{shlex.join([resource.python, agent, 'start', remote_dir])}` (the shim, detached)",
            f"command: {shlex.join(launch['command'])}",
            f"working directory: {launch['cwd']}",
            f"GPUs: {','.join(map(str, gpu_ids))} (CUDA_VISIBLE_DEVICES on the host)" if gpu_ids else "GPUs: none asked",
            limit_line(launch["time_limit_s"], launch["grace_s"]),
            f"output: {launch['log_path']} on the host, pulled to {request.log_path}",
            *environment_lines(launch["env"], request, added_to="the host's login environment"),
            f"(the workdir {workdir} is as declared: the host resolves it when the attempt starts)",
        ]
        return "\n".join(lines)

    def _resource_of(self, request: LaunchRequest):
        resource = request.resource
        if resource is None or not resource.hosts:
            raise ExecutorError(f"attempt {request.attempt_id}: the ssh executor needs a resource with hosts "
                                "(trackway.toml: [resources.NAME] executor = \"ssh\", hosts = [...])")
        return resource

    def _submission(self, state_dir: Path, host: str, job: dict) -> Submission:
        return Submission(
            handle=JobHandle(executor=self.name, job_id=f"{job['shim_pid']}@{host}", state_dir=state_dir),
            host=host, gpu_ids=list(job.get("gpu_ids") or []), gpu_model=None,
            started_at=datetime.fromisoformat(job["started_at"]), pid=job.get("child_pid"),
        )

    def adopt(self, state_dir: Path) -> Submission | None:
        if ssh_gang.is_gang(Path(state_dir)):
            return ssh_gang.adopt_gang(self, Path(state_dir))
        data = read_json(Path(state_dir) / JOB_FILE)
        if not data or not data.get("job"):
            return None
        return self._submission(Path(state_dir), data["host"], data["job"])

    def _remote_env(self, request: LaunchRequest, remote_dir: str,
                    checkpoint_dir: str) -> tuple[dict[str, str], dict[str, str]]:
        """The attempt's variables with this machine's paths replaced by the host's, and the files to send.

        The submitter's own environment stays here (its PATH and HOME mean nothing on the host),
        except the variables the resource's `forward_env` names (credentials for the checkpoint store).
        A TRACKWAY_* variable naming a file here (the attempt's config, an evaluation's parameters,
        its training config) names a copy sent to the attempt's directory on the host: the second
        dict maps each copy's path there (relative to the attempt's directory) to the file here.
        """
        source = request.env if request.run_env is None else request.run_env
        env = {name: value for name, value in source.items() if name not in LOCAL_ONLY_ENV}
        patterns = request.resource.forward_env if request.resource is not None else ()
        forwarded = {name: value for name, value in request.env.items()
                     if name not in env and name not in LOCAL_ONLY_ENV
                     and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)}
        env = {**forwarded, **env}
        env["TRACKWAY_SPOOL_DIR"] = posixpath.join(remote_dir, "spool")
        env["TRACKWAY_CHECKPOINT_DIR"] = checkpoint_dir
        if "TRACKWAY_EVAL_OUTPUT" in env:
            env["TRACKWAY_EVAL_OUTPUT"] = posixpath.join(remote_dir, Path(env["TRACKWAY_EVAL_OUTPUT"]).name)
        inputs = {}
        for name, value in sorted(env.items()):
            if name.startswith("TRACKWAY_") and value.startswith("/") and Path(value).is_file():
                rel = f"inputs/{name.lower()}-{Path(value).name}"
                inputs[rel] = value
                env[name] = posixpath.join(remote_dir, rel)
        # A job that asked for no GPU must not take one another attempt on the host uses.
        if not request.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env, inputs

    def _host_order(self, resource) -> list[str]:
        """The resource's hosts in order, those lost within their window last (a retry goes elsewhere first)."""
        lost = read_json(self._lost_file()) or {}
        now = time.time()
        recent = {spec for spec, when in lost.items()
                  if isinstance(when, dict) and now - when.get("at", 0) < resource.unreachable_seconds}
        return [spec for spec in resource.hosts if spec not in recent] + [s for s in resource.hosts if s in recent]

    def _lease(self, spec: str, resource, request: LaunchRequest) -> list[int] | None:
        """GPU indices on `spec` no live attempt of ours holds ([] when none was asked); None when too few are free.

        The leases live here, not on the host: trackway is the one scheduler of a resource's hosts.
        A lease ends when its attempt's end is recorded (ssh-final.json) or its directory is gone.
        """
        path = lease_file(self.home, spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_suffix(".lock")):
            leases = _live_leases(path)
            if not request.gpus:
                leases.pop(str(request.state_dir), None)
                write_json_atomic(path, leases)
                return []
            picked = _pick(leases, resource, request)
            if picked is not None:
                leases[str(request.state_dir)] = picked
                write_json_atomic(path, leases)
            return picked

    def _free_on(self, spec: str, resource, request: LaunchRequest) -> list[int] | None:
        """The GPUs _lease() would take on `spec` now, leasing nothing."""
        return _pick(_live_leases(lease_file(self.home, spec)), resource, request) if request.gpus else []

    def _release(self, spec: str, state_dir: Path) -> None:
        path = lease_file(self.home, spec)
        if not path.exists():
            return
        with _locked(path.with_suffix(".lock")):
            leases = read_json(path) or {}
            if leases.pop(str(state_dir), None) is not None:
                write_json_atomic(path, leases)

    def _lost_file(self) -> Path:
        return self.home / "ssh" / "lost-hosts.json"

    def _note_lost(self, spec: str, why: str) -> None:
        path = self._lost_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_suffix(".lock")):
            lost = read_json(path) or {}
            lost[spec] = {"at": time.time(), "why": why[:300]}
            write_json_atomic(path, lost)

    # -- poll --------------------------------------------------------------------------------

    def poll(self, handle: JobHandle) -> JobStatus:
        return self.poll_many([handle])[handle.job_id]

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        statuses: dict[str, JobStatus] = {}
        by_host: dict[str, list[tuple[JobHandle, RemoteJob]]] = {}
        for handle in handles:
            state_dir = Path(handle.state_dir)
            final = read_json(state_dir / FINAL_FILE)
            if final is not None:
                statuses[handle.job_id] = status_from_json(final)
                continue
            if ssh_gang.is_gang(state_dir):
                statuses[handle.job_id] = ssh_gang.poll_gang(self, handle)
                continue
            try:
                job = RemoteJob.load(state_dir)
            except NotFound as exc:
                statuses[handle.job_id] = JobStatus(phase=JobPhase.VANISHED, evidence=(str(exc),))
                continue
            by_host.setdefault(job.target.spec, []).append((handle, job))
        if len(by_host) <= 1:
            for spec, group in by_host.items():
                statuses.update(self._poll_host(spec, group))
            return statuses
        # Side by side: a host that went silent costs the tick its connect timeout once, not once per host.
        with ThreadPoolExecutor(max_workers=min(POLL_THREADS, len(by_host)), thread_name_prefix="trackway-ssh-poll") as pool:
            for found in pool.map(lambda item: self._poll_host(*item), by_host.items()):
                statuses.update(found)
        return statuses

    def _poll_host(self, spec: str, group: list[tuple[JobHandle, RemoteJob]]) -> dict[str, JobStatus]:
        first = group[0][1]
        request = {"attempts": [{"dir": job.remote_dir, "offsets": _offsets(Path(h.state_dir), job)}
                                for h, job in group], "max_bytes": PULL_BYTES}
        try:
            answer = self._ask(first.client(), first.python, first.agent, ["poll"], request)
        except HostUnreachable as exc:
            return {h.job_id: self._unreachable(h, job, str(exc)) for h, job in group}
        statuses = {}
        for handle, job in group:
            state_dir = Path(handle.state_dir)
            reached = _clear_unreachable(state_dir)
            found = (answer.get("attempts") or {}).get(job.remote_dir, {"exists": False})
            complete = _apply_files(state_dir, job, found.get("files") or {})
            status = self._status(handle, job, answer.get("boot_id"), found, complete, reached)
            statuses[handle.job_id] = self._settle(handle, status)
        return statuses

    def _status(self, handle: JobHandle, job: RemoteJob, boot_id: str | None, found: dict, complete: bool,
                reached: dict | None) -> JobStatus:
        state_dir = Path(handle.state_dir)
        placement = {"host": job.target.spec, "remote_dir": job.remote_dir, "resource": job.resource}
        back = []
        if reached is not None:
            away = time.time() - reached["since_epoch"]
            back.append(f"host {job.target.spec} answered again after {away:.0f} s unreachable")
        if job.boot_id and boot_id and boot_id != job.boot_id:
            return self._lost(handle, job, back + [
                f"host {job.target.spec} rebooted: boot id {job.boot_id} at launch, {boot_id} now; the attempt's "
                "processes died with it"])
        if not found.get("exists"):
            return self._lost(handle, job, back + [
                f"the attempt's directory {job.remote_dir} is gone from host {job.target.spec} (the machine was "
                "replaced or its disk wiped)"])
        started_at = _iso((found.get("job") or {}).get("started_at"))
        cancelled = (state_dir / CANCEL_FILE).exists() or bool(found.get("cancel_requested"))
        ended = found.get("exit")
        if ended is not None and complete:
            return JobStatus(
                phase=JobPhase.ENDED, exit_code=ended["exit_code"], signal=ended["signal"], started_at=started_at,
                ended_at=_iso(ended["ended_at"]), timed_out=ended["timed_out"], cancelled=ended["cancelled"],
                evidence=(*back, f"ran on host {job.target.spec} in {job.remote_dir}", *ended["evidence"]),
                placement=placement,
            )
        if ended is not None or found.get("shim_alive"):
            # Ended, with output still to pull: reported running until every byte is here.
            return JobStatus(phase=JobPhase.RUNNING, started_at=started_at, cancelled=cancelled,
                             evidence=tuple(back + ([f"adopted: the job still runs on {job.target.spec}"] if back else [])),
                             placement=placement)
        if found.get("job") is None:
            return JobStatus(phase=JobPhase.VANISHED, cancelled=cancelled, placement=placement,
                             evidence=(*back, f"no job.json in {job.remote_dir} on {job.target.spec}: the shim never "
                                              "started the command"))
        if found.get("child_alive"):
            return JobStatus(phase=JobPhase.RUNNING, started_at=started_at, cancelled=cancelled, placement=placement,
                             evidence=(*back, f"the shim on {job.target.spec} is gone; the command still runs, "
                                              "unsupervised"))
        if found.get("stopping") is not None:
            named = f" ({', '.join(found['stopping'])})" if found["stopping"] else ""
            return JobStatus(phase=JobPhase.RUNNING, started_at=started_at, cancelled=cancelled, placement=placement,
                             evidence=(*back, f"the shim and the command on {job.target.spec} are gone; stopping "
                                              f"the job's processes still running{named}"))
        return JobStatus(phase=JobPhase.VANISHED, started_at=started_at, cancelled=cancelled, placement=placement,
                         evidence=(*back, f"the shim and the command on {job.target.spec} are gone and left no exit "
                                          "status (killed on the host)", *found.get("stopped", [])))

    def _unreachable(self, handle: JobHandle, job: RemoteJob, why: str) -> JobStatus:
        state_dir = Path(handle.state_dir)
        reach = read_json(state_dir / REACH_FILE)
        now = utc_now()
        if reach is None:
            reach = {"since": now.isoformat(), "since_epoch": time.time(), "why": why}
        reach["last_error"] = why
        reach["last_try"] = now.isoformat()
        write_json_atomic(state_dir / REACH_FILE, reach)
        away = time.time() - reach["since_epoch"]
        placement = {"host": job.target.spec, "remote_dir": job.remote_dir, "resource": job.resource,
                     "unreachable_since": reach["since"]}
        if away < job.unreachable_s:
            return JobStatus(phase=JobPhase.RUNNING, placement=placement, cancelled=(state_dir / CANCEL_FILE).exists(),
                             evidence=(f"host {job.target.spec} unreachable since {reach['since']} ({why}); polled "
                                       f"again until {job.unreachable_s:g} s have passed",))
        self._note_lost(job.target.spec, why)
        return self._settle(handle, self._lost(handle, job, [
            f"host {job.target.spec} unreachable since {reach['since']}: no answer for {away:.0f} s, past the "
            f"resource's unreachable_seconds ({job.unreachable_s:g}); last error: {why}"]))

    def _lost(self, handle: JobHandle, job: RemoteJob, evidence: list[str]) -> JobStatus:
        self._note_lost(job.target.spec, evidence[-1])
        state_dir = Path(handle.state_dir)
        data = read_json(state_dir / JOB_FILE) or {}
        cancelled = (state_dir / CANCEL_FILE).exists()
        why = "the resource is preemptible: a reclaimed spot machine" if job.lost_reason == "preempted" else \
            "the resource is not preemptible: an infrastructure failure"
        return JobStatus(
            phase=JobPhase.VANISHED,
            started_at=_iso((data.get("job") or {}).get("started_at")),
            ended_at=utc_now(),
            cancelled=cancelled,
            reason=None if cancelled else job.lost_reason,
            evidence=(*evidence, f"host lost: ended as {job.lost_reason} ({why})"),
            placement={"host": job.target.spec, "remote_dir": job.remote_dir, "resource": job.resource,
                       "host_lost": True},
        )

    def _settle(self, handle: JobHandle, status: JobStatus) -> JobStatus:
        if status.phase.is_terminal():
            try:
                write_json_atomic(Path(handle.state_dir) / FINAL_FILE, status_to_json(status))
            except OSError:
                pass  # the next poll asks the host again
        return status

    # -- cancel, logs ------------------------------------------------------------------------

    def cancel(self, handle: JobHandle) -> None:
        """Note that trackway asked, then have the host's agent SIGTERM the shim (SIGKILL after the grace)."""
        state_dir = Path(handle.state_dir)
        if ssh_gang.is_gang(state_dir):
            return ssh_gang.cancel_gang(self, handle)
        job = RemoteJob.load(state_dir)
        if (state_dir / FINAL_FILE).exists():
            return
        if not (state_dir / CANCEL_FILE).exists():
            write_json_atomic(state_dir / CANCEL_FILE, {"requested_at": utc_now().isoformat()})
        try:
            self._agent(job.client(), job.python, job.agent, ["cancel", job.remote_dir], timeout_s=30)
        except HostUnreachable:
            pass  # the host's loss (or return) is what poll() reports; cancel.json says it was ours

    def logs(self, handle: JobHandle) -> Path:
        if ssh_gang.is_gang(Path(handle.state_dir)):
            return ssh_gang.gang_log(Path(handle.state_dir))
        return Path(RemoteJob.load(Path(handle.state_dir)).local_log)

    def ask_agent(self, client: SshClient, python: str, remote_root: str, args: list[str]) -> dict:
        """This trackway's agent's answer on a host (under `remote_root`, the resource's workdir there), the agent
        sent first when the host holds only another version's, or none (as a submit sends it)."""
        support = _support_hash()
        agent = posixpath.join(remote_root, ".trackway", support, "agent.py")
        answer = self._agent(client, python, agent, args)
        if not answer.get("agent_missing"):
            return answer
        return self._agent(client, python, agent, args, stdin=_bundle(_support_files(support), None),
                           setup=f"cd {shlex.quote(remote_root)} && tar -xzf -")

    def _ask(self, client: SshClient, python: str, agent: str, args: list[str], request: dict) -> dict:
        """The agent's answer, asked over the host's long-lived session (ssh_session.py), else over a call of its own."""
        key = (tuple(client.argv("")), python, agent)
        with self._sessions_lock:
            session = self._sessions.get(key)
            if session is None:
                session = self._sessions[key] = AgentSession(client, python, agent)
        try:
            return session.ask(args, request)
        except SessionLost:
            return self._agent(client, python, agent, args, json.dumps(request).encode())

    def _agent(self, client: SshClient, python: str, agent: str, args: list[str], stdin: bytes | None = None,
               timeout_s: float | None = None, setup: str | None = None) -> dict:
        """The agent's answer; `setup`: a shell command run first over the same call, in a subshell (the agent
        starts where a login starts), whose failure is the call's."""
        # A host whose workdir was wiped has no agent any more: that answers "nothing of yours is here".
        command = (f"if [ -f {shlex.quote(agent)} ]; then exec "
                   + " ".join(shlex.quote(part) for part in [python, agent, *args])
                   + "; else echo '{\"agent_missing\": true}'; fi")
        if setup is not None:
            command = f"( {setup} ) && {command}"
        out = client.run(command, stdin=stdin, **({"timeout_s": timeout_s} if timeout_s else {}))
        try:
            return json.loads(out)
        except ValueError:
            raise ExecutorError(f"{client.target.spec}: the agent answered {out[:200]!r}, not JSON") from None


def lease_file(home: Path, spec: str) -> Path:
    """Where trackway keeps the GPU leases of one SSH host (`user@host:port`)."""
    return home / "ssh" / "leases" / (hashlib.sha256(spec.encode()).hexdigest()[:16] + ".json")


def _pick(leases: dict[str, list[int]], resource, request: LaunchRequest) -> list[int] | None:
    """The lowest GPU indices no live lease holds, as many as the request asks; None when too few are free."""
    used = {index for ids in leases.values() for index in ids}
    total = resource.gpus_per_node if resource.gpus_per_node is not None else request.gpus
    free = [index for index in range(total) if index not in used]
    return free[:request.gpus] if len(free) >= request.gpus else None


def _live_leases(path: Path) -> dict[str, list[int]]:
    leases = read_json(path) or {}
    return {d: ids for d, ids in leases.items() if Path(d).is_dir() and not (Path(d) / FINAL_FILE).exists()}


def leased_gpus(home: Path, spec: str) -> dict[str, list[int]]:
    """The GPU indices of `spec` that live attempts of this home hold, by attempt directory."""
    return _live_leases(lease_file(home, spec))


class _locked:  # noqa: N801 - a context manager
    """An exclusive flock on `path` for the block: one submitter at a time edits a host's leases."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info) -> None:
        os.close(self.fd)


def _support_files(support: str) -> dict[str, bytes]:
    """The agent and the shim it runs, as a host keeps them (relative to the workdir)."""
    return {f".trackway/{support}/{name}": Path(module.__file__).read_bytes()
            for name, module in (("local_shim.py", local_shim), ("process_tree.py", process_tree),
                                 ("node_sampler.py", node_sampler), ("agent.py", remote_agent))}


def _bundle(files: dict[str, bytes], code) -> bytes:
    """One gzip tar of the files to send (paths relative to the workdir), the code snapshot under code/<key>/."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        if code is not None:
            with tarfile.open(fileobj=io.BytesIO(code.tar_gz)) as inner:
                for member in inner.getmembers():
                    if not (member.isfile() or member.isdir()):
                        continue
                    member.name = f"code/{code.key}/{member.name}"
                    tar.addfile(member, inner.extractfile(member) if member.isfile() else None)
            done = tarfile.TarInfo(f"code/{code.key}/.complete")  # last: a snapshot cut short is sent again
            done.mtime = int(time.time())
            tar.addfile(done, io.BytesIO(b""))
    return buffer.getvalue()


def _local_path(state_dir: Path, job: RemoteJob, rel: str) -> Path:
    return Path(job.local_log) if rel == "output.log" else Path(job.local_dir or state_dir) / rel


def _offsets(state_dir: Path, job: RemoteJob) -> dict[str, int]:
    """How much of each remote file is already here: the sizes of the local copies."""
    offsets = {}
    state_dir = Path(job.local_dir or state_dir)
    candidates = [("output.log", Path(job.local_log)), ("eval-output.jsonl", state_dir / "eval-output.jsonl")]
    spool = state_dir / "spool"
    if spool.is_dir():
        candidates += [(f"spool/{entry.name}", Path(entry.path)) for entry in os.scandir(spool)
                       if entry.name.endswith(".jsonl") and entry.name not in LOCAL_ONLY_FILES]
    for rel, path in candidates:
        try:
            offsets[rel] = path.stat().st_size
        except OSError:
            continue
    return offsets


def _apply_files(state_dir: Path, job: RemoteJob, files: dict) -> bool:
    """Append what the host sent; True when every file is now complete here."""
    complete = True
    for rel, item in files.items():
        if (rel.startswith("spool/") and rel[len("spool/"):] in LOCAL_ONLY_FILES) or ".." in rel.split("/"):
            continue
        path = _local_path(state_dir, job, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = base64.b64decode(item.get("data") or "")
        if item.get("whole"):
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            continue
        if item.get("shrank"):
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Appended only where the host's offset is our size: a second poller racing us never doubles bytes.
            if os.fstat(fd).st_size == item["offset"] and data:
                os.write(fd, data)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size < item["size"]:
            complete = False
    return complete


def _clear_unreachable(state_dir: Path) -> dict | None:
    reach = read_json(state_dir / REACH_FILE)
    if reach is not None:
        (state_dir / REACH_FILE).unlink(missing_ok=True)
    return reach


def _iso(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
