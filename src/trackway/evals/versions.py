"""The versions an evaluation is pinned to, computed from content: nobody types a version by hand.

- the evaluator's version: the container image digest when the spec names one, otherwise the
  sha256 over its code files (relative path and content of each; caches such as `__pycache__`
  left out, since running the evaluator writes them);
- the task set's version: the sha256 over its file, or over every file of its directory.

Changing one byte of any of these files changes the version.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from trackway.errors import InputError
from trackway.receipts.canonical import canonical_json, sha256_hex

SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
CHUNK_BYTES = 2**20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def tree_files(root: Path) -> list[tuple[str, Path]]:
    """(name, path) of every file under `root` (itself, if a file), named relative to root's parent."""
    if root.is_file():
        return [(root.name, root)]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for filename in sorted(filenames):
            if filename.endswith(SKIPPED_SUFFIXES):
                continue
            path = Path(dirpath) / filename
            found.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    return found


def content_version(roots: Iterable[Path], field: str) -> str:
    """sha256 over the names and contents of every file under `roots`; `field` names them in errors."""
    entries = []
    for root in roots:
        if not root.exists():
            raise InputError(f"{field} {root}: no such file or directory")
        for name, path in tree_files(root):
            try:
                entries.append({"name": name, "sha256": file_sha256(path), "size": path.stat().st_size})
            except OSError as exc:
                raise InputError(f"{field} {path}: cannot read: {exc.strerror}") from None
    if not entries:
        raise InputError(f"{field}: no files to hash under {', '.join(str(r) for r in roots)}")
    entries.sort(key=lambda e: e["name"])
    return sha256_hex(canonical_json(entries))
