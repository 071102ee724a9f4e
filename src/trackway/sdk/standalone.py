"""A script run without a supervisor: it records its own run and attempt, and ingests its own spool.

Ids are made locally, the receipt goes to a pending registration file and everything logged to
the spool, so a ledger that is down costs nothing. The ledger is written by a process of its own,
the ingester (sdk/ingester.py, in its own process group), which `init()` starts: the training
process never imports the ledger's code and never shares its GIL with an ingest. It registers the
run and ingests the spool every INGEST_INTERVAL_S while the ledger answers; the script's end is
recorded when `finish()` (or the exit) says how it ended.

Only the ingests made while the script trains are niced (NICE, on a thread of their own: Linux keeps
a niceness per thread), so that training comes first on a machine short of cores, and they take a
backlog in slices (SLICE_BYTES of each file a transaction), so that `finish()` waits for one slice
at most. The start-up (imports, opening the ledger, registering the run) and everything from
`finish()` on run at the script's own priority: a script in `finish()` trains no more and waits for
them, and a short script's `finish()` would otherwise wait behind every other process of a loaded
machine. `finish()` says so before it flushes what the script logged last, so that the ingest of a
large last flush runs beside the flush rather than after it.

    training process                               ingester
      init: receipt -> pending file, spool
            start the ingester  ── {"start": ...} ──►  register; ingest every INGEST_INTERVAL_S (niced)
      log, log, ...                                     (reads what the spool writer flushed)
      finish()  ──────────── {"finishing": true} ────►  ingest as the spool grows, at the script's priority
        flush the spool
      finish() / exit  ───────── {"end": code} ──────►  ingest the rest, record the end
                       ◄──────── {"ended": bool} ─────  close the ledger, exit

`finish()` waits for that answer: up to $TRACKWAY_LEDGER_PATIENCE_S (10 s) for a ledger that is
away, then it says so and leaves the rest to the next `trackway` command that reaches the ledger
(it registers the run, ingests the spool and classifies the end from the script's own note). A
script killed without a word (SIGKILL) leaves the ingester without its parent: it ingests what
was flushed and exits, leaving the end to the next `trackway` command in the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trackway.pending import write_pending
from trackway.sdk.ingester import FINAL_INGEST_PATIENCE_S, secret_values, tell
from trackway.taxonomy import AttemptState, RunKind, RunState

if TYPE_CHECKING:
    from trackway.settings import Settings

# How long past that patience finish() waits for the ingester's answer (a long final ingest) before
# the script exits anyway; the ingester finishes its work and records the end on its own.
ANSWER_GRACE_S = 60.0


class StandaloneSession:
    """The run and attempt a standalone script records, and the ingester process that keeps the ledger current."""

    def __init__(self, settings: Settings, context, pending: Path, ingester: subprocess.Popen | None = None):
        self.settings = settings
        self.context = context
        self._pending = pending
        self._ingester = ingester

    @classmethod
    def start(cls, config: dict | None, name: str | None, project: str, model_family: str | None) -> StandaloneSession:
        from trackway.settings import load_settings

        settings = load_settings()
        # First: its start-up (an interpreter, its imports) overlaps the imports and captures below, and a
        # short script's finish() waits for it to be ready.
        ingester = _start_ingester(settings.db_url)

        from trackway.executors.inline import inline_job_id
        from trackway.receipts.canonical import canonical_json
        from trackway.receipts.code import capture_code
        from trackway.receipts.environment import capture_environment
        from trackway.receipts.placement import host_name
        from trackway.sdk.context import AttemptContext

        run_id = "r" + secrets.token_hex(5)  # as trackway.ledger.records.new_run_id
        run_dir = settings.runs_dir / run_id
        state_dir = run_dir / "attempts" / "1"
        (state_dir / "spool").mkdir(parents=True, exist_ok=True)
        config_bytes = canonical_json(config) if config is not None else None
        if config_bytes is not None:
            # A config may carry a credential (an API key among the hyperparameters): owner only.
            fd = os.open(run_dir / "config.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(config_bytes)
        context = AttemptContext(
            run_id=run_id,
            attempt_id=f"{run_id}/1",
            attempt_number=1,
            spool_dir=state_dir / "spool",
            checkpoint_dir=run_dir / "checkpoints",
            config_path=run_dir / "config.json" if config_bytes is not None else None,
        )
        now = datetime.now(timezone.utc)
        code = capture_code(Path.cwd())
        run = dict(
            run_id=run_id, name=name, project=project, model_family=model_family, kind=RunKind.FULL.value,
            state=RunState.RUNNING.value, command=json.dumps(_recorded_command()), workdir=str(Path.cwd()),
            resource="local", executor="inline", gpus=0, code_repo=code.repo, code_branch=code.branch,
            code_commit=code.commit, created_at=now,
        )
        attempt = dict(
            run_id=run_id, attempt_number=1, state=AttemptState.RUNNING.value, executor="inline",
            executor_job_id=inline_job_id(os.getpid()), state_dir=str(state_dir), log_path=str(state_dir / "output.log"),
            host=host_name(), gpu_count=0, code_commit=code.commit, started_at=now,
        )
        blobs = {"config": config_bytes, "environment": capture_environment().canonical, "git_diff": code.dirty_diff}
        pending = write_pending(settings.home, run, attempt, blobs)
        return cls(settings, context, pending, _hand_over(ingester, settings, context, pending))

    def finishing(self) -> None:
        """Tell the ingester that the script is in `finish()`: from now on it ingests at once, at the script's priority."""
        if self._ingester is None:
            return
        try:
            self._ingester.stdin.write(b'{"finishing": true}\n')
            self._ingester.stdin.flush()
        except (OSError, ValueError):
            pass  # gone: close() says so

    def close(self, exit_code: int | None) -> None:
        """Tell the ingester how the script ended, and wait for it to ingest the rest and record the end."""
        ingester, self._ingester = self._ingester, None
        if ingester is None:
            tell(f"trackway: this run was not recorded in the ledger yet; the spool at {self.context.spool_dir} "
                 "keeps everything it logged for the next trackway command")
            return
        answer = None
        try:
            ingester.stdin.write(json.dumps({"end": {"exit_code": exit_code}}).encode() + b"\n")
            ingester.stdin.close()
            answer = _read_answer(ingester.stdout, FINAL_INGEST_PATIENCE_S + ANSWER_GRACE_S)
        except (OSError, ValueError):
            pass
        finally:
            ingester.stdout.close()
        if answer is None and ingester.poll() is None:
            tell(f"trackway: the ingester (pid {ingester.pid}) is still writing this run to the ledger; "
                 "it records the end when it is done")
            return
        if answer is None:
            tell(f"trackway: the ingester exited with status {ingester.returncode} before recording the end; "
                 f"the spool at {self.context.spool_dir} keeps everything for the next trackway command")
        # Answered, it has only the ledger to close (a checkpoint of SQLite's log): not waited for. Python
        # reaps it once it exits.
        ingester.poll()


# How the ingester starts: with no working directory on its path (`-P`: a user's `select.py` must not
# shadow the standard library), and with the directory holding this `trackway` on it when nothing
# else provides it (a checkout the script put on sys.path itself).
_BOOT = (
    "import sys; root = sys.argv[1]; sys.path[:0] = [] if root in sys.path else [root]; "
    "from trackway.sdk.ingester import main; sys.exit(main())"
)


def _recorded_command() -> list[str]:
    """This process's command line as the ledger may hold it: no run retries it, so its words as typed are not kept."""
    from trackway.receipts import submitted_argv

    return submitted_argv.capture([sys.executable, *sys.argv], secret_values()).recorded


def _start_ingester(db_url: str) -> subprocess.Popen | OSError:
    """Start the ingester process (it waits for `_hand_over`); the error when it cannot start."""
    root = str(Path(__file__).resolve().parents[2])
    backend = "sqlite" if db_url.startswith("sqlite:///") else "other"  # what it imports before it is told more
    try:
        return subprocess.Popen(
            [sys.executable or "python3", "-P", "-c", _BOOT, root, backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            # Its own process group, so that a Ctrl-C meant for the script does not kill the ingest of
            # its end; the same session, so that the scheduler weighs its niceness against the script's.
            process_group=0,
        )
    except OSError as exc:
        return exc


def _hand_over(
    ingester: subprocess.Popen | OSError, settings: Settings, context, pending: Path
) -> subprocess.Popen | None:
    """Give the ingester its attempt; None (said on stderr) when it could not start or is gone."""
    order = {
        "db_url": settings.db_url, "cost_per_gpu_hour": settings.resource("local").cost_per_gpu_hour,
        "pending": str(pending),
        "attempt_id": context.attempt_id, "spool_dir": str(context.spool_dir), "parent": os.getpid(),
    }
    try:
        if isinstance(ingester, OSError):
            raise ingester
        ingester.stdin.write(json.dumps({"start": order}).encode() + b"\n")
        ingester.stdin.flush()
    except OSError as exc:
        tell(f"trackway: could not start the ledger ingester ({exc}); the spool at {context.spool_dir} keeps "
             "everything this run logs for the next trackway command")
        return None
    return ingester


def _read_answer(stream, timeout: float) -> dict | None:
    """The ingester's one-line answer, or None when it closed its end or did not answer within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            ready, _, _ = select.select([stream], [], [], left)
        except InterruptedError:
            continue
        if ready:
            line = stream.readline()
            return json.loads(line) if line.strip() else None
