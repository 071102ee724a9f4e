"""The checkpoint protocol on an object store (any fsspec URL): upload, list, verify, download, retain, clean.

A run's checkpoints outlive its machine when they also go to a URL (`s3://bucket/prefix`, `gs://...`,
`file:///mnt/volume/...` or a path on a mounted network volume). The local root stays the
write-through cache: a checkpoint is committed there first (write.py), then uploaded here.
Under the URL, for one run:

    step-00001234/<token>/<relpath>             payload, under a prefix of this writer's own (new_token())
    step-00001234/<token>/MANIFEST.json         the local checkpoint's manifest, byte for byte
    step-00001234/COMMITTED                     the marker, last, only if absent: {"step", "token",
                                                "manifest_sha256", "committed_at", "size_bytes", ...}
    step-00001234/<token>/SUPERSEDED            retention's mark on a committed checkpoint
    step-00001234.corrupt-<UTC time>/COMMITTED  a marker set aside (a copy; its token's objects stay, as evidence)
    step-00001234.refused-<UTC time>/COMMITTED  (the loader refused the content)

Committed iff the marker parses, the manifest at its token hashes to its manifest_sha256, the
manifest's step is the directory's, and every file the manifest lists exists with its size: one
listing and two batches of small reads tell all of that for every step. A download hashes every
byte against the manifest before the local commit; `verify()` hashes without keeping the bytes.

Objects never move, so no rename makes the commit atomic: the marker does. It is put with
If-None-Match: * (s3fs's mode="create"; on a local or mounted filesystem an O_EXCL hard link), so
of two writers on one step exactly one commits. The other gets the winner's checkpoint back when
it has the same manifest (and removes its own copy), else UploadLost; each writer writes under its
own token, so nobody's bytes are overwritten. Another fsspec backend gets fsspec's mode="create",
atomic only where that backend makes it so.

Not every store's conditional put is atomic: moto's server checks, then writes, and some
S3-compatible stores ignore If-None-Match. So off a local filesystem a writer also looks for a
marker just before its put, and after a put that succeeded waits a moment (several times the put's
round trip) before reading the marker back: a racing put that slipped past the store's check has
landed by then, and whoever's marker is there is the one winner, for both writers.

Deletion removes the marker first, then the token's objects, SUPERSEDED last: a delete cut short
leaves a token no marker names that holds SUPERSEDED, debris finished at any age. A token no marker
names and without SUPERSEDED is an upload in progress or abandoned: debris once old enough.

Errors (each message one line, naming the URL):

    CheckpointError (layout.py)
    ├── RemoteStoreError         the store could not be read or written: network, credentials, bucket (object_fs.py)
    ├── RemoteCheckpointCorrupt  a remote checkpoint failed verification: proof, so it may be set aside
    └── UploadLost               another writer committed the step with other content; `.winner` is theirs
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trackway.checkpoints.durable import hash_file
from trackway.checkpoints.layout import (
    MANIFEST,
    MARKER,
    STAMP_FORMAT,
    STAMP_RE,
    SUPERSEDED_MARK,
    TOKEN_RE,
    CheckpointError,
    CheckpointInfo,
    CheckpointState,
    clean_relpath,
    crash_point,
    new_token,
    one_line,
    parse_set_aside,
    parse_step,
    parse_time,
    step_dir_name,
)
from trackway.checkpoints.object_fs import ObjectFS, Ping, RemoteStoreError
from trackway.checkpoints.recover import SetAside
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.verify import marker_problems
from trackway.checkpoints.write import disk_full_named

__all__ = ["CRASH_POINTS", "PendingUpload", "RemoteCheckpoint", "RemoteCheckpointCorrupt", "RemoteCheckpointStore",
           "RemoteStoreError", "UploadLost"]

# The kill tests' points on the way up (TRACKWAY_CHECKPOINT_CRASH_AT, as in layout.py).
CRASH_POINTS = ("upload_mid_payload", "upload_after_payload", "upload_after_manifest", "upload_after_marker",
                "remote_delete_after_marker")
_HASHERS = 4
MARKER_SETTLE_S = 0.1  # the least wait before reading a marker back (see the module docstring)


class RemoteCheckpointCorrupt(CheckpointError):
    """A remote checkpoint that failed verification (marker, manifest, a missing or short object, a wrong hash)."""


class UploadLost(CheckpointError):
    """Another writer committed this step first, with other content; `winner` is its checkpoint."""

    def __init__(self, message: str, winner: RemoteCheckpoint) -> None:
        super().__init__(message)
        self.winner = winner


@dataclass(frozen=True)
class RemoteCheckpoint:
    """One step under the URL as the store held it when listed; `state` as in layout.CheckpointState."""

    step: int
    url: str
    state: CheckpointState
    token: str | None
    manifest: dict | None
    manifest_sha256: str | None
    committed_at: datetime | None
    size_bytes: int
    problems: tuple[str, ...] = ()
    marker: bytes | None = field(default=None, repr=False, compare=False)
    manifest_bytes: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return step_dir_name(self.step)


@dataclass
class _Held:
    """What one step-N prefix holds: its marker's bytes and each token's objects {relpath: (size, mtime)}."""

    marker: bytes | None = None
    tokens: dict[str, dict[str, tuple[int, float | None]]] = field(default_factory=dict)


class RemoteCheckpointStore:
    """A run's checkpoints under one fsspec URL: upload, list, download, set aside, supersede, delete, clean."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        text = os.fspath(url) if isinstance(url, (str, os.PathLike)) else None
        if not text or not text.strip():
            raise CheckpointError(f"a checkpoint store needs a URL or a path, got {url!r}")
        self._ofs = ObjectFS(text, storage_options)

    def __repr__(self) -> str:
        return f"RemoteCheckpointStore({self.url!r})"

    @property
    def url(self) -> str:
        """The URL as given (a plain path made absolute), without a trailing slash."""
        return self._ofs.url

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, one per process: a forked child opens its own (fsspec's IO loop is per process)."""
        return self._ofs.fs

    @property
    def root(self) -> str:
        """The URL's path as the filesystem names it (`bucket/prefix`, `/mnt/volume/run`)."""
        return self._ofs.root

    # -- writing -----------------------------------------------------------------------------

    def upload(self, local: CheckpointInfo, *, progress: Ping | None = None) -> RemoteCheckpoint:
        """Copy a committed local checkpoint here and commit it; idempotent. Returns the committed checkpoint.

        Already committed here with the same manifest: returned, nothing sent. Committed with
        another manifest (before or during this upload): UploadLost. `progress` is called from
        any thread whenever bytes moved (a liveness signal, not a byte count).
        """
        staged = self._stage_checked(local)
        existing = self.get(local.step)
        if existing is not None and existing.state.readable:
            return self._settle(existing, staged[1], None)
        return self.stage(local, progress=progress, _checked=staged).commit()

    def stage(self, local: CheckpointInfo, *, progress: Ping | None = None, _checked: Any = None) -> PendingUpload:
        """Put a committed local checkpoint's payload and manifest under a new token; `commit()` makes it count.

        The local files are hashed against their manifest while they go up; a mismatch raises
        (the local checkpoint is damaged) and removes what was put.
        """
        path, manifest_bytes, manifest = _checked or self._stage_checked(local)
        token = new_token()
        name = step_dir_name(local.step)
        files = sorted(manifest["files"])
        pairs = [(str(path / rel), self._path(name, token, rel)) for rel in files]
        pending = PendingUpload(self, local.step, token, manifest_bytes, manifest)
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trackway-upload-hash") as pool:
                checked = pool.submit(_local_problems, path, manifest["files"])
                with self._ofs.io("upload to"):
                    self._ofs.put(pairs, progress or _nothing)
                problems = checked.result()
            if problems:
                raise CheckpointError(f"local checkpoint {path} does not match its manifest ({one_line(problems)}); "
                                      f"not uploaded to {self.url}")
            crash_point("upload_after_payload")
            pending._check_sizes()
            with self._ofs.io("upload to"):
                self._ofs.write(self._path(name, token, MANIFEST), manifest_bytes)
            crash_point("upload_after_manifest")
        except BaseException:
            pending.abort()
            raise
        return pending

    def set_aside(self, ckpt: RemoteCheckpoint, reason: str, kind: str = "corrupt") -> SetAside:
        """Take a step's marker out of the resume path, keeping a copy as `step-N.<kind>-<UTC time>/COMMITTED`.

        The token's objects stay where they are (evidence). A marker that changed since `ckpt` was
        read (a new commit of the step) is left alone, and so is a step with no marker.
        """
        if kind not in ("corrupt", "refused"):
            raise CheckpointError(f"set_aside kind must be 'corrupt' or 'refused', got {kind!r}")
        name, why = ckpt.name, one_line([reason])
        with self._ofs.io("set aside a checkpoint in"):
            try:
                current = self.fs.cat_file(self._path(name, MARKER))
            except FileNotFoundError:
                current = None
            if current is None or (ckpt.marker is not None and current != ckpt.marker):
                return SetAside(name, why, None, self._url(name), kind)
            # Nothing can replace the marker between this read and its removal: a commit needs it absent.
            target = f"{name}.{kind}-{datetime.now(timezone.utc).strftime(STAMP_FORMAT)}"
            self._ofs.write(self._path(target, MARKER), current)
            self._ofs.remove([self._path(name, MARKER)])
        return SetAside(name, why, target, self._url(target), kind)

    def supersede(self, ckpt: RemoteCheckpoint) -> RemoteCheckpoint:
        """Mark a committed checkpoint superseded (it stays readable until deleted)."""
        current = self.get(ckpt.step)
        if current is None or not current.state.readable:
            raise CheckpointError(f"cannot supersede {self._url(ckpt.name)}: it is {_state_of(current)}")
        if current.state is CheckpointState.COMMITTED:
            body = json.dumps({"superseded_at": datetime.now(timezone.utc).isoformat()}).encode() + b"\n"
            with self._ofs.io("supersede a checkpoint in"):
                self._ofs.write(self._path(current.name, current.token, SUPERSEDED_MARK), body)
        return self.get(ckpt.step) or current

    def delete(self, ckpt: RemoteCheckpoint | int) -> None:
        """Remove a committed or superseded checkpoint: the marker first, then its objects, SUPERSEDED last."""
        step = ckpt if isinstance(ckpt, int) else ckpt.step
        current = self.get(step)
        if current is None or current.state is CheckpointState.DELETED:
            return
        if not current.state.readable:
            raise CheckpointError(f"cannot delete {current.url}: it is {current.state.value}, not committed")
        if isinstance(ckpt, RemoteCheckpoint) and ckpt.token != current.token:
            raise CheckpointError(f"cannot delete {current.url}: it was committed again since it was read")
        if current.state is CheckpointState.COMMITTED:
            current = self.supersede(current)
        with self._ofs.io("delete a checkpoint in"):
            self._ofs.remove([self._path(current.name, MARKER)])
            crash_point("remote_delete_after_marker")
            self._remove_token(current.name, current.token)

    def clean_debris(self, min_age_s: float = 3600.0) -> list[str]:
        """Remove debris at least `min_age_s` old (a delete cut short: any age) and return its URLs.

        Age: the youngest of the time in the token and its objects' modification times. min_age_s=0
        removes all debris, for when no writer can be running. On S3, multipart uploads left
        incomplete under the URL (a writer killed mid-file) are aborted by the same rule.
        """
        now, removed = time.time(), []
        for name, token, objects in self._debris():
            if SUPERSEDED_MARK not in objects and min_age_s > 0 and now - _youngest(token, objects) < min_age_s:
                continue
            held = self._scan(parse_step(name)).get(parse_step(name))
            if held is not None and _named_token(held.marker) == token:
                continue  # its marker landed after the listing: committed, not debris
            with self._ofs.io("clean debris in"):
                self._remove_token(name, token)
            removed.append(self._url(name, token))
        self._ofs.abort_multipart(min_age_s, now)
        return removed

    def debris(self) -> list[str]:
        """URLs of token prefixes no marker (live or set aside) names: uploads in progress, abandoned or deleted."""
        return [self._url(name, token) for name, token, _ in self._debris()]

    # -- reading -----------------------------------------------------------------------------

    def list(self) -> list[RemoteCheckpoint]:
        """Every step under the URL, by step: committed, superseded, corrupt (with problems), writing or deleted."""
        return self._judge(self._scan())

    def get(self, step: int) -> RemoteCheckpoint | None:
        """One step as the store holds it now; None when nothing is under `step-N/`."""
        step_dir_name(step)
        return next(iter(self._judge(self._scan(step))), None)

    def latest_committed(self, verify: bool = True) -> RemoteCheckpoint | None:
        """The resume target: the newest committed (or superseded) checkpoint that verifies; reads only.

        verify=True: its marker, its manifest and every object's size (one listing, what readers
        trust); verify=False: the marker and the manifest. Bytes are hashed by `download()` (and
        `verify()`), never here. Nothing is set aside: a restore does that (CheckpointManager).
        """
        listed = self._judge(self._scan(), sizes=verify)
        return next((c for c in reversed(listed) if c.state.readable), None)

    def verify(self, ckpt: RemoteCheckpoint) -> list[str]:
        """What is wrong with a checkpoint as stored now, every object read and hashed; [] when good."""
        current = self.get(ckpt.step)
        if current is None or current.token != ckpt.token:
            return [f"{self._url(ckpt.name)} is no longer the checkpoint that was read"]
        if not current.state.readable:
            return list(current.problems) or [f"{current.url} is {current.state.value}"]
        files = sorted(current.manifest["files"].items())
        paths = [self._path(current.name, current.token, rel) for rel, _ in files]
        with self._ofs.io("read from"), ThreadPoolExecutor(_HASHERS, thread_name_prefix="trackway-verify") as pool:
            digests = list(pool.map(self._ofs.hash, paths))
        return _digest_problems(files, digests)

    def download(self, which: int | RemoteCheckpoint, into: CheckpointStore) -> CheckpointInfo:
        """Copy a committed checkpoint into a local store, every byte hashed before the local commit.

        The result is an ordinary committed local checkpoint with the same manifest (same sha256).
        A missing, short or altered object raises RemoteCheckpointCorrupt; a store that cannot be
        read raises RemoteStoreError. Either way nothing is committed locally.
        """
        ckpt = self.get(which) if isinstance(which, int) else which
        if ckpt is None:
            raise CheckpointError(f"no checkpoint step {which} under {self.url}")
        if not ckpt.state.readable:
            raise RemoteCheckpointCorrupt(f"{ckpt.url} is {ckpt.state.value}: {one_line(ckpt.problems)}")
        manifest = ckpt.manifest
        files = sorted(manifest["files"].items())
        pending = into.begin(ckpt.step, run_id=manifest.get("run_id"), attempt_id=manifest.get("attempt_id"),
                             parent=manifest.get("parent"))
        try:
            targets = [pending.path / rel for rel, _ in files]
            with disk_full_named(into.root, ckpt.step):
                for target in targets:
                    target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with self._ofs.io("download from"):
                        self._ofs.get([self._path(ckpt.name, ckpt.token, rel) for rel, _ in files], targets)
                except FileNotFoundError as exc:
                    raise RemoteCheckpointCorrupt(f"{ckpt.url}: an object is missing ({exc})") from None
                with ThreadPoolExecutor(_HASHERS, thread_name_prefix="trackway-download-hash") as pool:
                    digests = list(pool.map(hash_file, targets))
            problems = _digest_problems(files, digests)
            if problems:
                raise RemoteCheckpointCorrupt(f"{ckpt.url}: {one_line(problems)}")
            for (rel, _), (size, sha) in zip(files, digests):
                pending.add_digest(rel, size, sha)
            return pending.commit(manifest=ckpt.manifest_bytes)
        except BaseException:
            pending.abort()
            raise

    # -- the filesystem ----------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return self._ofs.path(*parts)

    def _url(self, *parts: str) -> str:
        return self._ofs.url_of(*parts)

    def _remove_token(self, name: str, token: str) -> None:
        """All of a token's objects, SUPERSEDED last (until it goes, the remnant reads as a deletion)."""
        objects = self._scan(parse_step(name)).get(parse_step(name), _Held()).tokens.get(token, {})
        self._ofs.remove([self._path(name, token, rel) for rel in sorted(objects) if rel != SUPERSEDED_MARK])
        self._ofs.remove([self._path(name, token, SUPERSEDED_MARK)])
        directories = {os.path.dirname(self._path(name, token, rel)) for rel in objects} | {self._path(name, token)}
        self._ofs.prune_dirs(directories, self._path(name))

    # -- listing and judging ------------------------------------------------------------------

    def _scan(self, step: int | None = None) -> dict[int, _Held]:
        """What each step-N prefix holds (or only `step`'s), from one listing and one batch of marker reads.

        The whole root's listing also returns set-aside markers, under negative keys (-1, -2, ...):
        only the tokens they name matter (their objects are evidence, not debris).
        """
        base = self._path(step_dir_name(step)) if step is not None else self.root
        found = self._ofs.find(base, must_exist=step is None)
        held: dict[int, _Held] = {}
        aside: list[str] = []
        prefix = self.root.rstrip("/") + "/"
        for path, (size, mtime) in found.items():
            if not path.startswith(prefix):
                continue
            head, _, rest = path[len(prefix):].partition("/")
            number = parse_step(head)
            if number is not None and (step is None or number == step):
                entry = held.setdefault(number, _Held())
                token, _, rel = rest.partition("/")
                if rest == MARKER:
                    entry.marker = b""  # read below
                elif rel and TOKEN_RE.fullmatch(token):
                    entry.tokens.setdefault(token, {})[rel] = (size, mtime)
            elif rest == MARKER and (parsed := parse_set_aside(head)) and (step is None or parsed[1] == step):
                aside.append(path)
        markers = [self._path(step_dir_name(n), MARKER) for n, h in held.items() if h.marker is not None]
        read = self._ofs.cat(markers + aside)
        for number, entry in held.items():
            if entry.marker is not None:
                entry.marker = read.get(self._path(step_dir_name(number), MARKER))
        for n, path in enumerate(aside, start=1):
            held[-n] = _Held(marker=read.get(path))
        return held

    def _judge(self, held: dict[int, _Held], sizes: bool = True) -> list[RemoteCheckpoint]:
        named = {n: _named_token(h.marker) for n, h in held.items() if n >= 0 and h.marker is not None}
        manifests = self._ofs.cat([self._path(step_dir_name(n), t, MANIFEST) for n, t in named.items() if t])
        out = []
        for number, entry in sorted(held.items()):
            if number < 0:
                continue
            token = named.get(number)
            data = manifests.get(self._path(step_dir_name(number), token, MANIFEST)) if token else None
            out.append(self._checkpoint(number, entry, token, data, sizes))
        return out

    def _checkpoint(
        self, step: int, held: _Held, token: str | None, manifest_bytes: bytes | None, sizes: bool = True
    ) -> RemoteCheckpoint:
        url = self._url(step_dir_name(step))
        if held.marker is None:
            remnants = held.tokens.values()
            deleted = bool(remnants) and all(SUPERSEDED_MARK in objects for objects in remnants)
            state = CheckpointState.DELETED if deleted else CheckpointState.WRITING
            size = sum(size for objects in remnants for size, _ in objects.values())
            return RemoteCheckpoint(step, url, state, None, None, None, None, size)
        marker = _json_object(held.marker)
        manifest = _json_object(manifest_bytes) if manifest_bytes is not None else None
        problems = list(marker_problems(step, marker, manifest_bytes, manifest))
        if not problems and token is None:
            problems.append(f"{MARKER} names no valid token")
        if not problems and marker.get("step") not in (None, step):
            problems.append(f"{MARKER} says step {marker.get('step')!r}, the directory says {step}")
        if not problems and sizes:
            problems = _object_problems(manifest["files"], held.tokens.get(token, {}))
        size = sum(f["size"] for f in (manifest or {}).get("files", {}).values()
                   if isinstance(f, dict) and type(f.get("size")) is int)
        sha = marker.get("manifest_sha256") if marker else None
        if problems:
            return RemoteCheckpoint(step, url, CheckpointState.CORRUPT, token, manifest, sha, None, size,
                                    tuple(problems), held.marker, manifest_bytes)
        superseded = SUPERSEDED_MARK in held.tokens.get(token, {})
        state = CheckpointState.SUPERSEDED if superseded else CheckpointState.COMMITTED
        return RemoteCheckpoint(step, url, state, token, manifest, sha, parse_time(marker.get("committed_at")),
                                size, (), held.marker, manifest_bytes)

    def _debris(self) -> list[tuple[str, str, dict[str, tuple[int, float | None]]]]:
        held = self._scan()
        named = {_named_token(h.marker) for h in held.values() if h.marker is not None}
        return [(step_dir_name(n), token, objects) for n, h in sorted(held.items()) if n >= 0
                for token, objects in sorted(h.tokens.items()) if token not in named]

    # -- commit ------------------------------------------------------------------------------

    def _stage_checked(self, local: CheckpointInfo) -> tuple[Path, bytes, dict]:
        """(directory, manifest bytes, manifest) of a local checkpoint that is committed now; CheckpointError if not."""
        path = Path(local.path)
        current = CheckpointStore(path.parent).get(local.step)
        if current is None or not current.state.readable or Path(current.path) != path:
            state = current.state.value if current is not None else "gone"
            raise CheckpointError(f"cannot upload {path} to {self.url}: it is {state}, not a committed checkpoint")
        try:
            manifest_bytes = (path / MANIFEST).read_bytes()
        except OSError as exc:
            raise CheckpointError(f"cannot upload {path} to {self.url}: {exc.strerror or exc}") from None
        manifest = json.loads(manifest_bytes)
        if manifest != current.manifest:
            raise CheckpointError(f"cannot upload {path} to {self.url}: its manifest changed while it was read")
        for rel, entry in manifest["files"].items():
            try:
                size = os.stat(path / clean_relpath(rel)).st_size
            except OSError:
                size = None
            if size != entry.get("size"):
                found = "missing" if size is None else f"{size} bytes"
                raise CheckpointError(f"cannot upload {path} to {self.url}: {rel} is {found}, "
                                      f"the manifest says {entry.get('size')}")
        return path, manifest_bytes, manifest

    def _settle(self, holder: RemoteCheckpoint, manifest_bytes: bytes, mine: PendingUpload | None) -> RemoteCheckpoint:
        """The outcome for a writer that found `holder` committed: the same checkpoint, or lost."""
        if holder.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest():
            if mine is not None:
                mine.abort()  # an exact copy of what is committed: nothing worth keeping
            return holder
        raise UploadLost(
            f"{holder.url} was committed by another writer (token {holder.token}) with other content; "
            f"this copy was not committed" + (f" (left as debris under {mine.url})" if mine is not None else ""),
            holder,
        )


class PendingUpload:
    """A checkpoint's payload and manifest under a token of their own; nothing reads them until `commit()`."""

    def __init__(self, store: RemoteCheckpointStore, step: int, token: str, manifest_bytes: bytes, manifest: dict):
        self.store, self.step, self.token = store, step, token
        self.manifest_bytes, self.manifest = manifest_bytes, manifest
        self.name = step_dir_name(step)
        self.url = store._url(self.name, token)

    def commit(self) -> RemoteCheckpoint:
        """Put the marker if the step has none; the committed checkpoint, whoever wrote it (see `_settle`).

        A corrupt marker in the way is set aside first, as a local commit does with a corrupt
        directory. An error while putting the marker is checked against the store before it is
        raised: a put that landed but whose answer was lost is a commit.
        """
        store = self.store
        body = json.dumps({
            "step": self.step, "token": self.token,
            "manifest_sha256": hashlib.sha256(self.manifest_bytes).hexdigest(),
            "committed_at": datetime.now(timezone.utc).isoformat(),
            "size_bytes": sum(f["size"] for f in self.manifest["files"].values()),
            "files": len(self.manifest["files"]), "host": socket.gethostname(), "pid": os.getpid(),
        }, sort_keys=True).encode() + b"\n"
        for _ in range(5):
            failure, created, started = None, False, time.monotonic()
            try:
                with store._ofs.io("commit to"):
                    created = store._ofs.create(store._path(self.name, MARKER), body)
            except RemoteStoreError as exc:
                failure = exc
            crash_point("upload_after_marker")
            if created and not store._ofs.local:
                time.sleep(max(MARKER_SETTLE_S, 4 * (time.monotonic() - started)))
            holder = store.get(self.step)
            if holder is not None and holder.token == self.token:
                if holder.state.readable:
                    return holder
                raise RemoteCheckpointCorrupt(f"{holder.url} does not verify right after its commit: "
                                              f"{one_line(holder.problems)}")
            if failure is not None:
                raise failure
            if holder is None or holder.marker is None:
                continue  # the holder was deleted or set aside meanwhile: try again
            if holder.state.readable:
                return store._settle(holder, self.manifest_bytes, self)
            store.set_aside(holder, one_line(holder.problems))
        raise CheckpointError(f"could not commit {self.url}: the step's marker kept changing")

    def abort(self) -> None:
        """Remove this token's objects (never anything a marker names: no marker names this token)."""
        with suppress(CheckpointError):
            held = self.store._scan(self.step).get(self.step)
            if held is None or _named_token(held.marker) != self.token:
                with self.store._ofs.io("clean up in"):
                    self.store._remove_token(self.name, self.token)

    def _check_sizes(self) -> None:
        """Every object is up with its size (a truncated upload would fail every reader's check later)."""
        held = self.store._scan(self.step).get(self.step, _Held())
        problems = _object_problems(self.manifest["files"], held.tokens.get(self.token, {}))
        if problems:
            raise RemoteStoreError(f"upload to {self.url} is incomplete: {one_line(problems)}")


def _local_problems(path: Path, files: dict[str, dict]) -> list[str]:
    """Each local file hashed against the manifest (run beside the upload: the disk and the network overlap)."""
    problems = []
    for rel, entry in sorted(files.items()):
        size, sha = hash_file(path / rel)
        if (size, sha) != (entry.get("size"), entry.get("sha256")):
            problems.append(f"{rel}: sha256 {sha[:12]}… but manifest says {str(entry.get('sha256'))[:12]}…")
    return problems


def _object_problems(files: dict, objects: dict[str, tuple[int, float | None]]) -> list[str]:
    problems = []
    for rel, entry in sorted(files.items()):
        try:
            clean_relpath(rel)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        expected = entry.get("size") if isinstance(entry, dict) else None
        if rel not in objects:
            problems.append(f"{rel}: missing")
        elif objects[rel][0] != expected:
            problems.append(f"{rel}: {objects[rel][0]} bytes, manifest says {expected}")
    return problems


def _digest_problems(files: list[tuple[str, dict]], digests: list[tuple[int, str] | None]) -> list[str]:
    problems = []
    for (rel, entry), digest in zip(files, digests):
        if digest is None:
            problems.append(f"{rel}: missing")
        elif digest[0] != entry.get("size"):
            problems.append(f"{rel}: {digest[0]} bytes, manifest says {entry.get('size')}")
        elif digest[1] != entry.get("sha256"):
            problems.append(f"{rel}: sha256 {digest[1][:12]}… but manifest says {str(entry.get('sha256'))[:12]}…")
    return problems


def _named_token(marker: bytes | None) -> str | None:
    token = (_json_object(marker) or {}).get("token") if marker else None
    return token if isinstance(token, str) and TOKEN_RE.fullmatch(token) else None


def _json_object(data: bytes | None) -> dict | None:
    with suppress(ValueError, UnicodeDecodeError, TypeError):
        value = json.loads(data)
        return value if isinstance(value, dict) else None
    return None


def _youngest(token: str, objects: dict[str, tuple[int, float | None]]) -> float:
    stamp = STAMP_RE.search(token)
    evidence = [t for _, t in objects.values() if t is not None]
    if stamp and (moment := parse_time(stamp.group(0))) is not None:
        evidence.append(moment.timestamp())
    return max(evidence, default=time.time())  # nothing to date it by: young


def _state_of(ckpt: RemoteCheckpoint | None) -> str:
    return "gone" if ckpt is None else ckpt.state.value


def _nothing() -> None:
    return None


