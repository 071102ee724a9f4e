"""Where this process stands in a torch.distributed job, and the collectives checkpointing needs.

Every collective checkpoint call starts with `Ranks.enter(call)`: a rendezvous on the job's own
key-value store (the one `init_process_group` made), limited to $TRACKWAY_COLLECTIVE_TIMEOUT_S. A
call some rank does not make in time raises CollectiveCallError naming the call and those ranks
(and what they called instead). The store, not a gloo `monitored_barrier`: making trackway's
groups is itself collective (a lone first call would hang there, unnamed), and `monitored_barrier`
names the missing ranks on rank 0 only. After the meeting, the data move on two gloo groups of
trackway's own (one for the writer thread, one for the training thread), whose waits are not
time-limited: a long write is not a missing rank.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from trackway.checkpoints.layout import CheckpointError, new_token

# How long a collective checkpoint call waits for every rank to make it ($TRACKWAY_COLLECTIVE_TIMEOUT_S):
# ranks reach a save seconds apart (a slower data loader, a rank-0 log line), never a minute apart
# unless one of them is not coming.
COLLECTIVE_TIMEOUT_S = 60.0


class CollectiveCallError(CheckpointError):
    """A collective checkpoint call that not every rank made in time: the message names the call and the ranks."""


class Ranks:
    """This process's place in a torch.distributed job, and the collectives checkpointing needs."""

    def __init__(self, dist: Any, rank: int, world_size: int, store: Any = None, timeout_s: float | None = None) -> None:
        self.dist = dist
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s if timeout_s is not None else _collective_timeout()
        self._store = store  # the job's own key-value store: None leaves calls unchecked (they then wait as torch does)
        self._calls = 0  # collective calls this rank made: the n-th call of every rank meets under one key
        self._writer_group: Any = None
        self._control_group: Any = None

    @classmethod
    def detect(cls) -> Ranks | None:
        if "torch" not in sys.modules:
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):
            store = None  # a torch without it: calls go unchecked rather than not at all
        return cls(dist, dist.get_rank(), dist.get_world_size(), store)

    def enter(self, call: str) -> None:
        """Return once every rank made this call; CollectiveCallError naming those that did not, after the timeout.

        The first call that passes makes trackway's two gloo groups, on every rank in the same order
        (making a group is itself collective: a lone rank would hang there, unnamed).
        """
        if self._store is not None:
            self._calls += 1
            key = f"trackway/collective/{self._calls}"
            self._store.set(f"{key}/rank{self.rank}", call)
            if self._store.add(f"{key}/{call}", 1) == self.world_size:
                self._store.set(f"{key}/{call}/all", "1")
            else:
                try:
                    self._store.wait([f"{key}/{call}/all"], timedelta(seconds=self.timeout_s))
                except self.dist.DistStoreError as exc:
                    if "timeout" not in str(exc).lower():
                        raise
                    raise CollectiveCallError(self._who_is_missing(key, call)) from None
            if self.rank == 0 and self._calls > 2:
                self._forget(f"trackway/collective/{self._calls - 2}")
        if self._control_group is None:
            self._writer_group = self.dist.new_group(backend="gloo")
            self._control_group = self.dist.new_group(backend="gloo")
            # Left to the interpreter's teardown, a gloo group's threads can be destroyed still running: the
            # process then aborts (SIGABRT, "terminate called without an active exception") after a script that
            # never called destroy_process_group() ended well, and its end would read as a crash.
            atexit.register(self._destroy_groups)

    def _destroy_groups(self) -> None:
        """trackway's own groups ended before the interpreter's teardown (local to this process on gloo)."""
        for group in (self._writer_group, self._control_group):
            if group is None:
                continue
            try:
                self.dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - the job's own group is already gone, or the exit is a crash's
                pass
        self._writer_group = self._control_group = None

    def _who_is_missing(self, key: str, call: str) -> str:
        missing, elsewhere = [], []
        for rank in range(self.world_size):
            name = f"{key}/rank{rank}"
            if rank == self.rank or not self._store.check([name]):
                if rank != self.rank:
                    missing.append(rank)
                continue
            other = self._store.get(name).decode()
            if other != call:
                missing.append(rank)
                elsewhere.append(f"rank {rank} called {other} instead")
        ranks = ", ".join(str(r) for r in missing)
        instead = f" ({'; '.join(elsewhere)})" if elsewhere else ""
        return (
            f"rank {self.rank} called the collective checkpoint call {call}, and rank{'s' if len(missing) > 1 else ''} "
            f"{ranks} of {self.world_size} did not join within {self.timeout_s:g} s{instead}: every rank must make "
            "the same checkpoint calls in the same order (save, writing, restore_latest, latest, any_rank, due "
            "with every_minutes), not rank 0 alone ($TRACKWAY_COLLECTIVE_TIMEOUT_S sets the wait)"
        )

    def _forget(self, key: str) -> None:
        """Drop a call's keys once every rank is past it (rank 0 entered two calls later: all met at the one between)."""
        try:
            names = [f"{key}/rank{r}" for r in range(self.world_size)]
            for name in names:
                if self._store.check([name]):
                    call = self._store.get(name).decode()
                    self._store.delete_key(f"{key}/{call}")
                    self._store.delete_key(f"{key}/{call}/all")
                self._store.delete_key(name)
        except (RuntimeError, NotImplementedError):
            pass  # a store that cannot delete keeps a few bytes per call

    def _group(self, writer: bool) -> Any:
        return self._writer_group if writer else self._control_group

    def any(self, flag: bool) -> bool:
        import torch

        box = torch.tensor([1 if flag else 0], dtype=torch.int32)
        self.dist.all_reduce(box, op=self.dist.ReduceOp.MAX, group=self._control_group)
        return bool(box.item())

    def broadcast(self, value: Any, *, writer: bool = False) -> Any:
        box = [value if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0, group=self._group(writer))
        return box[0]

    def gather(self, value: Any, *, writer: bool = False) -> list[Any]:
        out: list[Any] = [None] * self.world_size if self.rank == 0 else None
        self.dist.gather_object(value, out, dst=0, group=self._group(writer))
        return out or []

    def token(self, *, writer: bool = False) -> str:
        return self.broadcast(new_token() if self.rank == 0 else None, writer=writer)

    def from_rank0(self, compute: Callable[[], Any]) -> Any:
        value = None
        if self.rank == 0:
            try:
                value = ("ok", compute())
            except Exception as exc:  # noqa: BLE001 - the other ranks must not wait forever
                value = ("error", f"{type(exc).__name__}: {exc}")
        status, payload = self.broadcast(value)
        if status != "ok":
            raise CheckpointError(f"rank 0 failed while choosing the checkpoint: {payload}")
        return payload

    def agree(self, flag: bool) -> bool:
        return bool(self.broadcast(flag))


def _collective_timeout() -> float:
    text = os.environ.get("TRACKWAY_COLLECTIVE_TIMEOUT_S", "")
    try:
        value = float(text) if text else COLLECTIVE_TIMEOUT_S
    except ValueError:
        value = 0.0
    if not value > 0:
        print(f"trackway: TRACKWAY_COLLECTIVE_TIMEOUT_S={text!r} is not a positive number of seconds; "
              f"using {COLLECTIVE_TIMEOUT_S:g}", file=sys.stderr, flush=True)
        return COLLECTIVE_TIMEOUT_S
    return value
