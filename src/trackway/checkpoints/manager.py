"""`run.checkpoints`: when to save, saving (async by default, one shard per rank), resuming, listing.

Lineage: each checkpoint's parent is, by name, the checkpoint this attempt resumed from or the
previous one it committed, so `trackway checkpoints RUN` can draw the chain across attempts.

Resuming: `restore_latest()` (or, for framework-neutral scripts, the first `latest()` before any
save) picks the newest committed checkpoint that verifies and loads. What is skipped on the way
is set aside, never deleted: a checkpoint that fails verification as `step-N.corrupt-<time>`,
one whose content the safe loader refuses (a pickle that would run code) as `step-N.refused-<time>`.
`on_restore` then hears what was really restored and what was set aside, and why:

    {"name": "step-00000020" | None, "step": 20 | None,
     "source": "/.../checkpoints/step-00000020" | "s3://bucket/run/step-00000020" | None,
     "fallback_from": [{"name": "step-00000030", "reason": "...",
                        "set_aside_as": "step-00000030.corrupt-...", "path": "/.../step-00000030.corrupt-..."}]}

(the SDK writes it as the `checkpoint_restored` event: the receipt's resumed-from comes from it).

With `remote_url` (an fsspec URL, see object_store.py) the local root is a write-through cache:

    save ─► local commit ─► on_commit ─► upload queued ─► (uploader thread) marker up ─► on_upload
    restore_latest ─► the store's newest committed checkpoint, when newer than the cache's newest
                      (or the cache is empty: a new host), downloaded and hashed into the cache ─►
                      loaded from the cache as always

A remote checkpoint that fails verification is set aside there (`step-N.corrupt-<time>/COMMITTED`)
and the one before it tried; `source` and each fallback's `path` say where it was read. `save()`
never waits for an upload; `wait()` and `close()` do, until nothing has moved for `upload_stall_s`.

Payload format: "torch" (state.pt, the default) or "safetensors" (state.safetensors: no pickle,
and split in parts hashed on several cores), chosen per manager (`format=`) or per `save(format=)`;
restoring reads whichever a checkpoint holds (see formats.py).

Multi-process (torch.distributed initialized, world size > 1), one save:

    rank 0                                   rank r > 0
    broadcast temp-dir token ───────────────► begin(step, token)   (one shared temp dir)
    write state.pt                            write rank-0000r.pt   (.safetensors alike)
    gather digests ◄───────────────────────── [(name, size, sha256, blake3), ...] or the error
    add_digest each, commit (or abort all)
    broadcast outcome ──────────────────────► raise if it failed
    (every rank returns only once the commit is durable)

These collectives run on gloo groups of their own: one for the writer thread, one for the
training thread (restore, `due` by minutes, `writing`), so they never interleave with the
training's own collectives or with each other.

Collective calls (every rank makes them, in the same order): `save()`, `writing()`,
`restore_latest()`, `latest()`, `due()` when `every_minutes` is set, and `any_rank()`. Each
starts with a meeting limited to $TRACKWAY_COLLECTIVE_TIMEOUT_S (60 s): one that some rank does
not make in time (saving on rank 0 only) raises CollectiveCallError naming the call and the
ranks, rather than hanging (ranks.py). Only that meeting is time-limited.

torch is imported only when a torch feature is used: scripts that do not use torch can
checkpoint with `writing()` without it.
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trackway.checkpoints.formats import DEFAULT_FORMAT, check_format, find_state_file, hashed_on_load, state_file
from trackway.checkpoints.layout import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointInfo,
    CheckpointRefused,
    CheckpointState,
    one_line,
)
from trackway.checkpoints.ranks import CollectiveCallError, Ranks
from trackway.checkpoints.recover import SetAside
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.write import CheckpointDiskFull, PendingCheckpoint, disk_full_named
from trackway.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trackway.checkpoints.async_save import AsyncSaver
    from trackway.checkpoints.object_store import RemoteCheckpoint, RemoteCheckpointStore
    from trackway.checkpoints.retention import RetentionPlan, RetentionPolicy
    from trackway.checkpoints.torch_state import Restored, Snapshot
    from trackway.checkpoints.uploader import Uploader

STATE_FILE = "state.pt"
__all__ = ["CheckpointManager", "CollectiveCallError", "shard_name"]
def shard_name(rank: int, format: str = DEFAULT_FORMAT) -> str:  # noqa: A002 - the user-facing word
    """The file one rank's state lives in: rank 0 writes `state.pt`, rank r `rank-0000r.pt` (`.safetensors` alike)."""
    return state_file(rank, format)


class CheckpointManager:
    """Saves, lists and restores one run's checkpoints under `root` (and `remote_url`, when given).

    `format`: "torch" or "safetensors" payloads. `storage_options` go to fsspec for `remote_url`
    (default: the environment's credentials and endpoint). `on_upload(remote, seconds)` hears each
    checkpoint whose marker is up in the remote store, on the uploader's thread. `before_save()`
    runs first in every `save()` and `writing()`: what it raises stops the save before anything is
    written (the SDK raises NonFiniteLoss there, so a state past a diverged loss never commits).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        run_id: str | None = None,
        attempt_id: str | None = None,
        resume_from: str | None = None,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        async_save: bool = True,
        format: str = DEFAULT_FORMAT,  # noqa: A002 - the user-facing word
        on_commit: Callable[[CheckpointInfo], None] | None = None,
        on_restore: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        remote_url: str | None = None,
        storage_options: dict[str, Any] | None = None,
        on_upload: Callable[[RemoteCheckpoint, float], None] | None = None,
        upload_stall_s: float = 60.0,
        on_round_trip: Callable[[dict[str, Any]], None] | None = None,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
            raise InputError(f"every_steps must be a positive integer, got {every_steps!r}")
        if every_minutes is not None and not every_minutes > 0:
            raise InputError(f"every_minutes must be a positive number, got {every_minutes!r}")
        if not upload_stall_s > 0:
            raise InputError(f"upload_stall_s must be a positive number of seconds, got {upload_stall_s!r}")
        self.store = CheckpointStore(root)
        self.remote: RemoteCheckpointStore | None = None
        if remote_url:
            from trackway.checkpoints.object_store import RemoteCheckpointStore

            self.remote = RemoteCheckpointStore(remote_url, storage_options)
        self.run_id = run_id
        self.attempt_id = attempt_id
        self.resume_from = resume_from
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self.async_save = async_save
        self.format = check_format(format)
        self.on_commit = on_commit
        self.on_restore = on_restore
        self.on_upload = on_upload
        self.upload_stall_s = upload_stall_s
        self._clock = clock
        self._resume_reported = False
        self._parent = resume_from
        self._last_step: int | None = None
        self._last_save_at = clock()
        self._saver: AsyncSaver | None = None
        self._uploader: Uploader | None = None
        self._sources: dict[str, str] = {}  # checkpoint name → the URL it was downloaded from
        self._ranks: Ranks | None | bool = False
        # Read the next save back from storage and compare it with what was given (checkpoints/round_trip.py).
        self.on_round_trip = on_round_trip
        self.before_save = before_save

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def parent(self) -> str | None:
        """The name the next checkpoint will record as its parent."""
        return self._parent

    def due(self, step: int) -> bool:
        """Whether `step` should be saved: a multiple of every_steps, or every_minutes since the last save.

        With several ranks and every_minutes, every rank must call it: rank 0's clock decides for all.
        """
        if step == self._last_step:
            return False
        if self.every_steps is not None and step > 0 and step % self.every_steps == 0:
            return True
        if self.every_minutes is None:
            return False
        elapsed = self._clock() - self._last_save_at >= self.every_minutes * 60
        ranks = self._distributed()
        if ranks is None:
            return elapsed
        # Clocks differ between ranks; a save that only some ranks start would hang the others.
        ranks.enter(f"due({step})")
        return ranks.agree(elapsed)

    def any_rank(self, flag: bool) -> bool:
        """`flag` agreed across ranks: true on every rank when it is true on any (alone: `flag`).

        For a preemption notice under DDP (`run.checkpoints.any_rank(run.should_stop)`): the
        launcher forwards the signal to every rank, but each reads it at its own step, and a save
        that only some ranks start is a hang. Collective: every rank calls it at the same point.
        """
        ranks = self._distributed()
        if ranks is None:
            return bool(flag)
        ranks.enter("any_rank()")
        return ranks.any(bool(flag))

    def save(
        self,
        step: int,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        data_state: Any = None,
        extra: Any = None,
        metrics: dict | None = None,
        blocking: bool | None = None,
        format: str | None = None,  # noqa: A002 - the user-facing word
    ) -> None:
        """Checkpoint the state at `step`; returns once it is copied to host memory (unless blocking).

        `format` overrides the manager's payload format for this save ("torch", "safetensors").
        Saving the step this manager saved last does nothing. A failure of the previous
        background save is raised here, as CheckpointError.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InputError(f"checkpoint step must be a non-negative integer, got {step!r}")
        format = check_format(self.format if format is None else format)  # noqa: A001
        if self.before_save is not None:
            self.before_save()
        saver = self._async_saver()
        if step == self._last_step:
            self._wait_saves()
            return
        ranks = self._distributed()
        if ranks is None:
            persist = self._persist_single(step, metrics)
        else:
            ranks.enter(f"save({step})")
            persist = self._persist_sharded(step, metrics, ranks)
        self._wait_saves()
        self._last_step = step
        round_trip = self.on_round_trip is not None and ranks is None
        if round_trip:
            blocking = True  # compared before training moves the state on
        try:
            saver.save(
                persist,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                scaler=scaler,
                data_state=data_state,
                extra=extra,
                on_commit=self._after_commit if self.remote is not None else self.on_commit,
                blocking=not self.async_save if blocking is None else blocking,
                format=format,
            )
        except BaseException:
            self._last_step = None
            raise
        self._last_save_at = self._clock()
        if round_trip:
            self._read_back(step, format, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                            data_state=data_state)

    def _read_back(self, step: int, format: str, **given: Any) -> None:  # noqa: A002
        """Once: the checkpoint just committed at `step`, read back and compared (`on_round_trip` hears how)."""
        from trackway.checkpoints.formats import state_file
        from trackway.checkpoints.round_trip import read_back

        hear, self.on_round_trip = self.on_round_trip, None
        info = self.store.get(step)
        if info is None or not info.state.readable:
            said = {"name": None, "step": step, "ok": False, "compared": 0,
                    "problem": "the save returned but no committed checkpoint is there"}
        else:
            said = read_back(self.store, info, state_file(0, format), given)
        hear(said)

    @contextmanager
    def writing(self, step: int, metrics: dict | None = None) -> Iterator[Path]:
        """A directory to write any files into: committed on clean exit, discarded on an exception.

        With several ranks, all of them get the same directory and rank 0 commits what they wrote.
        Every rank enters the block only once every rank has made the call, so files a framework
        wrote elsewhere before it (on any rank) are complete when the block moves them in.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InputError(f"checkpoint step must be a non-negative integer, got {step!r}")
        if self.before_save is not None:
            self.before_save()
        self._wait_saves()
        ranks = self._distributed()
        if ranks is not None:
            ranks.enter(f"writing({step})")
        pending = self._begin(step, ranks.token() if ranks is not None else None)
        try:
            yield pending.path
        except BaseException as exc:
            if ranks is None:
                _abort(pending)
            else:
                try:
                    self._finish_shared(pending, ranks, f"rank {ranks.rank}: {type(exc).__name__}: {exc}", metrics)
                except CheckpointError:
                    pass  # the exception from the caller's block says more
            # The caller's own write met a full disk: raised as CheckpointDiskFull, naming the root.
            with disk_full_named(self.store.root, step):
                raise
        if ranks is None:
            try:
                info = pending.commit(metrics=metrics)
            except BaseException:
                _abort(pending)
                raise
        else:
            info = self._finish_shared(pending, ranks, None, metrics)
        self._last_step = step
        self._last_save_at = self._clock()
        if info is not None:
            self._committed(info)
            if self.on_round_trip is not None and ranks is None:
                self._read_back_files(info)

    def _read_back_files(self, info: CheckpointInfo) -> None:
        """Once, for files trackway did not write itself: every byte read back and checked against the manifest."""
        hear, self.on_round_trip = self.on_round_trip, None
        problems = self.store.verify(info)
        files = len((info.manifest or {}).get("files") or {})
        hear({"name": info.name, "step": info.step, "ok": not problems, "compared": files,
              "problem": "; ".join(problems[:3]) or None})

    def restore_latest(
        self,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        restore_rng: bool = True,
    ) -> Restored | None:
        """Load the newest committed checkpoint whose files verify and whose content loads; None on a fresh start.

        Waits for any save in flight first. Each rank reads its own shard. A checkpoint that fails
        verification or whose content is refused is set aside and the previous one tried; what
        was restored and what was set aside goes to `on_restore` (see the module docstring).
        With a remote store, its newest committed checkpoint is downloaded first when the cache
        has nothing as new; a store that cannot be read raises RemoteStoreError.
        """
        self._wait_saves()
        ranks = self._distributed()
        if ranks is not None:
            ranks.enter("restore_latest()")
        objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        skipped: list[SetAside] = []
        fetch = self._fetch()
        restored = None
        # One process: its state file is hashed as it is read, not before (the loader sets aside what fails).
        deferred = _hashed_on_load if ranks is None else None
        while (info := self._pick(ranks, skipped, fetch, deferred)) is not None:
            restored = self._load(info, ranks, skipped, objects, restore_rng, fetch)
            if restored is not None:
                break
        self._resumed(info, skipped)
        if info is None:
            if self.resume_from is not None:
                aside = f" (set aside: {', '.join(s.name for s in skipped)})" if skipped else ""
                where = f"{self.store.root}" + (f" or {self.remote.url}" if self.remote is not None else "")
                raise CheckpointError(
                    f"asked to resume from {self.resume_from}, but no committed checkpoint under "
                    f"{where} verifies{aside}; refusing to start from scratch silently"
                )
            return None
        self._last_step = info.step
        self._last_save_at = self._clock()
        return restored

    def latest(self) -> CheckpointInfo | None:
        """The resume target: the newest committed checkpoint whose files verify (rank 0 decides).

        The first call before this manager saved or restored anything is taken as this attempt's
        resume (framework-neutral scripts read the files themselves): it is reported to
        `on_restore` and becomes the next checkpoint's parent.
        """
        skipped: list[SetAside] = []
        resuming = not self._resume_reported and self._last_step is None
        ranks = self._distributed()
        if ranks is not None:
            ranks.enter("latest()")
        info = self._pick(ranks, skipped, self._fetch() if resuming else None)
        if resuming:
            self._resumed(info, skipped)
        return info

    def _pick(
        self, ranks: Ranks | None, skipped: list[SetAside], fetch: _Fetch | None = None,
        deferred: Callable[[CheckpointInfo], set[str]] | None = None,
    ) -> CheckpointInfo | None:
        """The newest committed checkpoint that verifies; what rank 0 set aside on the way goes to `skipped`.

        With `fetch`, a newer one in the remote store is downloaded into the cache and chosen.
        `deferred(info)`: files checked for size only here, because the loader hashes them as it reads.
        """

        def choose() -> CheckpointInfo | None:
            while True:
                if fetch is not None and (fetched := fetch.newer(skipped)) is not None:
                    return fetched
                before = len(skipped)
                info, set_aside = self.store.pick_latest(deferred=deferred)
                stuck = info is not None and any(
                    s.kind == "refused" and s.set_aside_as is None and s.name == info.name for s in skipped
                )
                skipped.extend(set_aside)
                if stuck:  # refused, yet still in the resume path: loading on would loop (raised on every rank)
                    raise CheckpointError(
                        f"checkpoint {info.path} was refused by the loader and could not be set aside; "
                        f"move it out of {self.store.root} to resume from the one before it"
                    )
                # The cache's newest was corrupt: the store may hold a good copy of it, or of one after it.
                if fetch is not None and len(skipped) > before and fetch.holds_newer(info):
                    continue
                return info

        if ranks is None:
            return choose()
        step = ranks.from_rank0(lambda: _step_of(choose()))
        if step is None:
            return None
        info = self.store.get(step)
        if info is None:
            raise CheckpointError(f"rank {ranks.rank} cannot see checkpoint step {step} under {self.store.root}")
        return info

    def _load(
        self, info: CheckpointInfo, ranks: Ranks | None, skipped: list[SetAside], objects: dict, restore_rng: bool,
        fetch: _Fetch | None = None,
    ) -> Restored | None:
        """Load this rank's shard of `info` into `objects`; None when some rank's loader refused it (now set aside)."""
        from trackway.checkpoints.torch_state import restore, shard_file

        restored, refusal, failure = None, None, None
        try:
            filename = shard_file(info, ranks.rank if ranks is not None else 0)
            # Alone, the state file was left for the loader to hash as it reads (`_pick`); with several
            # ranks rank 0 hashed every file before they agreed on this checkpoint.
            restored = restore(info, **objects, restore_rng=restore_rng, filename=filename, verify=ranks is None)
        except CheckpointCorrupt as exc:
            if ranks is not None:
                raise
            # As `_pick` sets aside a checkpoint whose files fail: the previous one is tried next.
            skipped.append(self.store.set_aside(info, one_line(exc.problems), kind="corrupt"))
            return None
        except CheckpointRefused as exc:
            refusal = str(exc)
        except Exception as exc:
            if ranks is None:
                raise
            failure = exc  # the other ranks must hear of it, not wait for this one forever
        if ranks is not None:
            refusal = _agree_on_load(ranks, refusal, failure)
        if refusal is None:
            return restored
        if ranks is None or ranks.rank == 0:
            # The other ranks wait for rank 0's next pick, which comes after this.
            skipped.append(self.store.set_aside(info, refusal, kind="refused"))
            if fetch is not None and (remote := fetch.refused(info, refusal)) is not None:
                skipped.append(remote)  # the store's copy holds the same bytes: no other host may load it either
        return None

    def _resumed(self, info: CheckpointInfo | None, skipped: list[SetAside]) -> None:
        """Record what this attempt really resumed from: the next checkpoint's parent, and `on_restore` (rank 0)."""
        self._parent = info.name if info is not None else None
        self._resume_reported = True
        ranks = self._distributed()
        if self.on_restore is not None and (ranks is None or ranks.rank == 0):
            self.on_restore({
                "name": info.name if info is not None else None,
                "step": info.step if info is not None else None,
                "source": (self._sources.get(info.name) or str(info.path)) if info is not None else None,
                "fallback_from": [s.as_event() for s in skipped],
            })

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint under the root, by step."""
        return self.store.list()

    def wait(self) -> None:
        """Block until no save is in flight and the uploads are done; raise CheckpointError if the last save failed.

        Uploads are waited for until none has moved for `upload_stall_s` (then a warning on
        stderr says which checkpoints are local only); their failures are told there, not raised.
        """
        try:
            self._wait_saves()
        finally:
            if self._uploader is not None:
                self._uploader.wait()

    def close(self) -> None:
        """Wait for the save in flight, raising its failure, and for the uploads (as `wait()` does)."""
        saver, self._saver = self._saver, None
        try:
            if saver is not None:
                try:
                    saver.close()
                except Exception:
                    self._last_step = None
                    raise
        finally:
            uploader, self._uploader = self._uploader, None
            if uploader is not None:
                uploader.close()

    def prune(self, policy: RetentionPolicy, protected: Mapping[int, str] | None = None) -> dict[str, RetentionPlan]:
        """Apply retention to the cache and to the remote store, each by what it holds: {root or URL: plan}.

        Two passes per store, as `trackway gc` does: supersede what is not kept, then delete what
        is superseded and still not kept. `protected` steps are kept (say why); in the cache, so
        are checkpoints still waiting for their upload. Call it on one rank.
        """
        from trackway.checkpoints.retention import RetentionPlan, apply_retention, plan_retention

        keep = dict(protected or {})
        waiting = {info.step: "waiting for upload" for info in (self._uploader.pending if self._uploader else [])}
        plans: dict[str, RetentionPlan] = {}
        stores: list[tuple[str, Any, dict[int, str]]] = [(str(self.store.root), self.store, {**waiting, **keep})]
        if self.remote is not None:
            stores.append((self.remote.url, self.remote, keep))
        for where, store, pinned in stores:
            plan = plan_retention(store.list(), policy, pinned)
            apply_retention(store, RetentionPlan(keep=plan.keep, supersede=plan.supersede))
            again = plan_retention(store.list(), policy, pinned)
            apply_retention(store, RetentionPlan(keep=again.keep, delete=again.delete))
            plans[where] = RetentionPlan(keep=again.keep, supersede=plan.supersede, delete=again.delete)
        return plans

    def _wait_saves(self) -> None:
        """Block until no save is in flight (uploads go on); raise CheckpointError if the last one failed."""
        if self._saver is not None:
            try:
                self._saver.wait()
            except Exception:
                # The step it was saving is not saved: saving it again must not be skipped.
                self._last_step = None
                raise

    def _after_commit(self, info: CheckpointInfo) -> None:
        """on_commit, then the upload queued (so checkpoint_committed is told before checkpoint_uploaded)."""
        try:
            if self.on_commit is not None:
                self.on_commit(info)
        finally:
            self._uploads().submit(info)

    def _uploads(self) -> Uploader:
        if self._uploader is None:
            from trackway.checkpoints.uploader import Uploader

            self._uploader = Uploader(self.remote, on_upload=self.on_upload, stall_s=self.upload_stall_s)
        return self._uploader

    def _fetch(self) -> _Fetch | None:
        return _Fetch(self.remote, self.store, self._sources) if self.remote is not None else None

    def _async_saver(self) -> AsyncSaver:
        if self._saver is None:
            from trackway.checkpoints.async_save import AsyncSaver

            self._saver = AsyncSaver()
        return self._saver

    def _distributed(self) -> Ranks | None:
        if self._ranks is False:
            ranks = Ranks.detect()
            # Asked before init_process_group (Lightning's ranks connect inside fit(), after the script
            # picked its resume checkpoint): not an answer to keep, or later saves would run unshared.
            dist = sys.modules.get("torch.distributed")
            if ranks is not None or (dist is not None and dist.is_available() and dist.is_initialized()):
                self._ranks = ranks
            return ranks
        return self._ranks

    def _begin(self, step: int, token: str | None) -> PendingCheckpoint:
        return self.store.begin(
            step, run_id=self.run_id, attempt_id=self.attempt_id, parent=self._parent, token=token
        )

    def _committed(self, info: CheckpointInfo) -> None:
        self._parent = info.name
        if self.remote is not None:
            self._after_commit(info)
        elif self.on_commit is not None:
            self.on_commit(info)

    def _persist_single(self, step: int, metrics: dict | None) -> Callable[[Snapshot], CheckpointInfo]:
        from trackway.checkpoints.async_save import commit_to

        commit = commit_to(lambda: self._begin(step, None), metrics=metrics)

        def persist(snapshot: Snapshot) -> CheckpointInfo:
            info = commit(snapshot)
            # Runs on the writer thread before the next save may start, so lineage stays a chain.
            self._parent = info.name
            return info

        return persist

    def _persist_sharded(self, step: int, metrics: dict | None, ranks: Ranks) -> Callable[[Snapshot], Any]:
        def persist(snapshot: Snapshot) -> CheckpointInfo | None:
            token = ranks.token(writer=True)
            pending = None
            report: list[tuple[str, int, str, str | None]] | str
            own = None
            try:
                pending = self._begin(step, token)
                snapshot.write(pending, shard_name(ranks.rank, snapshot.format))
                # Every file this rank wrote: a safetensors state in parts is several.
                report = [(name, digest["size"], digest["sha256"], digest.get("blake3"))
                          for name, digest in pending.digests.items()]
            except Exception as exc:  # noqa: BLE001 - every rank must reach the gather, failed or not
                report = f"rank {ranks.rank}: {type(exc).__name__}: {exc}"
                own = exc
            info = _commit_gathered(pending, ranks, report, metrics, writer=True, own=own, root=self.store.root)
            if info is not None:
                self._parent = info.name
            return info

        return persist

    def _finish_shared(
        self, pending: PendingCheckpoint, ranks: Ranks, error: str | None, metrics: dict | None
    ) -> CheckpointInfo | None:
        report: list[tuple[str, int, str]] | str = error if error is not None else []
        return _commit_gathered(pending, ranks, report, metrics, writer=False, root=self.store.root)


class _Fetch:
    """One resume's use of the remote store: listed once, each step tried at most once, newest first."""

    def __init__(self, remote: RemoteCheckpointStore, cache: CheckpointStore, sources: dict[str, str]) -> None:
        self.remote = remote
        self.cache = cache
        self.sources = sources
        self._listed: list[RemoteCheckpoint] | None = None
        self._tried: dict[int, RemoteCheckpoint] = {}

    def newer(self, skipped: list[SetAside]) -> CheckpointInfo | None:
        """The newest remote checkpoint newer than anything the cache holds, downloaded and verified; else None.

        One that fails verification (the listing's check, or a hash while downloading) is set aside
        in the store and the next one tried. A store that cannot be read raises RemoteStoreError.
        """
        from trackway.checkpoints.object_store import RemoteCheckpointCorrupt

        floor = max((c.step for c in self.cache.list() if c.state.readable), default=-1)
        for ckpt in self._candidates():
            if ckpt.step <= floor:
                return None
            if ckpt.step in self._tried:
                continue
            self._tried[ckpt.step] = ckpt
            if ckpt.problems:
                skipped.append(self.remote.set_aside(ckpt, "; ".join(ckpt.problems)))
                continue
            try:
                info = self.remote.download(ckpt, into=self.cache)
            except RemoteCheckpointCorrupt as exc:
                skipped.append(self.remote.set_aside(ckpt, str(exc).removeprefix(f"{ckpt.url}: ")))
                continue
            self.sources[info.name] = ckpt.url
            return info
        return None

    def holds_newer(self, info: CheckpointInfo | None) -> bool:
        """Whether the store holds a checkpoint newer than `info` (None: any) not tried yet."""
        floor = info.step if info is not None else -1
        return any(c.step > floor and c.step not in self._tried for c in self._candidates())

    def refused(self, info: CheckpointInfo, reason: str) -> SetAside | None:
        """Set aside the store's copy of a checkpoint downloaded here whose content the loader refused."""
        ckpt = self._tried.get(info.step)
        if ckpt is None or self.sources.get(info.name) != ckpt.url:
            return None
        return self.remote.set_aside(ckpt, reason, kind="refused")

    def _candidates(self) -> list[RemoteCheckpoint]:
        if self._listed is None:
            listed = self.remote.list()
            self._listed = sorted((c for c in listed if c.state.readable or c.state is CheckpointState.CORRUPT),
                                  key=lambda c: c.step, reverse=True)
        return self._listed


def _commit_gathered(
    pending: PendingCheckpoint | None,
    ranks: Ranks,
    report: list[tuple[str, int, str]] | str,
    metrics: dict | None,
    *,
    writer: bool,
    root: Path,
    own: BaseException | None = None,
) -> CheckpointInfo | None:
    """Gather every rank's report to rank 0, which commits or aborts; all ranks learn the outcome.

    `own` is this rank's failure, if any: a full disk is raised as CheckpointDiskFull on every
    rank (the errno must survive the trip through the gathered text).
    """
    try:
        reports = ranks.gather(report, writer=writer)
    except BaseException:
        # A rank died or the group broke: nothing will commit this directory, so clear it.
        if ranks.rank == 0 and pending is not None:
            _abort(pending)
        raise
    info = None
    outcome = "ok"
    if ranks.rank == 0:
        errors = [r for r in reports if isinstance(r, str)]
        if pending is None and not errors:
            errors = ["rank 0: the checkpoint could not be started"]
        if errors:
            outcome = "; ".join(errors)
            if pending is not None:
                _abort(pending)
        else:
            try:
                for files in reports[1:]:
                    for filename, size, sha256, blake3 in files:
                        pending.add_digest(filename, size, sha256, blake3)
                info = pending.commit(metrics=metrics)
            except Exception as exc:  # noqa: BLE001 - the other ranks must hear about it
                outcome = f"rank 0 could not commit: {type(exc).__name__}: {exc}"
                own = exc
                _abort(pending)
    outcome = ranks.broadcast(outcome, writer=writer)
    if outcome != "ok":
        message = f"checkpoint step {pending.step if pending else '?'} was not committed: {outcome}"
        if isinstance(own, CheckpointDiskFull):
            raise own
        if "[Errno 28]" in outcome:
            raise CheckpointDiskFull(errno.ENOSPC, message, str(root))
        raise CheckpointError(message)
    return info


def _agree_on_load(ranks: Ranks, refusal: str | None, failure: BaseException | None) -> str | None:
    """Every rank's load outcome, agreed: the refusal to act on (None: all loaded); raises if any rank failed."""
    if failure is not None:
        mine = ("error", f"rank {ranks.rank}: {type(failure).__name__}: {failure}")
    elif refusal is not None:
        mine = ("refused", refusal)
    else:
        mine = ("ok", None)
    outcomes = ranks.gather(mine)  # rank 0 gets them all; the others, nothing
    errors = [text for kind, text in outcomes if kind == "error"]
    refusals = [text for kind, text in outcomes if kind == "refused"]
    verdict = ("error", "; ".join(errors)) if errors else ("refused", refusals[0]) if refusals else ("ok", None)
    kind, text = ranks.broadcast(verdict)  # rank 0's verdict
    if kind == "error":
        if failure is not None:
            raise failure
        raise CheckpointError(f"restoring the checkpoint failed on another rank: {text}")
    return text if kind == "refused" else None


def _hashed_on_load(info: CheckpointInfo) -> set[str]:
    return hashed_on_load(find_state_file((info.manifest or {}).get("files") or {}, 0))


def _step_of(info: CheckpointInfo | None) -> int | None:
    return None if info is None else info.step


def _abort(pending: PendingCheckpoint) -> None:
    try:
        pending.abort()
    except Exception:  # noqa: BLE001 - the original failure is the one worth raising
        pass
