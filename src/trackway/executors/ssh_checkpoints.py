"""An SSH run's checkpoints as its hosts hold them: listed over SSH, judged here by the checkpoint protocol's reader.

A run on an SSH resource without a checkpoint root (an object store) keeps its checkpoints on the
host that ran each attempt, in `WORKDIR/runs/RUN/checkpoints` (ssh.py). `host_stores()` asks every
host the run's attempts ran on (a gang's nodes included) for that directory's markers and
manifests (remote_agent.py's `checkpoints`; no payload byte travels), lays them out in a private
temporary directory and reads it with the protocol's own inspection (checkpoints/recover.py), so
that a checkpoint on a host is judged exactly as one here would be. A host that does not answer is
said as such (`HostStore.error`), never taken for an empty store.
"""

from __future__ import annotations

import base64
import posixpath
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from trackway.checkpoints import recover
from trackway.checkpoints.layout import CheckpointInfo, CheckpointState
from trackway.errors import ExecutorError, NotFound
from trackway.executors import remote_agent
from trackway.executors.ssh import RemoteJob, SshExecutor
from trackway.executors.ssh_gang import NODES_DIR


@dataclass(frozen=True)
class HostStore:
    """One host's copy of a run's checkpoint directory: what it holds (paths on the host), or why it is not known."""

    host: str  # as the resource's `hosts` names it
    root: str  # the run's checkpoint directory on the host
    held: tuple[CheckpointInfo, ...] = ()
    set_aside: tuple[CheckpointInfo, ...] = ()
    error: str | None = None  # None: the host answered

    def where(self, info: CheckpointInfo) -> str:
        return f"{self.host}:{info.path}"


def host_stores(state_dirs: Iterable[Path], run_id: str, home: Path) -> list[HostStore]:
    """The run's checkpoint directory on each host its attempts (in `state_dirs`) ran on, read over SSH."""
    places: dict[tuple[str, str], tuple[RemoteJob, str]] = {}
    for state_dir in state_dirs:
        for job_dir in _job_dirs(Path(state_dir)):
            try:
                job = RemoteJob.load(job_dir)
            except NotFound:
                continue  # launched elsewhere, or never reached a host
            remote_root = job.remote_dir.rsplit("/attempts/", 1)[0]
            root = posixpath.join(remote_root, "runs", run_id, "checkpoints")
            places.setdefault((job.target.spec, root), (job, remote_root))
    executor = SshExecutor(home)
    return [_read(executor, job, remote_root, root) for (_, root), (job, remote_root) in places.items()]


def _job_dirs(state_dir: Path) -> list[Path]:
    nodes = state_dir / NODES_DIR
    return [state_dir, *(sorted(p for p in nodes.iterdir() if p.is_dir()) if nodes.is_dir() else [])]


def _read(executor: SshExecutor, job: RemoteJob, remote_root: str, root: str) -> HostStore:
    try:
        answer = executor.ask_agent(job.client(), job.python, remote_root, ["checkpoints", root])
    except ExecutorError as exc:
        return HostStore(job.target.spec, root, error=str(exc))
    if "entries" not in answer:
        return HostStore(job.target.spec, root, error=f"the agent answered {str(answer)[:200]}, not a listing")
    held, aside = _judged(answer["entries"], root)
    return HostStore(job.target.spec, root, held, aside)


def _judged(entries: dict, root: str) -> tuple[tuple[CheckpointInfo, ...], tuple[CheckpointInfo, ...]]:
    """The host's step directories as the protocol reads them: their markers and manifests laid out here, inspected."""
    with tempfile.TemporaryDirectory(prefix="trackway-host-checkpoints-") as tmp:
        shadow = Path(tmp)
        for name, entry in entries.items():
            if "/" in name or name in (".", ".."):
                continue
            directory = shadow / name
            directory.mkdir()
            for file in remote_agent.CHECKPOINT_FILES:
                if entry.get(file) is not None:
                    (directory / file).write_bytes(base64.b64decode(entry[file]))
            if entry.get("SUPERSEDED"):
                (directory / "SUPERSEDED").touch()

        def there(info: CheckpointInfo) -> CheckpointInfo:
            measured = entries.get(info.name, {}).get("bytes")
            size = measured if info.state is not CheckpointState.COMMITTED and measured is not None else info.size_bytes
            return replace(info, path=Path(root) / info.name, size_bytes=size)

        held = tuple(there(info) for info in recover.list_checkpoints(shadow))
        aside = tuple(there(info) for info in recover.set_aside_list(shadow))
    return held, aside
