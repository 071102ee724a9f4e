"""The filesystem operations the checkpoint protocol is built from: fsync, whole-or-nothing files, hashing reads, walks.

Also the root's flock, which a writer holds from its rename to its marker (write.py) and which
setting aside and cleaning up take before moving anything (recover.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from trackway.checkpoints.digests import new_hasher
from trackway.checkpoints.layout import DIR_FLAGS, CheckpointError, crash_point

_READ_CHUNK = 4 << 20


def walk(root: Path) -> tuple[list[str], list[Path]]:
    """(relative paths of the regular files, directories from root down); links and devices are refused."""
    files, dirs, stack = [], [], [root]
    while stack:
        dirs.append(stack.pop())
        for entry in os.scandir(dirs[-1]):
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                files.append(Path(entry.path).relative_to(root).as_posix())
            else:
                raise CheckpointError(f"{entry.path} is not a regular file or directory; checkpoints hold files only")
    return sorted(files), sorted(dirs, key=lambda d: len(d.parts))


def hash_file(path: Path, fsync: bool = False, algorithm: str = "sha256") -> tuple[int, str]:
    """(size, the file's hex digest by `algorithm`), from one read (and fsynced, if asked)."""
    hasher, size, buffer = new_hasher(algorithm), 0, bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            hasher.update(view[:n])
            size += n
        if fsync:
            os.fsync(f.fileno())
    return size, hasher.hexdigest()


def write_durably(path: Path | str, data: bytes, dir_fd: int | None = None, crash_point_name: str = "") -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        crash_point(crash_point_name)
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(directory: int | Path, name: str, body: dict) -> None:
    """Write `name` in a directory (a path or a descriptor) whole or not at all, and make it durable."""
    dir_fd = directory if isinstance(directory, int) else os.open(directory, DIR_FLAGS)
    try:
        write_durably(f"{name}.tmp", json.dumps(body).encode() + b"\n", dir_fd, f"after_{name}_tmp_write")
        crash_point(f"before_{name}_rename")
        os.rename(f"{name}.tmp", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        crash_point(f"after_{name}_rename")
        os.fsync(dir_fd)
    finally:
        if not isinstance(directory, int):
            os.close(dir_fd)


def fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, DIR_FLAGS if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # some filesystems cannot
            raise
    finally:
        os.close(fd)


def inode_of(path: Path) -> tuple[int, int] | None:
    try:
        return os.lstat(path).st_dev, os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def tree(path: Path) -> tuple[int, float]:
    """(bytes in the files under path, the newest mtime of path and anything under it)."""
    size, newest = 0, float("-inf")
    with suppress(FileNotFoundError):
        newest = os.lstat(path).st_mtime
    for dirpath, dirnames, filenames in os.walk(path):
        for name in ["", *dirnames, *filenames]:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            size += st.st_size if stat.S_ISREG(st.st_mode) else 0
            newest = max(newest, st.st_mtime)
    return size, newest


@contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """An exclusive flock on the root directory; nothing where the filesystem has no flock (ENOLCK...)."""
    fd = os.open(root, DIR_FLAGS)
    try:
        with suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
