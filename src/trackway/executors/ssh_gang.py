"""An SSH gang: one attempt over N hosts of a resource, a node per host, started all or none and ended as one.

`SshExecutor.submit()` hands a request with `nodes > 1` here. Each node is an ordinary SSH job of
the executor (ssh.py: its own shim, exit.json and pulled output), in a directory of its own under
the attempt's; the gang's file says which:

    STATE_DIR/
      ssh-gang.json      the nodes (rank, host, directory, job id) and the rendezvous they share
      gang-stop.json     the node whose end ended the gang, and when the others were told to stop
      nodes/K/           node K's ssh-job.json, ssh-final.json ...; node 0's output.log and spool
                         are the attempt's own (STATE_DIR/output.log, STATE_DIR/spool), the other
                         nodes' output is in nodes/K/output.log

Every node gets the same rendezvous: MASTER_ADDR (the first host's address), MASTER_PORT (one of
the attempt's own, unless the run set one), NNODES and WORLD_SIZE (the node count), and its own
NODE_RANK and RANK, so `torchrun --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR
--master_port=$MASTER_PORT` works as written, and a script of one process a node needs no launcher.

All or none: a node that cannot start stops the nodes started before it, and the launch fails
naming that host. One node's end (its exit, or its host lost past the resource's window) stops the
others; the gang ends, as one attempt, once every node has ended, with the exit status and reason
of the node that ended it and every node named in the evidence.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from trackway.errors import ExecutorError, NotFound
from trackway.executors.base import JobHandle, JobPhase, JobStatus, LaunchRequest, Submission, status_to_json
from trackway.executors.local_shim import read_json, utc_now, write_json_atomic
from trackway.executors.ssh_transport import HostUnreachable, SshClient, SshTarget

GANG_FILE = "ssh-gang.json"
STOP_FILE = "gang-stop.json"
NODES_DIR = "nodes"
# How long a launch that failed on one host waits for the nodes it already started to end.
STOP_WAIT_S = 30.0


def is_gang(state_dir: Path) -> bool:
    return (Path(state_dir) / GANG_FILE).exists()


def rendezvous(request: LaunchRequest, first_host: str) -> dict[str, str]:
    """The variables every node shares; a port of the attempt's own (20000-29999) unless the run chose one."""
    port = request.env.get("MASTER_PORT") or str(
        20000 + int(hashlib.sha256(request.attempt_id.encode()).hexdigest(), 16) % 10000)
    count = str(request.nodes)
    return {"MASTER_ADDR": SshTarget.parse(first_host).host, "MASTER_PORT": port, "NNODES": count,
            "WORLD_SIZE": count}


def node_request(request: LaunchRequest, rank: int, shared: dict[str, str]) -> LaunchRequest:
    """Node `rank`'s own request: its directory, its log, its share of the GPUs and its NODE_RANK."""
    state_dir = Path(request.state_dir)
    own = {**shared, "NODE_RANK": str(rank), "RANK": str(rank), "LOCAL_RANK": "0"}
    return replace(
        request,
        attempt_id=f"{request.attempt_id}/node{rank}",
        state_dir=state_dir / NODES_DIR / str(rank),
        log_path=Path(request.log_path) if rank == 0 else state_dir / NODES_DIR / str(rank) / "output.log",
        gpus=request.gpus // request.nodes,
        nodes=1,
        env={**request.env, **own},
        run_env=None if request.run_env is None else {**request.run_env, **own},
    )


def submit_gang(executor, request: LaunchRequest) -> Submission:
    """Start a node on each of the first `request.nodes` hosts of the resource, all or none."""
    resource = request.resource
    state_dir = Path(request.state_dir)
    if request.gpus % request.nodes:
        raise ExecutorError(f"attempt {request.attempt_id}: {request.gpus} GPU(s) do not split evenly over "
                            f"{request.nodes} nodes")
    hosts = executor._host_order(resource)[:request.nodes]
    if len(hosts) < request.nodes:
        raise ExecutorError(f"attempt {request.attempt_id}: {request.nodes} nodes asked, resource {resource.name} "
                            f"lists {len(resource.hosts)} host(s)")
    shared = rendezvous(request, hosts[0])
    nodes = [{"rank": rank, "host": spec, "dir": f"{NODES_DIR}/{rank}", "job_id": None}
             for rank, spec in enumerate(hosts)]
    gang = {"nodes": nodes, "rendezvous": shared, "local_log": str(request.log_path),
            "submitted_at": utc_now().isoformat()}
    # Written first: a gang whose launcher died mid-start is found, and its started nodes stopped.
    write_json_atomic(state_dir / GANG_FILE, gang)
    started: list[Submission] = []
    failure = None
    for node in nodes:
        rank, spec = node["rank"], node["host"]
        sub = node_request(request, rank, shared)
        Path(sub.state_dir).mkdir(parents=True, exist_ok=True)
        client = SshClient(SshTarget.parse(spec), resource.key_file, resource.ssh_options)
        gpu_ids = executor._lease(spec, resource, sub)
        if gpu_ids is None:
            failure = f"node {rank} on {spec}: its {resource.gpus_per_node} GPUs are leased to running attempts"
            break
        try:
            submission = executor._submit_to(client, sub, gpu_ids, local_dir=state_dir if rank == 0 else None)
        except (HostUnreachable, ExecutorError) as exc:
            executor._release(spec, Path(sub.state_dir))
            if isinstance(exc, HostUnreachable):
                executor._note_lost(spec, str(exc))
            failure = f"node {rank} on {spec} did not start: {exc}"
            break
        except BaseException:
            executor._release(spec, Path(sub.state_dir))
            _stop_started(executor, started)
            raise
        node["job_id"] = submission.handle.job_id
        write_json_atomic(state_dir / GANG_FILE, gang)
        started.append(submission)
    if failure is not None:
        stopped = _stop_started(executor, started)
        raise ExecutorError(f"attempt {request.attempt_id}: the gang of {request.nodes} nodes started none, "
                            f"all or none: {failure}" + (f"; stopped {stopped}" if stopped else ""))
    first = started[0]
    return Submission(
        handle=JobHandle(executor=executor.name, job_id=f"gang:{first.handle.job_id}", state_dir=state_dir),
        host=first.host, gpu_ids=[], gpu_model=resource.gpu, started_at=first.started_at, pid=None,
    )


def _stop_started(executor, started: list[Submission]) -> str:
    """Stop the nodes a failed launch started, waiting (a while) until each has ended; says which."""
    if not started:
        return ""
    for submission in started:
        try:
            executor.cancel(submission.handle)
        except (HostUnreachable, ExecutorError, NotFound):
            pass
    deadline = time.monotonic() + STOP_WAIT_S
    handles = [submission.handle for submission in started]
    while time.monotonic() < deadline:
        statuses = executor.poll_many(handles)
        if all(status.phase.is_terminal() for status in statuses.values()):
            break
        time.sleep(0.2)
    return ", ".join(f"node {index} on {submission.host}" for index, submission in enumerate(started))


def adopt_gang(executor, state_dir: Path) -> Submission | None:
    gang = read_json(Path(state_dir) / GANG_FILE)
    if not gang or not gang["nodes"][0].get("job_id"):
        return None
    first = gang["nodes"][0]
    return Submission(
        handle=JobHandle(executor=executor.name, job_id=f"gang:{first['job_id']}", state_dir=Path(state_dir)),
        host=first["host"], gpu_ids=[], gpu_model=None,
        started_at=datetime.fromisoformat(gang["submitted_at"]), pid=None,
    )


def _node_handles(executor, state_dir: Path, gang: dict) -> list[JobHandle]:
    return [JobHandle(executor=executor.name, job_id=node.get("job_id") or f"unstarted-node{node['rank']}",
                      state_dir=state_dir / node["dir"]) for node in gang["nodes"]]


def poll_gang(executor, handle: JobHandle) -> JobStatus:
    """The gang as one job: running while every node runs; once one ends the others are stopped, and the
    gang ends when all have."""
    state_dir = Path(handle.state_dir)
    gang = read_json(state_dir / GANG_FILE)
    handles = _node_handles(executor, state_dir, gang)
    polled = executor.poll_many(handles)
    statuses = [polled[h.job_id] for h in handles]
    nodes = gang["nodes"]
    placement = _placement(state_dir, gang, statuses)
    ended = [rank for rank, status in enumerate(statuses) if status.phase.is_terminal()]
    if not ended:
        away = [f"node {rank} on {nodes[rank]['host']}: {status.evidence[0]}" for rank, status in enumerate(statuses)
                if status.evidence and (status.placement or {}).get("unreachable_since")]
        return JobStatus(phase=JobPhase.RUNNING, started_at=_earliest(statuses),
                         cancelled=(state_dir / "cancel.json").exists(), evidence=tuple(away), placement=placement)
    stop = read_json(state_dir / STOP_FILE)
    failed = [rank for rank in ended if not _succeeded(statuses[rank])]
    if stop is None and not failed:
        if len(ended) < len(statuses):
            # A node that finished well waits for the others: they finish the same training.
            return JobStatus(phase=JobPhase.RUNNING, started_at=_earliest(statuses),
                             cancelled=(state_dir / "cancel.json").exists(), placement=placement)
        stop = {"rank": 0, "host": nodes[0]["host"], "why": _ending(statuses[0]), "all_succeeded": True}
    if stop is None:
        first = failed[0]
        stop = {"rank": first, "host": nodes[first]["host"], "at": utc_now().isoformat(),
                "why": _ending(statuses[first])}
        write_json_atomic(state_dir / STOP_FILE, stop)
        for rank, status in enumerate(statuses):
            if not status.phase.is_terminal():
                try:
                    executor.cancel(handles[rank])
                except (HostUnreachable, ExecutorError, NotFound):
                    pass  # a node that cannot be told ends by its host's window (lost) instead
    if len(ended) < len(statuses):
        waiting = ", ".join(f"node {rank} on {nodes[rank]['host']}" for rank, status in enumerate(statuses)
                            if not status.phase.is_terminal())
        return JobStatus(phase=JobPhase.RUNNING, started_at=_earliest(statuses),
                         cancelled=(state_dir / "cancel.json").exists(), placement=placement,
                         evidence=(f"node {stop['rank']} on {stop['host']} ended ({stop['why']}): stopping the "
                                   f"others, waiting for {waiting}",))
    cause = statuses[stop["rank"]]
    ended_by = (f"the gang of {len(nodes)} nodes ended with node {stop['rank']} on {stop['host']}: {stop['why']}"
                if not stop.get("all_succeeded") else f"all {len(nodes)} nodes ended")
    cancelled = (state_dir / "cancel.json").exists()
    summary = [f"node {rank} on {nodes[rank]['host']}: {_ending(status)}" for rank, status in enumerate(statuses)]
    status = JobStatus(
        phase=cause.phase,
        exit_code=cause.exit_code,
        signal=cause.signal,
        started_at=_earliest(statuses),
        ended_at=max((s.ended_at for s in statuses if s.ended_at is not None), default=utc_now()),
        timed_out=any(s.timed_out for s in statuses),
        cancelled=cancelled,
        evidence=(ended_by, *summary, *cause.evidence,
                  *(f"node {rank}'s output: {state_dir / nodes[rank]['dir'] / 'output.log'}"
                    for rank in range(1, len(nodes)))),
        reason=None if cancelled else cause.reason,
        placement=placement,
    )
    try:
        write_json_atomic(state_dir / "ssh-final.json", status_to_json(status))
    except OSError:
        pass  # the next poll combines the nodes' ends again
    return status


def cancel_gang(executor, handle: JobHandle) -> None:
    """Note that trackway asked, then stop every node."""
    state_dir = Path(handle.state_dir)
    if (state_dir / "ssh-final.json").exists():
        return
    if not (state_dir / "cancel.json").exists():
        write_json_atomic(state_dir / "cancel.json", {"requested_at": utc_now().isoformat()})
    gang = read_json(state_dir / GANG_FILE)
    for node_handle in _node_handles(executor, state_dir, gang):
        try:
            executor.cancel(node_handle)
        except NotFound:
            pass  # never started


def gang_log(state_dir: Path) -> Path:
    return Path(read_json(Path(state_dir) / GANG_FILE)["local_log"])


def _placement(state_dir: Path, gang: dict, statuses: list[JobStatus]) -> dict:
    """Every node with its host and GPUs (from its ssh-job.json), node 0's host as the attempt's."""
    listed = []
    for node in gang["nodes"]:
        job = (read_json(state_dir / node["dir"] / "ssh-job.json") or {}).get("job") or {}
        listed.append({"node_rank": node["rank"], "host": node["host"], "gpu_ids": list(job.get("gpu_ids") or [])})
    placement = {"host": gang["nodes"][0]["host"], "nodes": listed, "nodes_expected": len(listed),
                 "master_addr": gang["rendezvous"]["MASTER_ADDR"], "master_port": gang["rendezvous"]["MASTER_PORT"]}
    for status in statuses:
        since = (status.placement or {}).get("unreachable_since")
        if since:
            placement["unreachable_since"] = since
        if (status.placement or {}).get("host_lost"):
            placement["host_lost"] = True
    return placement


def _succeeded(status: JobStatus) -> bool:
    return status.phase is JobPhase.ENDED and status.exit_code == 0 and status.signal is None


def _ending(status: JobStatus) -> str:
    if status.phase is JobPhase.VANISHED:
        return (status.evidence[-1] if status.evidence else "vanished") + (
            f" [{status.reason}]" if status.reason else "")
    if status.signal is not None:
        return f"killed by signal {status.signal}"
    return f"exit code {status.exit_code}"


def _earliest(statuses: list[JobStatus]):
    times = [s.started_at for s in statuses if s.started_at is not None]
    return min(times) if times else None
