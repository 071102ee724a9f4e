"""The few storage operations the remote checkpoint protocol needs, on any fsspec filesystem.

    find(path)           every object below `path`: {path: (size, mtime)}, always read fresh
    cat(paths)           a batch of small reads: {path: bytes, or None when absent}
    put(pairs, ping)     local files up, concurrently (fsspec's put)
    get(paths, targets)  objects down to local files, concurrently (fsspec's get)
    write(path, data)    one small object, whole
    create(path, data)   one small object, only if absent: False when it exists (the commit marker)
    remove(paths)        objects gone (a missing one is no error)
    hash(path)           (size, sha256) of an object, read in chunks
    abort_multipart()    S3 uploads left incomplete under the root

On a local or mounted filesystem (a plain path or file://) writes are durable before they return
(files and the directories that name them fsynced) and `create` is an O_EXCL hard link of a
complete temporary file, so no reader ever sees a half-written marker. Elsewhere `create` is
s3fs's PutObject with If-None-Match: * (fsspec's mode="create"), preceded by a read for the
stores that would not refuse the put.

Filesystems are opened lazily, one per process: fsspec's IO loop does not survive a fork, so a
child opens its own; threads share one. Store failures come out as RemoteStoreError naming the
URL; a missing object stays FileNotFoundError, and a full local disk keeps its OSError (errno).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

from trackway.checkpoints.layout import CheckpointError, crash_point, new_token, parse_time

_INSTALL = {"s3": "pip install 'trackway[remote]'", "s3a": "pip install 'trackway[remote]'",
            "gs": "pip install gcsfs", "gcs": "pip install gcsfs", "az": "pip install adlfs",
            "abfs": "pip install adlfs"}
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)

Ping = Callable[[], None]


class RemoteStoreError(CheckpointError):
    """The store could not be read or written (network, credentials, a missing bucket); the message names the URL."""


class ObjectFS:
    """One URL's filesystem (opened per process) and the operations above, paths relative to nothing: full paths."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/") or url
        # None: s3fs and botocore read the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
        # AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); botocore ≥ 1.31 honours AWS_ENDPOINT_URL itself.
        self.storage_options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._fs: Any = None
        self._root = ""
        self.local = False
        self._open()  # a missing package is said now, before any checkpoint is waiting on it
        if self.local and "://" not in self.url:
            self.url = self._root

    @property
    def fs(self) -> Any:
        return self._open()[0]

    @property
    def root(self) -> str:
        return self._open()[1]

    def path(self, *parts: str) -> str:
        """The filesystem's path of `parts` under the root."""
        return "/".join([self.root.rstrip("/"), *parts])

    def url_of(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    @contextmanager
    def io(self, what: str) -> Iterator[None]:
        """Store failures as RemoteStoreError ("<what> <url> failed: ..."); see the module docstring."""
        try:
            yield
        except (CheckpointError, FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # a full local disk (a download): the caller names it, keeping the errno
            raise RemoteStoreError(f"{what} {self.url} failed: {type(exc).__name__}: {first_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - whatever the backend raises, the caller needs one kind
            raise RemoteStoreError(f"{what} {self.url} failed: {type(exc).__name__}: {first_line(exc)}") from exc

    def find(self, path: str, must_exist: bool = False) -> dict[str, tuple[int, float | None]]:
        """{object path: (size, mtime)} below `path`; `must_exist`: a missing bucket is an error, not emptiness."""
        with self.io("list"):
            try:
                found = self.fs.find(path, detail=True)
            except FileNotFoundError:
                if must_exist and not self.local:
                    raise RemoteStoreError(f"list {self.url} failed: the bucket or container does not exist") from None
                return {}
        return {name: (int(d.get("size") or 0), _mtime(d)) for name, d in found.items() if d.get("type") != "directory"}

    def cat(self, paths: list[str]) -> dict[str, bytes | None]:
        """{path: bytes, or None when it is absent}, read in one batch."""
        if not paths:
            return {}
        with self.io("read from"):
            read = self.fs.cat(paths, on_error="return")
        out = {}
        for path in paths:
            value = read.get(path)
            if isinstance(value, FileNotFoundError):
                value = None
            elif isinstance(value, BaseException):
                raise RemoteStoreError(f"read from {self.url} failed: {type(value).__name__}: {first_line(value)}")
            out[path] = value
        return out

    def put(self, pairs: list[tuple[str, str]], ping: Ping) -> None:
        """Local files (source, target) up; `ping` whenever bytes moved. Passes the crash point upload_mid_payload."""
        if self.local:
            for n, (source, target) in enumerate(pairs):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)
                _fsync(target)
                ping()
                if n == 0:
                    crash_point("upload_mid_payload")
            self._fsync_dirs([t for _, t in pairs])
        elif pairs:
            self.fs.put([s for s, _ in pairs], [t for _, t in pairs], callback=_progress(ping))

    def get(self, sources: list[str], targets: list[Path]) -> None:
        if self.local:
            for source, target in zip(sources, targets):
                shutil.copyfile(source, target)
        elif sources:
            self.fs.get(sources, [str(t) for t in targets])

    def write(self, path: str, data: bytes) -> None:
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write_durably(path, data)
            self._fsync_dirs([path])
        else:
            self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> bool:
        """Write `path` only if it does not exist, whole or not at all; False when it existed."""
        if not self.local:
            try:
                self.fs.cat_file(path)
                return False  # for stores that would not refuse the put below
            except FileNotFoundError:
                pass
            try:
                self.fs.pipe_file(path, data, mode="create")  # s3fs: PutObject with IfNoneMatch="*"
            except FileExistsError:
                return False
            return True
        temp = f"{path}.{new_token()}.tmp"
        _write_durably(temp, data)
        try:
            try:
                os.link(temp, path)  # atomic and exclusive: readers never see a half-written marker
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise
                with open(path, "xb") as f:  # no hard links here: still exclusive, only not atomic
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
        finally:
            with suppress(FileNotFoundError):
                os.unlink(temp)
        _fsync(os.path.dirname(path))
        return True

    def remove(self, paths: list[str]) -> None:
        if self.local:
            for path in paths:
                with suppress(FileNotFoundError):
                    os.unlink(path)
            for directory in {os.path.dirname(p) for p in paths}:
                with suppress(FileNotFoundError):
                    _fsync(directory)
        elif paths:
            with suppress(FileNotFoundError):
                self.fs.rm(paths)

    def prune_dirs(self, directories: set[str], stop: str) -> None:
        """Remove empty local directories, deepest first, up to (and with) `stop` when it is empty too."""
        if not self.local:
            return  # object stores have no directories
        for directory in sorted(directories, key=len, reverse=True):
            while directory.startswith(stop + "/"):
                try:
                    os.rmdir(directory)
                except OSError:
                    break
                directory = os.path.dirname(directory)
        with suppress(OSError):
            os.rmdir(stop)

    def hash(self, path: str) -> tuple[int, str] | None:
        """(size, sha256) of an object read from the store; None when it is missing."""
        sha, size = hashlib.sha256(), 0
        try:
            with self.fs.open(path, "rb") as f:
                while chunk := f.read(8 << 20):
                    sha.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            return None
        return size, sha.hexdigest()

    def abort_multipart(self, min_age_s: float, now: float) -> None:
        """Abort S3 multipart uploads under the root at least `min_age_s` old (killed writers' parts cost storage)."""
        if not hasattr(self.fs, "call_s3"):
            return
        bucket, _, prefix = self.root.partition("/")
        with self.io("clean debris in"):
            listed = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{prefix}/" if prefix else "")
            for upload in listed.get("Uploads") or []:
                started = upload.get("Initiated")
                if min_age_s > 0 and started is not None and now - started.timestamp() < min_age_s:
                    continue
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    def _open(self) -> tuple[Any, str]:
        with self._lock:
            if self._pid != os.getpid():
                self._fs, self._root = _open_filesystem(self.url, self.storage_options)
                from fsspec.implementations.local import LocalFileSystem

                self.local = isinstance(self._fs, LocalFileSystem)
                self._pid = os.getpid()
            return self._fs, self._root

    def _fsync_dirs(self, paths: list[str]) -> None:
        """Make new directory entries durable, from the deepest up to the root (local filesystems only)."""
        top, directories = self.root.rstrip("/"), set()
        for path in paths:
            directory = os.path.dirname(path)
            while directory.startswith(top) and directory not in directories:
                directories.add(directory)
                directory = os.path.dirname(directory)
        for directory in sorted(directories, key=len, reverse=True):
            _fsync(directory)


def _with_environment(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """S3 options with what botocore would read from the environment made explicit.

    fsspec keeps one filesystem per set of constructor arguments. Left implicit, an endpoint or a
    key that changed in the environment (another store; a test's own server) would be served by
    the instance made for the old one, talking to the wrong place.
    """
    if protocol not in ("s3", "s3a"):
        return options
    env = os.environ
    out = dict(options)
    client = dict(out.get("client_kwargs") or {})
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in client and "endpoint_url" not in out:
        client["endpoint_url"] = endpoint
    if env.get("AWS_DEFAULT_REGION") and "region_name" not in client:
        client["region_name"] = env["AWS_DEFAULT_REGION"]
    if client:
        out["client_kwargs"] = client
    if env.get("AWS_ACCESS_KEY_ID") and not {"key", "secret", "profile", "anon"} & set(out):
        out["key"], out["secret"] = env["AWS_ACCESS_KEY_ID"], env.get("AWS_SECRET_ACCESS_KEY")
        if env.get("AWS_SESSION_TOKEN"):
            out["token"] = env["AWS_SESSION_TOKEN"]
    return out


def _open_filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise CheckpointError(f"checkpoint store {url} needs fsspec: pip install 'trackway[remote]'") from None
    try:
        # No listings cache: s3fs answers info() (and so cat_file's size check) from a listing it
        # kept, which misses what another writer put since; a reader must always see the store.
        return url_to_fs(url, **{"use_listings_cache": False, **_with_environment(protocol, options)})
    except ImportError as exc:
        hint = _INSTALL.get(protocol, f"install the fsspec backend for {protocol}://")
        raise CheckpointError(f"checkpoint store {url}: {protocol}:// needs a package that is not installed "
                              f"({first_line(exc)}): {hint}") from None
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint store {url}: {first_line(exc)}") from None


def _progress(ping: Ping) -> Any:
    """An fsspec transfer callback that only says "something moved", and passes the mid-payload crash point.

    fsspec calls it on its IO thread: it must neither block nor use the filesystem.
    """
    from fsspec.callbacks import Callback

    class Progress(Callback):
        def __init__(self, files: bool) -> None:
            super().__init__()
            self.files = files  # the parent counts finished files; its children count bytes

        def call(self, *args: Any, **kwargs: Any) -> None:
            ping()

        def branched(self, path_1: Any, path_2: Any, **kwargs: Any) -> Callback:
            return Progress(files=False)

        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            if self.files and self.value == 1:
                crash_point("upload_mid_payload")

    return Progress(files=True)


def _mtime(detail: dict) -> float | None:
    """An object's modification time from whichever key its backend uses."""
    for key in ("LastModified", "mtime", "updated", "last_modified", "timeCreated", "created"):
        value = detail.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and (moment := parse_time(value.replace("Z", "+00:00"))) is not None:
            return moment.timestamp()
    return None


def first_line(exc: BaseException) -> str:
    """An exception's message as one line."""
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.splitlines()[0].split())


def _write_durably(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # directories on some filesystems
            raise
    finally:
        os.close(fd)
