"""Directories private to this user in a shared place such as /tmp: made 0700, refused when they are not.

A name in /tmp is anyone's to take first. A directory another user made, or can write, lets them
replace what trackway puts there: a spool's fallback lines, or the SSH control socket that every
command to a host goes through. Standard library only: the SDK's spool writer uses it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def make_private_dir(directory: Path) -> Path:
    """`directory`, created with mode 0700 if missing; PermissionError when it is not this user's alone."""
    directory.mkdir(mode=0o700, exist_ok=True)
    check_private(directory)
    return directory


def check_private(directory: Path) -> None:
    """PermissionError (its strerror says what is wrong, its filename is `directory`) unless `directory` is a
    real directory of this user's that no one else can write."""
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        _refuse(directory, "not a directory (a symbolic link or a file is in its place)")
    if info.st_uid != os.getuid():
        _refuse(directory, f"owned by uid {info.st_uid}, not by this user (uid {os.getuid()})")
    if info.st_mode & 0o022:
        _refuse(directory, f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o})")


def _refuse(directory: Path, why: str) -> None:
    raise PermissionError(errno.EPERM, why, str(directory))
