"""A script run without a supervisor: it records its own run and attempt, and ingests its own spool.

Ids are made locally, the receipt goes to a pending registration file and everything logged to
the spool, so a ledger that is down costs nothing: a background thread registers the run and
ingests whenever the ledger answers, and the end is recorded on `finish()` (or at exit). If the
ledger stays away longer than the script, the next `trackway` command that reaches it
registers the run, ingests the spool and classifies the end from the script's own note.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from trackway.ledger.records import new_run_id
from trackway.settings import Settings, load_settings
from trackway.spool import NOTE_FILE, read_json
from trackway.taxonomy import AttemptState, RunKind, RunState, TerminationReason

INGEST_INTERVAL_S = 2.0
# How long finish() waits for an absent ledger before leaving the rest to the next `trackway` command.
FINAL_INGEST_PATIENCE_S = float(os.environ.get("TRACKWAY_LEDGER_PATIENCE_S", "10"))


class StandaloneSession:
    """The run and attempt a standalone script records, and the thread that keeps the ledger current."""

    def __init__(self, settings: Settings, context, pending: Path):
        self.settings = settings
        self.context = context
        self._pending = pending
        self._ledger = None
        self._registered = False
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trackway-ingest", daemon=True)

    @classmethod
    def start(cls, config: dict | None, name: str | None, project: str, model_family: str | None) -> StandaloneSession:
        from trackway.executors.inline import inline_job_id
        from trackway.ledger.registration import write_pending
        from trackway.receipts.canonical import canonical_json
        from trackway.receipts.code import capture_code
        from trackway.receipts.environment import capture_environment
        from trackway.receipts.placement import host_name
        from trackway.sdk.run import AttemptContext

        settings = load_settings()
        run_id = new_run_id()
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
            state=RunState.RUNNING.value, command=json.dumps([sys.executable, *sys.argv]), workdir=str(Path.cwd()),
            resource="local", executor="inline", gpus=0, code_repo=code.repo, code_branch=code.branch,
            code_commit=code.commit, created_at=now,
        )
        attempt = dict(
            run_id=run_id, attempt_number=1, state=AttemptState.RUNNING.value, executor="inline",
            executor_job_id=inline_job_id(os.getpid()), state_dir=str(state_dir), log_path=str(state_dir / "output.log"),
            host=host_name(), gpu_count=0, code_commit=code.commit, started_at=now,
        )
        blobs = {"config": config_bytes, "environment": capture_environment().canonical, "git_diff": code.dirty_diff}
        session = cls(settings, context, write_pending(settings.home, run, attempt, blobs))
        session._thread.start()
        return session

    def _loop(self) -> None:
        while not self._stop.wait(INGEST_INTERVAL_S):
            self._sync()

    def _sync(self) -> bool:
        """Register (once) and ingest; False while the ledger does not answer."""
        try:
            from trackway.ledger import open_ledger
            from trackway.ledger.ingest import ingest_attempt
            from trackway.ledger.records import get_attempt

            if self._ledger is None:
                self._ledger = open_ledger(self.settings.db_url)
            if not self._registered:
                self._register()
            with self._ledger.read() as conn:
                attempt = get_attempt(conn, self.context.attempt_id)
            ingest_attempt(self._ledger, attempt)
            self.last_error = None
            return True
        except Exception as exc:  # noqa: BLE001 - the ledger being away must never stop training
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False

    def _register(self) -> None:
        from trackway.ledger.registration import register_pending

        register_pending(self._ledger, self._pending)
        self._registered = True

    def close(self, exit_code: int | None) -> None:
        """Final ingest and the attempt's end, waiting a little for a ledger that is away."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        deadline = time.monotonic() + FINAL_INGEST_PATIENCE_S
        while not self._sync():
            if time.monotonic() > deadline:
                print(
                    f"trackway: could not reach the ledger ({self.last_error}); the spool at "
                    f"{self.context.spool_dir} keeps everything this run logged",
                    file=sys.stderr,
                )
                return
            time.sleep(0.5)
        self._record_end(exit_code)

    def _record_end(self, exit_code: int | None) -> None:
        from trackway.ledger.records import get_attempt, record_attempt_end

        note = read_json(self.context.spool_dir / NOTE_FILE)
        if note and note.get("reason") in TerminationReason._value2member_map_:
            reason, rule, lines = TerminationReason(note["reason"]), "sdk:note", [note.get("message", "")]
        else:
            reason, rule = TerminationReason.UNKNOWN, "sdk:no-finish"
            lines = ["the script exited without run.finish() and without an uncaught exception"]
        evidence = json.dumps({"rule": rule, "lines": lines, "exit_code": exit_code, "signal": None})
        with self._ledger.write() as conn:
            attempt = get_attempt(conn, self.context.attempt_id)
            record_attempt_end(
                conn,
                attempt,
                ended_at=datetime.now(timezone.utc),
                reason=reason,
                evidence_json=evidence,
                exit_code=exit_code,
                signal=None,
                cost_per_gpu_hour=self.settings.resource("local").cost_per_gpu_hour,
            )
        self._ledger.dispose()
