"""The remote agent: what the SSH executor runs on a host to start, read and cancel attempts there.

Copied to `WORKDIR/.trackway/<hash>/` beside copies of `local_shim.py` and `process_tree.py`
(whose functions it uses), and run by the host's Python over one SSH call per action, or for a
supervisor's polls once, as a session that answers each (`serve`); stdlib only, like the shim, so
a host needs nothing but python3. It answers in one JSON document on stdout.

    agent.py start STATE_DIR     starts the shim detached (its own session: an SSH disconnect
                                 does not reach it) and waits for job.json; prints
                                 {"boot_id", "job"} or {"error"}
    agent.py poll                stdin {"attempts": [{"dir", "offsets": {REL: bytes already
                                 copied}}], "max_bytes"}; prints {"boot_id", "attempts": {DIR:
                                 {"exists", "job", "exit", "shim_alive", "child_alive", "files"},
                                 with the shim and the command gone also "stopping" (processes of
                                 the job still running, being stopped) and "stopped" (what was)}}
    agent.py cancel STATE_DIR    writes cancel.json, SIGTERMs the shim (or, with the shim gone,
                                 every process of the job); prints {"signalled"}
    agent.py checkpoints ROOT    a run's checkpoint store on the host, as the checkpoint protocol
                                 reads it (no payload file is read): {"exists", "entries": {NAME:
                                 {"COMMITTED", "MANIFEST.json": base64 or null, "SUPERSEDED": bool,
                                 "bytes": size of its files, without a marker}}} for every step-*
                                 directory
    agent.py serve               the same answers over one login: each stdin line {"args": [ACTION,
                                 ARG], "input": the poll's request}, each answer one stdout line;
                                 ends at EOF, or after SERVE_IDLE_S without a request (`start`,
                                 which reads a bundle, is not served)

`poll` sends each attempt's append-only files (output.log, the spool's `*.jsonl`) from the
offsets the executor already holds, so nothing is read twice; small files that are replaced
whole (heartbeat.json, termination.json) are sent whole. Bytes go as
base64, at most `max_bytes` per call in all; the rest comes with the next poll.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

if __package__:  # imported as trackway.executors.remote_agent (the SSH executor reads its names)
    from trackway.executors import local_shim, process_tree
else:  # run as a script on a host: the copy of local_shim.py delivered beside this file
    # Only then on sys.path: a package's directory there would shadow top-level modules for the
    # whole process (its kubernetes.py would be `import kubernetes` for the Kubernetes executor).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import local_shim  # type: ignore[no-redef]
    import process_tree  # type: ignore[no-redef]

START_TIMEOUT_S = 10.0
# A session nobody asks for this long ends itself: its supervisor went without closing it.
SERVE_IDLE_S = 120.0
SHIM = [sys.executable, str(Path(local_shim.__file__))]
# Replaced whole by their writers (write-then-rename): copied whole, never by offset.
WHOLE = ("spool/heartbeat.json", "spool/termination.json")


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def start(state_dir: Path) -> dict:
    try:
        job = local_shim.start_detached([*SHIM, str(state_dir)], state_dir, START_TIMEOUT_S)
    except local_shim.StartFailed as exc:
        return {"error": f"the shim {exc}"}
    return {"boot_id": boot_id(), "job": job}


def poll(request: dict) -> dict:
    budget = int(request.get("max_bytes", 4 << 20))
    answers = {}
    for item in request.get("attempts", []):
        state_dir = Path(item["dir"])
        if not state_dir.is_dir():
            answers[item["dir"]] = {"exists": False}
            continue
        job = _read_json(state_dir / "job.json")
        answer = {
            "exists": True,
            "job": job,
            "exit": _read_json(state_dir / "exit.json"),
            "cancel_requested": (state_dir / "cancel.json").exists(),
            "shim_alive": bool(job) and process_tree.same_process(job.get("shim_pid"), job.get("create_time")),
            "child_alive": bool(job) and process_tree.same_process(job.get("child_pid"), job.get("child_create_time")),
            "files": {},
        }
        if job and answer["exit"] is None and not answer["shim_alive"] and not answer["child_alive"]:
            # The command's processes that outlived it and its shim are stopped before the end is told.
            running, stopped = local_shim.settle_orphans(state_dir, job, SHIM)
            answer["stopping"] = None if stopped is not None else [f"pid {pid} ({name})" for pid, name in running]
            answer["stopped"] = stopped or []
        offsets = item.get("offsets", {})
        for rel in _files(state_dir):
            path = state_dir / rel
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if _whole(rel):
                answer["files"][rel] = {"whole": True, "size": size, "data": _read_b64(path, 0, size)}
                continue
            offset = int(offsets.get(rel, 0))
            if offset > size:  # the file shrank: not ours to mirror any more (a wiped and reused dir)
                answer["files"][rel] = {"size": size, "offset": offset, "data": "", "shrank": True}
                continue
            take = min(size - offset, max(budget, 0))
            budget -= take
            answer["files"][rel] = {"size": size, "offset": offset, "data": _read_b64(path, offset, take)}
        answers[item["dir"]] = answer
    return {"boot_id": boot_id(), "attempts": answers}


def cancel(state_dir: Path) -> dict:
    job = _read_json(state_dir / "job.json")
    if job is None:
        return {"signalled": None, "error": f"no job.json in {state_dir}"}
    return {"signalled": local_shim.stop_job(state_dir, job, SHIM)}


CHECKPOINT_FILES = ("COMMITTED", "MANIFEST.json")
MAX_LISTED = 100_000  # step directories answered, newest names last; a store past that is cut, said by "cut"


def checkpoints(root: Path) -> dict:
    if not root.is_dir():
        return {"exists": False, "entries": {}}
    names = sorted(entry.name for entry in os.scandir(root) if entry.name.startswith("step-") and entry.is_dir())
    entries = {}
    for name in names[-MAX_LISTED:]:
        directory = root / name
        entry: dict = {"SUPERSEDED": os.path.lexists(directory / "SUPERSEDED")}
        for file in CHECKPOINT_FILES:
            try:
                entry[file] = base64.b64encode((directory / file).read_bytes()).decode("ascii")
            except OSError:
                entry[file] = None
        # A committed one's size is its manifest's; one without a marker is measured (as the protocol does).
        entry["bytes"] = _tree_bytes(directory) if entry["COMMITTED"] is None else None
        entries[name] = entry
    return {"exists": True, "entries": entries, "cut": len(names) > MAX_LISTED}


def _tree_bytes(directory: Path) -> int:
    total = 0
    for top, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total


def _files(state_dir: Path) -> list[str]:
    names = ["output.log", "eval-output.jsonl"]
    spool = state_dir / "spool"
    try:
        names += sorted(f"spool/{entry.name}" for entry in os.scandir(spool)
                        if entry.is_file() and (entry.name.endswith(".jsonl") or _whole(f"spool/{entry.name}")))
    except OSError:
        pass
    return [name for name in names if (state_dir / name).is_file()]


def _whole(rel: str) -> bool:
    """Whether `rel` is replaced whole: WHOLE, and each rank's own heartbeat (spool/heartbeat-r<N>.json)."""
    return rel in WHOLE or (rel.startswith("spool/heartbeat-r") and rel.endswith(".json"))


def _read_json(path: Path) -> dict | None:
    try:
        return local_shim.read_json(path)
    except (OSError, ValueError):
        return None  # torn or unreadable: the next poll reads it again


def _read_b64(path: Path, offset: int, length: int) -> str:
    if length <= 0:
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return base64.b64encode(f.read(length)).decode("ascii")


def answer(argv: list[str], request) -> dict | None:
    """The answer to one action (`poll` with its request); None for an action this agent does not know."""
    if len(argv) == 1 and argv[0] == "poll" and isinstance(request, dict):
        return poll(request)
    if len(argv) == 2 and argv[0] == "cancel":
        return cancel(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "checkpoints":
        return checkpoints(Path(argv[1]))
    return None


def serve(stdin, stdout, idle_s: float) -> int:
    """Answer request lines until EOF, or until `idle_s` passed without one (a client gone without closing)."""
    import select

    while True:
        ready, _, _ = select.select([stdin], [], [], idle_s)
        if not ready:
            return 0
        line = stdin.readline()
        if not line:
            return 0
        try:
            request = json.loads(line)
            said = answer([str(part) for part in request["args"]], request.get("input"))
        except (ValueError, KeyError, TypeError) as exc:
            said = {"error": f"not a request: {type(exc).__name__}"}
        stdout.write(json.dumps(said if said is not None else {"error": "not an action this agent serves"}) + "\n")
        stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "start":
        said = start(Path(argv[1]))
    elif argv == ["serve"]:
        return serve(sys.stdin, sys.stdout, SERVE_IDLE_S)
    else:
        said = answer(argv, json.load(sys.stdin) if argv == ["poll"] else None)
    if said is None:
        print("usage: agent.py start STATE_DIR | poll < REQUEST | cancel STATE_DIR | checkpoints ROOT | serve",
              file=sys.stderr)
        return 2
    json.dump(said, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
