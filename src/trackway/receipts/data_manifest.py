"""The data manifest: every file under the `--data` paths with its size and sha256, hashed as one."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from trackway.errors import InputError, NotFound
from trackway.receipts.canonical import canonical_json, sha256_hex

CHUNK_BYTES = 2**20


@dataclass(frozen=True)
class DataManifest:
    """The files (path, size, sha256), the absolute roots they came from, and the hash of the files alone."""

    files: list[dict]
    roots: list[str]
    total_bytes: int
    canonical: bytes
    sha256: str


@dataclass(frozen=True)
class _Source:
    flag_path: str
    entry: str
    location: Path
    size: int


def build_data_manifest(
    paths: Sequence[str | Path],
    console: Console | None = None,
    progress_threshold_bytes: int = 64 * 2**20,
) -> DataManifest | None:
    """Hash every file under `paths` (files, or directories walked recursively); None when `paths` is empty.

    An entry is named `<root basename>/<relative posix path>`, so the manifest hash depends on
    content and names, not on where the data lives; `roots` records where it was read from but
    is left out of the hash. Symlinked files are followed; symlinked directories are not, so a
    link cycle cannot loop. Sockets, FIFOs and devices are skipped: reading them blocks or means
    nothing. A progress bar is shown when the total reaches `progress_threshold_bytes`.
    """
    if not paths:
        return None
    roots = _roots(paths)
    sources = sorted((s for root in roots for s in _sources(*root)), key=lambda s: s.entry)
    total = sum(s.size for s in sources)
    if total >= progress_threshold_bytes:
        files = _hash_with_progress(sources, total, console or Console(stderr=True))
    else:
        files = [_hash_source(s, lambda n: None) for s in sources]
    canonical = canonical_json({"files": files})
    return DataManifest(
        files=files,
        roots=[str(root) for _, _, root in roots],
        total_bytes=sum(f["size"] for f in files),
        canonical=canonical,
        sha256=sha256_hex(canonical),
    )


def _roots(paths: Sequence[str | Path]) -> list[tuple[str, str, Path]]:
    """(the path as given, its name in the manifest, its resolved location) for each `--data` path."""
    roots: list[tuple[str, str, Path]] = []
    given_by_name: dict[str, str] = {}
    for p in map(str, paths):
        if not os.path.exists(p):
            raise NotFound(f"--data {p}: no such file or directory")
        root = Path(p).resolve()
        # The name as given, not as resolved: `--data current` names the data `current` even when it links to `v3`.
        name = Path(os.path.abspath(p)).name or root.name or "root"
        if name in given_by_name:
            raise InputError(
                f"--data {given_by_name[name]} and --data {p}: both would be named '{name}' in the manifest; "
                "pass their common parent instead, or rename one"
            )
        given_by_name[name] = p
        roots.append((p, name, root))
    return roots


def _sources(flag_path: str, name: str, root: Path) -> Iterator[_Source]:
    if not root.is_dir():
        yield from _source(flag_path, name, root)
        return
    for dirpath, dirnames, filenames in os.walk(root, onerror=_walk_error(flag_path)):
        dirnames.sort()
        here = Path(dirpath)
        for filename in sorted(filenames):
            location = here / filename
            yield from _source(flag_path, f"{name}/{location.relative_to(root).as_posix()}", location)


def _source(flag_path: str, entry: str, location: Path) -> Iterator[_Source]:
    try:
        info = location.stat()
    except OSError as e:
        raise InputError(f"--data {flag_path}: cannot read {entry}: {e.strerror} (a broken symlink?)") from None
    try:
        entry.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"--data {flag_path}: file name {entry!r} is not valid UTF-8; rename it") from None
    if stat.S_ISREG(info.st_mode):
        yield _Source(flag_path, entry, location, info.st_size)


def _walk_error(flag_path: str) -> Callable[[OSError], None]:
    def raise_input_error(e: OSError) -> None:
        raise InputError(f"--data {flag_path}: cannot list {e.filename}: {e.strerror}")

    return raise_input_error


def _hash_with_progress(sources: list[_Source], total: int, console: Console) -> list[dict]:
    columns = (
        TextColumn("hashing data"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("hashing", total=total)
        return [_hash_source(s, lambda n: progress.advance(task, n)) for s in sources]


def _hash_source(source: _Source, advance: Callable[[int], None]) -> dict:
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    try:
        with open(source.location, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
                size += n
                advance(n)
    except OSError as e:
        raise InputError(f"--data {source.flag_path}: cannot read {source.entry}: {e.strerror}") from None
    # The size is what was hashed, so the two always agree even if the file changed since it was listed.
    return {"path": source.entry, "size": size, "sha256": digest.hexdigest()}
