"""The data manifest: every file under the `--data` paths with its size and sha256, hashed as one.

A manifest is resolved again at every launch, so an attempt's receipt names the data it read,
not the data its run was submitted with. Unchanged files are not hashed again: a cache under
trackway's home (`cache/data/`) keeps, per set of roots, each file's sha256 by its path, size,
modification time and inode, and the whole manifest by the stat of every file, so resolving
10,000 unchanged files costs about one `os.stat` walk of them. A file modified within
RACY_S of being hashed is not trusted to the cache (a write in the same clock tick would keep
its size and time), as git does with its index.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from trackway.errors import InputError, NotFound
from trackway.receipts.canonical import canonical_json, sha256_hex

CHUNK_BYTES = 2**20
RACY_S = 2.0
_CACHE_FORMAT = 3  # 3: the manifest's signature is taken in walk order


@dataclass(frozen=True)
class DataManifest:
    """The files (path, size, sha256), the absolute roots they came from, and the hash of the files alone.

    `hashed` counts the files whose content was read this time (the rest came from the cache).
    """

    roots: list[str]
    total_bytes: int
    canonical: bytes
    sha256: str
    hashed: int = 0
    listed: list[dict] | None = field(default=None, repr=False, compare=False)

    @property
    def files(self) -> list[dict]:
        """Every file as the manifest lists it (read from the canonical bytes when it came from the cache)."""
        return self.listed if self.listed is not None else json.loads(self.canonical)["files"]


# One file found under a root: (manifest entry, absolute location, size, mtime in ns, inode).
_Found = tuple[str, str, int, int, int]


def build_data_manifest(
    paths: Sequence[str | Path],
    console: Console | None = None,
    progress_threshold_bytes: int = 64 * 2**20,
    cache_dir: Path | None = None,
) -> DataManifest | None:
    """Hash every file under `paths` (files, or directories walked recursively); None when `paths` is empty.

    An entry is named `<root basename>/<relative posix path>`, so the manifest hash depends on
    content and names, not on where the data lives; `roots` records where it was read from (each
    path made absolute as given, so a `current` link resolves again at the next launch) but is
    left out of the hash. Symlinked files are followed; symlinked directories are not, so a link
    cycle cannot loop. Sockets, FIFOs and devices are skipped: reading them blocks or means
    nothing. A progress bar is shown when what must be hashed reaches `progress_threshold_bytes`.
    With `cache_dir`, unchanged files are taken from the cache (see the module's docstring).
    """
    if not paths:
        return None
    roots = _roots(paths)
    found: list[_Found] = []
    for flag_path, name, root in roots:
        _walk(flag_path, name, root, found)
    given = [abspath for _, _, abspath in roots]
    cache = _Cache(cache_dir, given) if cache_dir is not None else None
    signature = b""
    if cache is not None:
        # Taken in the order the walk found the files, which an unchanged directory repeats: sorting
        # 10,000 entries is ~6% of re-resolving them, and only a miss needs the manifest's order.
        signature = _signature(found)
        remembered = cache.manifest(signature)
        if remembered is not None:
            return remembered
    found.sort()
    _check_names(roots, found)
    known = cache.files() if cache is not None else {}
    files: list[dict | None] = [None] * len(found)
    todo: list[tuple[int, _Found]] = []
    for i, item in enumerate(found):
        entry, location, size, mtime_ns, inode = item
        hit = known.get(location)
        if hit is not None and hit[:3] == (size, mtime_ns, inode):
            files[i] = {"path": entry, "size": size, "sha256": hit[3]}
        else:
            todo.append((i, item))
    total = sum(item[2] for _, item in todo)
    started = time.time()
    if total >= progress_threshold_bytes:
        hashed = _hash_with_progress(roots, todo, total, console or Console(stderr=True))
    else:
        hashed = [_hash_file(_flag_of(roots, item[0]), item, lambda n: None) for _, item in todo]
    for (i, item), result in zip(todo, hashed):
        files[i] = result
        if cache is not None and started - item[3] / 1e9 > RACY_S:
            known[item[1]] = (item[2], item[3], item[4], result["sha256"])
    canonical = canonical_json({"files": files})
    manifest = DataManifest(
        roots=given,
        total_bytes=sum(f["size"] for f in files),  # type: ignore[index]
        canonical=canonical,
        sha256=sha256_hex(canonical),
        hashed=len(todo),
        listed=files,  # type: ignore[arg-type]
    )
    if cache is not None:
        racy = any(started - item[3] / 1e9 <= RACY_S for item in found)
        cache.store(known, None if racy else signature, manifest)
    return manifest


def _flag_of(roots: list[tuple[str, str, str]], entry: str) -> str:
    """The `--data` path as given that an entry came from (for error messages)."""
    top = entry.split("/", 1)[0]
    return next((flag for flag, name, _ in roots if name == top), roots[0][0])


def _roots(paths: Sequence[str | Path]) -> list[tuple[str, str, str]]:
    """(the path as given, its name in the manifest, its absolute path) for each `--data` path."""
    roots: list[tuple[str, str, str]] = []
    given_by_name: dict[str, str] = {}
    for p in map(str, paths):
        if not os.path.exists(p):
            raise NotFound(f"--data {p}: no such file or directory")
        absolute = os.path.abspath(p)
        # The name as given, not as resolved: `--data current` names the data `current` even when it links to `v3`.
        name = Path(absolute).name or Path(p).resolve().name or "root"
        if name in given_by_name:
            raise InputError(
                f"--data {given_by_name[name]} and --data {p}: both would be named '{name}' in the manifest; "
                "pass their common parent instead, or rename one"
            )
        given_by_name[name] = p
        roots.append((p, name, absolute))
    return roots


def _walk(flag_path: str, name: str, root: str, found: list[_Found]) -> None:
    """Append every regular file under `root` (followed if it is a link) to `found`, with its stat.

    The loop is the cost of re-resolving unchanged data, so it does as little per file as a bare
    stat walk: one stat, one tuple. File names are checked for UTF-8 when the manifest is encoded.
    """
    resolved = os.path.realpath(root)
    if not os.path.isdir(resolved):
        _add(flag_path, name, resolved, found)
        return
    append, regular = found.append, stat.S_IFREG
    pending = [(resolved, f"{name}/")]
    while pending:
        directory, base = pending.pop()
        prefix = directory if directory.endswith(os.sep) else directory + os.sep  # `--data /` walks "/" itself
        try:
            with _listing(directory) as listing:
                for entry in listing:
                    # A linked directory is not followed (a link cycle cannot loop); a linked file is.
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((prefix + entry.name, f"{base}{entry.name}/"))
                        continue
                    try:
                        info = entry.stat()
                    except OSError as e:
                        raise InputError(f"--data {flag_path}: cannot read {base}{entry.name}: {e.strerror} "
                                         "(a broken symlink?)") from None
                    if info.st_mode & 0o170000 == regular:
                        append((base + entry.name, prefix + entry.name, info.st_size, info.st_mtime_ns, info.st_ino))
        except OSError as e:
            raise InputError(f"--data {flag_path}: cannot list {directory}: {e.strerror}") from None


@contextmanager
def _listing(directory: str) -> Iterator[list[os.DirEntry]]:
    """A directory's entries, listed through the directory's fd where the platform can.

    Through an fd, each entry's stat looks up one name in that directory instead of walking its
    whole path again: 7% of re-resolving 10,000 unchanged files. (The entries' `path` is then only
    their name: callers join names to the directory themselves.)
    """
    if os.scandir not in os.supports_fd:
        with os.scandir(directory) as listing:
            yield list(listing)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as listing:
            yield list(listing)
    finally:
        os.close(fd)


def _add(flag_path: str, entry: str, location: str, found: list[_Found]) -> None:
    try:
        info = os.stat(location)
    except OSError as e:
        raise InputError(f"--data {flag_path}: cannot read {entry}: {e.strerror} (a broken symlink?)") from None
    if stat.S_ISREG(info.st_mode):
        found.append((entry, location, info.st_size, info.st_mtime_ns, info.st_ino))


def _check_names(roots: list[tuple[str, str, str]], found: list[_Found]) -> None:
    """Refuse a file name that is not valid UTF-8 (a manifest is UTF-8 JSON), naming it."""
    for entry, *_ in found:
        try:
            entry.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"--data {_flag_of(roots, entry)}: file name {entry!r} is not valid UTF-8; "
                             "rename it") from None


def _hash_with_progress(roots: list[tuple[str, str, str]], todo: list[tuple[int, _Found]], total: int,
                        console: Console) -> list[dict]:
    columns = (
        TextColumn("hashing data"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("hashing", total=total)
        return [_hash_file(_flag_of(roots, item[0]), item, lambda n: progress.advance(task, n)) for _, item in todo]


def _hash_file(flag_path: str, item: _Found, advance: Callable[[int], None]) -> dict:
    entry, location = item[0], item[1]
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    try:
        with open(location, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
                size += n
                advance(n)
    except OSError as e:
        raise InputError(f"--data {flag_path}: cannot read {entry}: {e.strerror}") from None
    # The size is what was hashed, so the two always agree even if the file changed since it was listed.
    return {"path": entry, "size": size, "sha256": digest.hexdigest()}


class _Cache:
    """What was hashed before under one set of roots: each file's sha256 by its stat, and the last manifest.

    Two files per set of roots, each replaced whole (written beside, then renamed): a reader sees
    the old one or the new one. A file that cannot be read or written only costs a hashing.
    """

    def __init__(self, directory: Path, roots: list[str]):
        self.directory = Path(directory) / "data"
        self.key = hashlib.sha256("\0".join(roots).encode("utf-8", "surrogateescape")).hexdigest()[:32]

    def manifest(self, signature: bytes) -> DataManifest | None:
        """The manifest last built under these roots, if the walk found every file as it was then (`_signature`)."""
        stored = self._load("manifest")
        if not isinstance(stored, tuple) or len(stored) != 6 or stored[0] != _CACHE_FORMAT:
            return None
        _, remembered, canonical, roots, total, sha256 = stored
        if remembered != signature:
            return None
        return DataManifest(roots=list(roots), total_bytes=total, canonical=canonical, sha256=sha256)

    def files(self) -> dict[str, tuple[int, int, int, str]]:
        stored = self._load("files")
        if isinstance(stored, tuple) and len(stored) == 2 and stored[0] == _CACHE_FORMAT and isinstance(stored[1], dict):
            return stored[1]
        return {}

    def store(self, files: dict, signature: bytes | None, manifest: DataManifest) -> None:
        self._save("files", (_CACHE_FORMAT, files))
        if signature is not None:
            self._save("manifest", (_CACHE_FORMAT, signature, manifest.canonical, tuple(manifest.roots),
                                    manifest.total_bytes, manifest.sha256))

    def _load(self, what: str):
        try:
            return marshal.loads((self.directory / f"{self.key}.{what}").read_bytes())
        except (OSError, EOFError, ValueError, TypeError):
            return None

    def _save(self, what: str, value) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.key}.", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(value))
            os.replace(tmp, self.directory / f"{self.key}.{what}")
        except OSError:
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass


def _signature(found: list[_Found]) -> bytes:
    """One digest of every file's name, location and stat, in the walk's order.

    Equal only if nothing was added, removed or touched. A directory listed in another order (the
    filesystem's choice) gives another digest too: that costs one re-resolution from the files
    cache, never a wrong manifest.

    Marshal format 2: later formats write back-references that depend on which objects are shared,
    so equal lists could give different bytes.
    """
    return hashlib.sha256(marshal.dumps(found, 2)).digest()
