"""Checkpoints from a declared path: what a script without the SDK saves, committed from outside.

A run submitted with `--checkpoint-path GLOB` (or `[checkpoints] path` in trackway.toml; relative
to the run's working directory, e.g. `out/ckpt.pt`) has the matching files (or directories)
watched by the supervisor while an attempt runs. Once they are complete they are copied into the
run's checkpoint store and committed with the checkpoint protocol (checkpoints/write.py), as
`step-N/payload/<relative path>`, then mirrored into the ledger. A copy, because such scripts
overwrite their checkpoint file in place.

Nothing written after the log showed a non-finite loss is committed (the time of that line is in
the supervisor's stop marker): a resume from it would only diverge again.

Complete means: size and mtime unchanged over two looks (kept in the attempt's state directory,
so any supervisor process may take the second), and the script has moved on: it printed a line
(not the shim's `trackway:` notes) after the file was last written, or the file has been untouched
for `SETTLE_S`. When the attempt has ended, one last look commits what it left only if it exited 0
or a log pattern matched a line printed after the file was written (a new step after the save); a
file left by a process killed mid-write is never trusted.

A commit holds only the declared files that are new or changed since the previous commit (a glob
over step-numbered files, `ckpts/*.pt`, would otherwise copy every file into every commit). Its
step is the script's own when the new files' names carry one number (`ckpt_500.pt`), else the last
step the log patterns showed before the file was written (the points' `logged_at` is the log
line's timestamp); without one (or when it is not above the newest committed step, e.g. a script
that restarted from scratch), the newest committed step plus one. The manifest's `extra` says
where the files came from (`source: checkpoint_path`), the files it holds (`paths`: size and mtime
each) and every declared file there was (`seen`), so an unchanged file is never committed twice.

Before a retry starts (supervisor/launch.py), the newest committed checkpoint's files are copied
back to the declared paths (mtime kept, so they are recognised as already committed), `{resume_from}`
names its newest file, and `TRACKWAY_RESUME_FROM` names the checkpoint. Declared files that
checkpoint never saw (written after it by an attempt that did not commit them) and, with nothing
committed, every file at the declared paths (never verified) are moved aside as
`NAME.trackway-aside-N`, so that the attempt really starts where its receipt says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sqlalchemy import RowMapping, func, select, update

from trackway.checkpoints.layout import CheckpointInfo
from trackway.checkpoints.store import CheckpointStore
from trackway.errors import InputError
from trackway.ledger import Ledger
from trackway.ledger.checkpoint_mirror import mirror_checkpoint
from trackway.ledger.schema import attempts, checkpoints, metric_points, metric_series
from trackway.spool import read_json, write_json_atomic
from trackway.supervisor.outside_sdk import SOURCE

PAYLOAD = "payload"  # the declared files live under step-N/payload/<relative path>
ASIDE = ".trackway-aside-"
RESTORING = ".trackway-restore"
SETTLE_S = 10.0  # untouched this long counts as complete even without a newer log line
MAX_PATHS = 32
TAIL_BYTES = 64 * 1024  # how much of output.log's end tells whether the script printed after a save

Signature = dict[str, list[int]]  # relative path -> [size, mtime_ns, files]


def validate_paths(globs: Sequence[str], option: str = "--checkpoint-path") -> list[str]:
    """The globs, checked: relative to the working directory and staying inside it."""
    if len(globs) > MAX_PATHS:
        raise InputError(f"{option}: at most {MAX_PATHS} paths, got {len(globs)}")
    checked = []
    for glob in globs:
        if not isinstance(glob, str) or not glob.strip() or "\x00" in glob:
            raise InputError(f"{option} {glob!r}: expected a path or glob relative to the run's working directory")
        pure = PurePosixPath(glob)
        if pure.is_absolute() or glob.startswith("~"):
            raise InputError(f"{option} {glob!r}: expected a path relative to the run's working directory, e.g. out/ckpt.pt")
        if any(part == ".." for part in pure.parts):
            raise InputError(f"{option} {glob!r}: expected a path inside the run's working directory (no '..')")
        checked.append(pure.as_posix())
    return checked


def paths_of(run: RowMapping) -> list[str]:
    text = run.get("checkpoint_paths") if hasattr(run, "get") else None
    return list(json.loads(text)) if text else []


def matches(workdir: Path, globs: Sequence[str]) -> list[str]:
    """Relative paths (files or directories) under `workdir` that the globs match now, trackway's asides left out."""
    found: set[str] = set()
    for glob in globs:
        for path in workdir.glob(glob):
            if ASIDE in path.name or RESTORING in path.name:
                continue
            if path.is_file() or path.is_dir():
                found.add(path.relative_to(workdir).as_posix())
    return sorted(found)


def signature(workdir: Path, rels: Sequence[str]) -> Signature | None:
    """Size, newest mtime and file count per path; None when one vanished meanwhile."""
    sig: Signature = {}
    try:
        for rel in rels:
            path = workdir / rel
            if path.is_dir():
                size = newest = count = 0
                for root, _, names in os.walk(path):
                    for name in names:
                        st = os.stat(Path(root) / name)
                        size, newest, count = size + st.st_size, max(newest, st.st_mtime_ns), count + 1
                sig[rel] = [size, newest, count]
            else:
                st = path.stat()
                sig[rel] = [st.st_size, st.st_mtime_ns, 1]
    except FileNotFoundError:
        return None
    return sig


def newest_mtime(sig: Signature) -> float:
    return max(v[1] for v in sig.values()) / 1e9


def committed_signature(info: CheckpointInfo | None) -> Signature | None:
    """The declared files a checkpoint committed from outside holds (None for one the SDK wrote)."""
    extra = ((info.manifest or {}).get("extra") or {}) if info is not None else {}
    return extra.get("paths") if extra.get("source") == SOURCE else None


def seen_signature(info: CheckpointInfo | None) -> Signature | None:
    """Every declared file there was when that checkpoint was committed (it holds only the new ones among them)."""
    extra = ((info.manifest or {}).get("extra") or {}) if info is not None else {}
    if extra.get("source") != SOURCE:
        return None
    return extra.get("seen") or extra.get("paths")


_NUMBER = re.compile(r"\d+")


def _by_named_step(new: Signature) -> list[Signature]:
    """New files grouped by the step in their names, ascending; one group for all when any name has none."""
    named: dict[int, Signature] = {}
    for rel, value in new.items():
        step = step_in_names({rel: value})
        if step is None:
            return [new]
        named.setdefault(step, {})[rel] = value
    return [named[step] for step in sorted(named)]


def step_in_names(sig: Signature) -> int | None:
    """The script's own step when its checkpoint files are numbered by it (`ckpt_500.pt`, `checkpoint-500/`).

    Only a name holding exactly one number counts; with several files, their largest such number.
    """
    found = []
    for rel in sig:
        numbers = _NUMBER.findall(PurePosixPath(rel).name)
        if len(numbers) == 1:
            found.append(int(numbers[0]))
    return max(found) if found else None


LOOK_FILE = "checkpoint-path-look.json"  # in the attempt's state dir: the last look, for whichever process looks next


@dataclass
class OutsideCheckpoints:
    """Looks at declared checkpoint paths. The previous look is kept in the attempt's state directory,
    so two looks by different processes (`trackway supervise --once` from cron) count as two looks."""

    settle_s: float = SETTLE_S
    _done: dict[str, Signature] = field(default_factory=dict)  # attempt -> a signature known to be committed

    def look(
        self, ledger: Ledger, runs_dir: Path, run: RowMapping, attempt: RowMapping, final: bool = False,
        exit_code: int | None = None, now: float | None = None,
    ) -> CheckpointInfo | None:
        """Commit the declared paths of a running (or, with `final`, just ended) attempt when complete."""
        globs = paths_of(run)
        if not globs:
            return None
        # Where this attempt ran: a retry runs in its own workspace (supervisor/workspace.py).
        workdir = Path(attempt.get("workdir") or run["workdir"])
        rels = matches(workdir, globs)
        sig = signature(workdir, rels) if rels else None
        attempt_id = attempt["attempt_id"]
        if not sig:
            return None
        if self._done.get(attempt_id) == sig:
            return None
        now = time.time() if now is None else now
        if not final:
            look_file = Path(attempt["state_dir"]) / LOOK_FILE
            previous = (read_json(look_file) or {}).get("paths")
            if previous != sig:
                write_json_atomic(look_file, {"t": now, "paths": sig})
                return None  # changed since the last look (or the first look): look again
        store = CheckpointStore(runs_dir / run["run_id"] / "checkpoints")
        latest = store.latest_committed(verify_files=False) if store.root.is_dir() else None
        before = seen_signature(latest) or {}
        # Only what is new or changed since the last commit: a glob over step-numbered files would
        # otherwise copy every file into every commit.
        new = {rel: value for rel, value in sig.items() if before.get(rel) != value}
        if not new:
            self._done[attempt_id] = sig
            return None
        diverged = _diverged_at(Path(attempt["state_dir"]))
        if diverged is not None:
            # Written after the loss went non-finite: a resume from it would only diverge again.
            new = {rel: value for rel, value in new.items() if value[1] / 1e9 < diverged}
        if final:
            # The writer is gone: trust what it left only if it exited 0 or printed a new step after writing
            # it (a process killed mid-save leaves a torn file; the shim's own notes prove nothing).
            new = {rel: value for rel, value in new.items()
                   if exit_code == 0 or _step_logged_after(ledger, attempt, value[1] / 1e9)}
        if not new:
            return None
        written = newest_mtime(new)
        if not final and not (now - written >= self.settle_s or _moved_on(ledger, run, attempt, written)):
            return None
        info = None
        # Files numbered by the script's own steps are its checkpoints, one each, in step order (several may be
        # new at one look on a busy machine); anything else new is committed together.
        for group in _by_named_step(new):
            kept = {**{rel: v for rel, v in sig.items() if before.get(rel) == v}, **group}
            step, step_from = _step_for(ledger, attempt, newest_mtime(group), latest.step if latest else None, group)
            # What a retry restoring this checkpoint keeps in place: what it or an earlier one holds, nothing torn.
            committed = _commit(store, workdir, group, step, run["run_id"], attempt_id, latest, kept, step_from)
            if committed is None:
                return info  # changed while being copied: the next look tries the rest again
            _mirror(ledger, run["run_id"], attempt_id, committed)
            info, latest, before = committed, committed, kept
        self._done[attempt_id] = sig
        return info

    def forget(self, attempt_id: str) -> None:
        self._done.pop(attempt_id, None)


def _diverged_at(state_dir: Path) -> float | None:
    """When the attempt's log first showed a non-finite loss (the supervisor's stop marker says), if it did."""
    from trackway.supervisor.watchers import STOP_MARKER

    marker = read_json(state_dir / STOP_MARKER) or {}
    if marker.get("kind") != "nan_in_log":
        return None
    at = marker.get("at") if marker.get("at") is not None else marker.get("t")
    return float(at) if isinstance(at, int | float) else None


def _moved_on(ledger: Ledger, run: RowMapping, attempt: RowMapping, written: float) -> bool:
    """Whether the script has moved on since it wrote its checkpoint at `written`.

    With log patterns, only what was already ingested counts (a step logged after the write): the
    log read afresh here could show a line after the save while the non-finite loss printed just
    before it is not ingested yet, and that checkpoint would be committed. Without, any new line.
    """
    if run.get("log_patterns"):
        return _step_logged_after(ledger, attempt, written)
    return _script_wrote_after(Path(attempt["log_path"]), written)


def _script_wrote_after(log_path: Path, written: float) -> bool:
    """The script printed a line (not the shim's `trackway:` notes) after `written`: it has moved on."""
    from trackway.supervisor.log_metrics import split_log_line

    try:
        with log_path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(lines):
        stamp, text = split_log_line(line)
        if stamp is None:
            continue
        if stamp <= written:
            return False
        if not text.startswith("trackway:"):
            return True
    return False


def _step_logged_after(ledger: Ledger, attempt: RowMapping, written: float) -> bool:
    """A log pattern matched a line of this attempt logged after `written` (a training step came after the save)."""
    with ledger.read() as conn:
        latest = conn.execute(
            select(func.max(metric_points.c.logged_at))
            .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
            .where(metric_series.c.run_id == attempt["run_id"], metric_points.c.attempt_number == attempt["attempt_number"])
        ).scalar()
    return latest is not None and latest > written


# Where a checkpoint's step came from, kept in its manifest (`extra.step_from`): only a name is the script's word.
STEP_FROM_NAME = "the file name: the script's own step"
STEP_FROM_LOG = "the log: the last step printed before the save (the script's own step is not known)"
STEP_FROM_NOTHING = "none: the newest committed step plus one (no step was printed before the save)"


def _step_for(ledger: Ledger, attempt: RowMapping, written: float, latest_step: int | None,
              new: Signature | None = None) -> tuple[int, str]:
    """The checkpoint's step and where it came from: the script's own when its file names carry one, else the
    last step this attempt's log showed at or before `written`; either only if above the newest committed step."""
    named = step_in_names(new or {})
    if named is not None and (latest_step is None or named > latest_step):
        return named, STEP_FROM_NAME
    with ledger.read() as conn:
        seen = conn.execute(
            select(func.max(metric_points.c.step))
            .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
            .where(
                metric_series.c.run_id == attempt["run_id"],
                metric_points.c.attempt_number == attempt["attempt_number"],
                metric_points.c.logged_at <= written,
            )
        ).scalar()
    if seen is not None and seen >= 0 and (latest_step is None or seen > latest_step):
        return int(seen), STEP_FROM_LOG
    return (latest_step if latest_step is not None else 0) + 1, STEP_FROM_NOTHING


def _commit(
    store: CheckpointStore, workdir: Path, sig: Signature, step: int, run_id: str, attempt_id: str,
    parent: CheckpointInfo | None, seen: Signature | None = None, step_from: str | None = None,
) -> CheckpointInfo | None:
    """Copy `sig`'s files into a new checkpoint and commit it; `seen`: every declared file there is now."""
    pending = store.begin(step, run_id=run_id, attempt_id=attempt_id, parent=parent.name if parent else None)
    try:
        for rel in sig:
            source, target = workdir / rel, pending.path / PAYLOAD / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        if signature(workdir, list(sig)) != sig:
            pending.abort()
            return None
        return pending.commit(extra={"source": SOURCE, "paths": sig, "seen": seen or sig, "step_from": step_from})
    except FileNotFoundError:
        pending.abort()
        return None
    except BaseException:
        pending.abort()
        raise


def _mirror(ledger: Ledger, run_id: str, attempt_id: str, info: CheckpointInfo) -> None:
    manifest = info.manifest or {}
    record = {
        "step": info.step, "name": info.name, "state": info.state.value, "path": str(info.path),
        "size_bytes": info.size_bytes, "parent": manifest.get("parent"), "metrics": manifest.get("metrics") or None,
        "committed_at": info.committed_at,
    }
    with ledger.write() as conn:
        mirror_checkpoint(conn, run_id, attempt_id, record)
        count = conn.execute(
            select(func.count()).where(checkpoints.c.attempt_id == attempt_id, checkpoints.c.committed_at.is_not(None))
        ).scalar_one()
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt_id).values(checkpoints_committed=count))


@dataclass
class Restored:
    """What a launch did to the declared paths: restored from a checkpoint, or moved aside (nothing committed,
    or written after the restored checkpoint and never committed)."""

    checkpoint: str | None = None
    restored: list[str] = field(default_factory=list)  # absolute paths written, the newest first
    moved_aside: list[str] = field(default_factory=list)

    def message(self) -> str:
        if self.restored:
            aside = f"; moved aside, never committed: {', '.join(self.moved_aside)}" if self.moved_aside else ""
            return f"restored {self.checkpoint} from the declared checkpoint path to {', '.join(self.restored)}{aside}"
        return ("nothing committed from the declared checkpoint path, so this attempt starts from the start; moved aside: "
                + ", ".join(self.moved_aside))

    def as_event(self) -> dict:
        # `message`: what explain lists among what the supervisor noticed.
        return {"message": self.message(), "checkpoint": self.checkpoint, "restored": self.restored,
                "moved_aside": self.moved_aside}


def restore_declared(store_root: Path, workdir: Path, globs: Sequence[str], checkpoint: str | None, number: int) -> Restored:
    """Put the committed checkpoint `checkpoint` back at the declared paths before attempt `number` starts.

    A checkpoint the SDK wrote (no `source: checkpoint_path`) is the SDK's to restore: nothing is
    touched. With no checkpoint, what the declared paths hold now was never committed: it is moved aside.
    """
    done = Restored(checkpoint=checkpoint)
    if not globs:
        return done
    info = CheckpointStore(store_root).get(int(checkpoint[5:])) if checkpoint else None
    if checkpoint is not None:
        sig = committed_signature(info)
        if sig is None:
            return Restored()
        seen = seen_signature(info) or sig
        # What the checkpoint holds is put back, its newest file first (what `{resume_from}` names);
        # a declared file it never saw was written after it by an attempt that did not commit it.
        for rel in sorted(sig, key=lambda r: sig[r][1], reverse=True):
            source, target = info.path / PAYLOAD / rel, workdir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}{RESTORING}")
            if temporary.is_dir():
                shutil.rmtree(temporary)
            if source.is_dir():
                shutil.copytree(source, temporary)
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                temporary.rename(target)
            else:
                shutil.copy2(source, temporary)  # the mtime too: it is recognised as already committed
                if target.is_dir():
                    shutil.rmtree(target)
                os.replace(temporary, target)
            done.restored.append(str(target))
        for rel in matches(workdir, globs):
            if rel not in seen:
                done.moved_aside.append(_move_aside(workdir / rel, number))
        return done
    for rel in matches(workdir, globs):
        done.moved_aside.append(_move_aside(workdir / rel, number))
    return done


def _move_aside(source: Path, number: int) -> str:
    """Rename a declared file no checkpoint holds to `NAME.trackway-aside-N`: kept, never restored or committed."""
    aside = source.with_name(f"{source.name}{ASIDE}{number}")
    if aside.exists():
        aside = source.with_name(f"{source.name}{ASIDE}{number}-{int(time.time())}")
    source.rename(aside)
    return str(aside)


def resume_from_word(word: str, restored: Restored | None, checkpoint_dir: Path | None) -> str | None:
    """`{resume_from}` in a command word: the restored path (else the checkpoint directory); None drops the word."""
    if "{resume_from}" not in word:
        return word
    if restored is not None and restored.restored:
        target = restored.restored[0]
    elif checkpoint_dir is not None:
        target = str(checkpoint_dir)
    else:
        return None
    return word.replace("{resume_from}", target)


def substitute_command(command: Sequence[str], restored: Restored | None, checkpoint_dir: Path | None) -> list[str]:
    """The command with `{resume_from}` replaced; a word holding it is dropped when there is nothing to resume from."""
    return [w for w in (resume_from_word(word, restored, checkpoint_dir) for word in command) if w is not None]
