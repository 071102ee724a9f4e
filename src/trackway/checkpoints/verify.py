"""Verifying a checkpoint: does its commit marker verify against its manifest, and its manifest against every file.

Committed iff COMMITTED parses, its manifest_sha256 is sha256(MANIFEST.json) and the manifest's
step is the directory's (`inspect_dir` reads a directory's state by this rule alone, hashing
nothing). A committed checkpoint is intact when every file the manifest lists is there with its
recorded size and digest (`check_files`: its blake3 where the manifest records one, else its
sha256, digests.py; a loader that hashes a file as it reads it checks that one itself,
verified_read.py). A file that cannot be read for another reason (EIO, permissions) is no proof
of corruption: it is told apart, so that callers raise rather than set aside.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

from trackway.checkpoints.digests import usable_cores, verified_by
from trackway.checkpoints.durable import hash_file, tree
from trackway.checkpoints.layout import (
    MANIFEST,
    MARKER,
    SHA256_RE,
    SUPERSEDED_MARK,
    CheckpointError,
    CheckpointInfo,
    CheckpointState,
    clean_relpath,
    parse_step,
    parse_time,
)


def inspect_dir(path: Path, step: int | None = None) -> CheckpointInfo | None:
    """A step directory's state from its marker and manifest (no payload file is read); None when it is gone."""
    step = parse_step(path.name) if step is None else step
    if not os.path.lexists(path):
        return None
    (marker_bytes, marker), (manifest_bytes, manifest) = _read(path / MARKER), _read(path / MANIFEST)
    superseded = os.path.lexists(path / SUPERSEDED_MARK)
    if marker_bytes is None:
        state = CheckpointState.DELETED if superseded else CheckpointState.WRITING
        return CheckpointInfo(step, path, state, manifest, None, tree(path)[0])
    problems = marker_problems(step, marker, manifest_bytes, manifest)
    if problems:
        return CheckpointInfo(step, path, CheckpointState.CORRUPT, manifest, None, tree(path)[0], problems)
    state = CheckpointState.SUPERSEDED if superseded else CheckpointState.COMMITTED
    size = sum(f["size"] for f in manifest["files"].values() if isinstance(f, dict) and type(f.get("size")) is int)
    return CheckpointInfo(step, path, state, manifest, parse_time(marker.get("committed_at")), size)


def marker_problems(step: int | None, marker: dict | None, manifest_bytes: bytes | None, manifest: dict | None
                    ) -> tuple[str, ...]:
    expected = (marker or {}).get("manifest_sha256")
    actual = hashlib.sha256(manifest_bytes).hexdigest() if manifest_bytes is not None else None
    if marker is None:
        return (f"{MARKER} is not a JSON object (torn or garbage marker)",)
    if not isinstance(expected, str) or not SHA256_RE.fullmatch(expected):
        return (f"{MARKER} has no valid manifest_sha256",)
    if actual != expected:
        return (f"{MARKER} names manifest {expected[:12]}… but {MANIFEST} is {(actual or 'missing')[:12]}…",)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return (f"{MANIFEST} is not a JSON object with a files table",)
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        return (f"{MANIFEST} says step {manifest.get('step')!r}, the directory says {step}",)
    return ()


def verify(info: CheckpointInfo) -> list[str]:
    """What is wrong with a checkpoint as it is on disk now (marker, manifest, every file); [] when good."""
    return sum(check_files(info.path, info.step), [])


def check_files(path: Path, step: int, deferred: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """(evidence of corruption, files that could not be read for other reasons).

    `deferred` files are checked for presence and size only: their reader hashes them as it
    reads them (verified_read.py) and refuses them there.
    """
    info = inspect_dir(path, step)
    if info is None or not info.state.readable:
        return list(info.problems if info else ()) or [f"{path} is not committed"], []
    problems, unreadable, checks = [], [], []
    for rel, entry in sorted(info.manifest["files"].items()):
        try:
            target, size = path / clean_relpath(rel), entry["size"]
            st = os.stat(target)
        except (CheckpointError, KeyError, TypeError) as exc:
            problems.append(f"{rel}: bad manifest entry ({exc})")
            continue
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        except OSError as exc:
            unreadable.append(f"{rel}: {exc.strerror or exc}")
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            problems.append(f"{rel}: {st.st_size} bytes, manifest says {size}")
        elif rel not in deferred:
            checks.append((rel, target, *verified_by(entry)))
    if problems:
        return problems, unreadable  # a wrong size is proof enough; nothing needs reading
    for (rel, _, algorithm, expected), actual in zip(checks, _hashed(checks)):
        if isinstance(actual, OSError):
            unreadable.append(f"{rel}: {actual.strerror or actual}")
        elif actual != expected:
            problems.append(f"{rel}: {algorithm} {actual[:12]}… but manifest says {str(expected)[:12]}…")
    return problems, unreadable


def _hashed(checks: list[tuple[str, Path, str, Any]]) -> list[str | OSError]:
    """Each file's digest by its algorithm (or the OSError that stopped the read), several files side by side.

    SHA-256 is one sequential stream per file, about 1.7 GB/s on a core: a payload saved in parts
    (safetensors) is verified on as many cores as it has parts, as it was hashed when saved.
    """

    def one(check: tuple[str, Path, str, Any]) -> str | OSError:
        try:
            return hash_file(check[1], algorithm=check[2])[1]
        except OSError as exc:
            return exc

    workers = min(len(checks), usable_cores())
    if workers <= 1:
        return [one(check) for check in checks]
    with ThreadPoolExecutor(workers, thread_name_prefix="trackway-verify") as pool:
        return list(pool.map(one, checks))


def size_problems(path: Path, info: CheckpointInfo) -> list[str]:
    """Files the manifest lists that are missing or of another size (stat only, nothing read)."""
    problems = []
    files = (info.manifest or {}).get("files")
    for rel, entry in sorted(files.items()) if isinstance(files, dict) else ():
        try:
            actual = os.stat(path / clean_relpath(rel)).st_size
        except (CheckpointError, OSError):
            problems.append(f"{rel}: missing")
            continue
        expected = entry.get("size") if isinstance(entry, dict) else "?"
        if actual != expected:
            problems.append(f"{rel}: {actual} bytes, manifest says {expected}")
    return problems


def _read(path: Path) -> tuple[bytes | None, dict | None]:
    """(the file's bytes, None when absent; its content when that is a JSON object)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except IsADirectoryError:
        return b"", None
    with suppress(ValueError, UnicodeDecodeError):
        value = json.loads(data)
        return data, value if isinstance(value, dict) else None
    return data, None
