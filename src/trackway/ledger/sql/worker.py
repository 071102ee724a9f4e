"""`POST /api/sql` on a SQLite ledger: each query runs in a child process that is killed at its deadline.

One call of a SQLite built-in (`instr`, `replace`, `trim` over megabytes) is a single step of its
virtual machine: neither the progress handler nor `interrupt()` stops it, and it holds a thread of
the server for as long as it runs. So the server hands the query to a worker, a child process
(`python -m trackway.ledger.sql.worker FD`) that answers over a socket, and stops waiting at
`timeout_s` + `MARGIN_S`: the worker is killed, which costs nothing (a query only reads, in a
transaction never committed), and a fresh one replaces it. Workers are reused across requests;
at most `size` run at once, and a request waits at most its own timeout for one to be free.

The worker is started with fork + exec (subprocess), never a bare fork of the threaded server.
It ends when the server does: its socket reads end-of-file.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from trackway.errors import LedgerError, TrackwayError
from trackway.ledger.sql.readonly import QueryResult, too_slow

__all__ = ["SqlWorkers"]

log = logging.getLogger("trackway.server")

MARGIN_S = 0.5  # past timeout_s, how long the worker's own limit has to answer before it is killed
STARTUP_S = 60.0  # a fresh worker imports sqlglot and trackway: slow on a loaded machine, never a query's time


class _Worker:
    """One child process and the parent's end of its socket."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trackway.ledger.sql.worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.ready = False

    def ask(self, request: tuple, timeout_s: float) -> tuple:
        """The worker's answer; TimeoutError when it has none within timeout_s + MARGIN_S."""
        if not self.ready:  # its start-up is not the query's time
            if not self.conn.poll(STARTUP_S) or self.conn.recv() != "ready":
                raise EOFError("the SQL worker did not start")
            self.ready = True
        self.conn.send(request)
        if not self.conn.poll(timeout_s + MARGIN_S):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class SqlWorkers:
    """Up to `size` worker processes, started when first needed and reused; `run` is the one entry point."""

    def __init__(self, size: int = 2) -> None:
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def run(self, db_url: str, query: str, timeout_s: float, max_rows: int) -> QueryResult:
        """`run_readonly_query(db_url, …)` in a worker: its answer or its error, within timeout_s + MARGIN_S."""
        if not self._slots.acquire(timeout=timeout_s):
            raise LedgerError(f"trackway sql: every SQL worker stayed busy for {timeout_s:g}s; try again shortly")
        try:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _Worker()
            try:
                kind, answer = worker.ask((db_url, query, timeout_s, max_rows), timeout_s)
            except TimeoutError:
                self._replace(worker)
                raise too_slow(timeout_s) from None
            except (EOFError, OSError) as exc:
                self._replace(worker)
                raise LedgerError(f"trackway sql: the SQL worker failed: {exc or type(exc).__name__}") from None
            with self._lock:
                self._idle.append(worker)
        finally:
            self._slots.release()
        if kind == "error":
            raise answer
        if kind == "bug":
            raise RuntimeError(f"the SQL worker failed:\n{answer}")
        return answer

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        try:
            fresh = _Worker()  # started now: it imports while no one waits for it
        except OSError as exc:
            log.warning("could not start a SQL worker: %s", exc)
            return
        with self._lock:
            self._idle.append(fresh)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


def _serve(conn: Connection) -> None:
    from trackway.ledger.sql import dialect  # noqa: F401  imported before "ready": no request waits for it
    from trackway.ledger.sql.readonly import run_readonly_query

    conn.send("ready")
    while True:
        try:
            db_url, query, timeout_s, max_rows = conn.recv()
        except EOFError:  # the server is gone
            return
        try:
            answer = ("ok", run_readonly_query(db_url, query, timeout_s, max_rows=max_rows))
        except TrackwayError as exc:
            answer = ("error", exc)
        except Exception:  # a bug: the server logs it and answers 500
            answer = ("bug", traceback.format_exc())
        conn.send(answer)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the server's terminal is the server's to handle
    _serve(Connection(int(sys.argv[1])))
