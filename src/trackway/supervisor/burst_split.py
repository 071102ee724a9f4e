"""A burst of ends recorded by two processes: a child forked for it records every other run's ends.

Recording an end is nearly all Python in one thread: reading what the attempt left, classifying
it, redacting its evidence, its share of the ledger's statements. 10,000 ends at once kept one
core busy for about 1.7 s here, the last receipt waiting for all of it. Where a second core is
there, a burst of SPLIT_MIN_ENDS or more is split by run: a child forked at the burst records the
ends of every other run, the supervisor the rest, each oldest first and a batch per transaction,
as one process would. All of a run's ends stay in one process, so that its second end is still
decided after its first. The two meet at the ledger's write lock only, held for the statements
of a batch, not while its ends are read and classified.

Forked only where that is safe: this is the process's only thread (a lock another thread held
would be copied held), no ledger connection is in use (no transaction is copied half-way), and
the platform forks. The child takes connections of its own (`Ledger.use_own_connections`) and
leaves with os._exit, running no finalizer: a copied connection closed there would end the
parent's PostgreSQL session or let go of the child's own SQLite locks.

Its answer comes back pickled through a pipe: the ends it recorded, the findings it made, the
first error it met. A child that ends without one (killed, out of memory) loses no receipt: what
it committed is recorded, its retries decided in the same transactions, and what it did not
commit is still open in the ledger, for the next tick to record.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trackway.checkpoints.digests import usable_cores
from trackway.errors import LedgerError
from trackway.ledger import Ledger

# Below this many ends at once, one process records them about as soon as two would: a fork and the
# child's first touches of the pages it shares cost a few milliseconds, a thousand ends about 170 ms.
SPLIT_MIN_ENDS = 2000


@dataclass
class Answer:
    """What a part of a burst came to: the ends recorded, the first error met, the findings made."""

    ends: list[Any]
    failure: BaseException | None
    findings: list[tuple[str, str]] = field(default_factory=list)


def worth_splitting(count: int, ledger: Ledger) -> bool:
    """Whether `count` ends at once are recorded in two processes (see the module): enough of them, and safe."""
    return (count >= SPLIT_MIN_ENDS and hasattr(os, "fork") and usable_cores() > 1 and _only_thread()
            and ledger.forkable())


def by_run(ended: Sequence[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """The ends of every other run apart, runs taken in the order they first ended: (this process's, the child's).

    Each half keeps the order it was given (oldest first), and holds as many early ends as the other.
    """
    halves: tuple[list, list] = ([], [])
    side: dict[str, int] = {}
    for attempt, status in ended:
        halves[side.setdefault(attempt["run_id"], len(side) % 2)].append((attempt, status))
    return halves


class Helper:
    """A child forked now to run `work` and hand back its Answer; `answer()` waits for it."""

    def __init__(self, work: Callable[[], Answer], ledger: Ledger) -> None:
        answers, reply = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            # What this process buffered but had not written would be written twice, once by the child.
            if stream is not None:
                stream.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child
            os.close(answers)
            _serve(work, ledger, reply)
        os.close(reply)
        self._answers = answers
        self.ended_how = "not known"

    def answer(self) -> Answer | None:
        """The child's Answer once it exited; None if it ended without one (`ended_how` says how it ended)."""
        with os.fdopen(self._answers, "rb") as pipe:
            data = pipe.read()
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped by someone else: how it ended is not known
            pass
        else:
            self.ended_how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                              else f"exit status {os.WEXITSTATUS(status)}")
        try:
            return pickle.loads(data) if data else None
        except Exception:  # noqa: BLE001 - cut short (killed while it wrote): no answer, as if none came
            return None


def _serve(work: Callable[[], Answer], ledger: Ledger, reply: int) -> None:
    """The child: run `work`, write its Answer to `reply`, and leave without running a finalizer."""
    status = 1
    try:
        ledger.use_own_connections()
        answer = work()
        data = _pickled(answer)
        with os.fdopen(reply, "wb") as pipe:
            pipe.write(data)
        status = 0
    finally:
        os._exit(status)


def _pickled(answer: Answer) -> bytes:
    """`answer` pickled; an error that does not come back whole from a pickle is sent as its type's name and text.

    The child's traceback goes with it, as a note: the parent raises it as the tick's error.
    """
    failure = answer.failure
    if failure is not None:
        failure.add_note("in the child recording part of a burst of ends (pid %d):\n%s" % (
            os.getpid(), "".join(traceback.format_exception(failure)).rstrip()))
        try:
            pickle.loads(pickle.dumps(failure))
        except Exception:  # noqa: BLE001 - any error at all: what it says is kept below
            kind = LedgerError if isinstance(failure, LedgerError) else RuntimeError
            plain = kind(f"{type(failure).__name__}: {failure}")
            for note in getattr(failure, "__notes__", ()):
                plain.add_note(note)
            answer.failure = plain
    return pickle.dumps(answer)


def _only_thread() -> bool:
    return threading.active_count() == 1
