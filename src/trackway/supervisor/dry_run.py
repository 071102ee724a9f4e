"""`trackway submit --dry-run` (and the API's `dry_run`): what a submit would record and start, recording nothing.

The run's receipt is captured and checked as submit does (supervisor/submit.py: bad input is
refused the same way), the resource chosen as submit chooses it, and its first attempt's request
built by the launcher's own launch_request(); the executor's preview() renders it with the code
its submit() uses. Nothing reaches the ledger, the run's directory is never made, no GPU is
leased and no job started. The run id shown is drawn for the preview; a submit draws its own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from trackway.executors.registry import get_executor
from trackway.ledger import Ledger
from trackway.ledger.blobs import sha256_hex
from trackway.ledger.records import new_run_id
from trackway.receipts import submitted_config
from trackway.receipts.code import CodeRef, capture_code, clone_branch
from trackway.redaction import known_values, redact
from trackway.settings import Settings
from trackway.supervisor.launch import launch_request
from trackway.supervisor.launch_inputs import CodeGiven
from trackway.supervisor.submit import RunSpec, capture_receipt, check_repo_script, receipt_blobs, run_row


@dataclass(frozen=True)
class SubmitPreview:
    """What a submit would do: where the run would go and why, and what its executor would be sent."""

    run_id: str  # drawn for the preview only
    attempt_id: str
    resource: str
    executor: str
    qos: str | None
    selection: str  # the placement in words: chosen, why, every resource passed over
    submitted: str  # the executor's preview, secrets masked

    def text(self) -> str:
        return "\n".join([
            "dry run: nothing recorded, nothing started",
            f"resource: {self.selection}",
            f"attempt: {self.attempt_id} (the run id is drawn for this preview; a submit draws its own)",
            self.submitted,
        ])

    def as_json(self) -> dict:
        return {"dry_run": True, "run_id": self.run_id, "attempt_id": self.attempt_id, "resource": self.resource,
                "executor": self.executor, "qos": self.qos, "selection": self.selection, "submitted": self.submitted}


def preview_submit(ledger: Ledger, settings: Settings, spec: RunSpec, console: Console | None = None) -> SubmitPreview:
    """What submitting `spec` would record and start, as a submit would check it; InputError as a submit would."""
    receipt = capture_receipt(ledger, settings, spec, console)
    run_id = new_run_id()
    run_dir = settings.runs_dir / run_id
    selection = receipt.selection
    resource = settings.resource(selection.resource)
    executor = get_executor(resource.executor, settings.home)
    with _code(spec, run_dir) as (workdir, snapshot_from, code):
        blobs = {kind: sha256_hex(content) for kind, content in receipt_blobs(receipt, run_id, code).items()}
        run = run_row(settings, spec, run_id, receipt, workdir, code, blobs)
        given = CodeGiven(snapshot_from, code.commit, code.branch, code.dirty_diff, code.dirty_sha256,
                          {"source": "submit"}, code.repo)
        state_dir = run_dir / "attempts" / "1"
        request = launch_request(
            settings, {**run, "workdir": str(snapshot_from)}, run_id, f"{run_id}/1", 1, state_dir,
            resource=resource, qos=selection.qos, executor=executor, code=given,
            config_path=run_dir / submitted_config.CONFIG_FILE if receipt.config else None,
            variables=receipt.environ.variables, command=_first_command(receipt.command.argv),
            resume_from=None, checkpoint_url=run["checkpoint_root"], restored_path=None,
            time_limit_s=_first_limit(run["time_limit_s"], selection.piece_hours),
        )
        if snapshot_from != workdir:
            from dataclasses import replace

            request = replace(request, cwd=workdir)  # where the clone will be, not the preview's copy of it
        said = executor.preview(request)
    secrets = known_values([*receipt.environ.secret.values(), *receipt.command.hidden()])
    return SubmitPreview(run_id=run_id, attempt_id=f"{run_id}/1", resource=selection.resource,
                         executor=resource.executor, qos=selection.qos, selection=selection.text(),
                         submitted=redact(said, secrets))


def _first_limit(total_s: float | None, piece_hours: float | None) -> float | None:
    """The first attempt's time limit: the run's, or (in pieces) its first piece's, as the launcher sets it."""
    return min(total_s, piece_hours * 3600) if total_s and piece_hours else total_s


def _first_command(argv: list[str]) -> list[str]:
    """The first attempt's command: `{resume_from}` has nothing to resume from yet (its words are dropped)."""
    from trackway.supervisor.outside_checkpoints import substitute_command

    return substitute_command(argv, None, None)


@contextmanager
def _code(spec: RunSpec, run_dir: Path) -> Iterator[tuple[Path, Path, CodeRef]]:
    """Where the command would run, where its code is read from now, and its code receipt.

    With `--repo`, the branch is cloned into a temporary directory (checked as submit checks it,
    the script included) and removed afterwards; the run would run in its own workspace.
    """
    if not spec.repo_url:
        yield spec.cwd, spec.cwd, capture_code(spec.cwd, home=run_dir.parent.parent)
        return
    staging = Path(tempfile.mkdtemp(prefix="trackway-dry-run-"))
    try:
        code = clone_branch(spec.repo_url, spec.branch or "", staging / "workspace")
        check_repo_script(spec, staging / "workspace", code)
        yield run_dir / "workspace", staging / "workspace", code
    finally:
        shutil.rmtree(staging, ignore_errors=True)
