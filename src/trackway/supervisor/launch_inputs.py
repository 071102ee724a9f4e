"""What an attempt is given when it launches, captured then: its code and its data manifest.

An attempt's receipt is what that attempt ran, not what its run was submitted with. Who launches
decides where the code comes from (`CODE_FROM`):

    submit      the first attempt, launched by its submitter right after the run's receipt was
                taken: the work tree, and the run's code receipt
    receipt     a retry the policy decided (or a launch the supervisor took over): the run's
                recorded commit and diff, rebuilt into the attempt's own workspace
                (supervisor/workspace.py), so a half-edited work tree never leaks into it; where
                there is nothing to rebuild from (no git, the commit gone) the work tree as it is
                now, captured and said so
    work_tree   `trackway resume` typed by a person: the work tree as it is now, with a new code
                receipt (`--same-code` asks for `receipt` instead)

The data manifest is resolved again at every launch (receipts/data_manifest.py, with its cache);
the files that changed since the previous attempt are listed with their old and new size and
sha256, and `[retry] on_data_change` decides what a policy retry does about them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trackway.errors import ExecutorError, TrackwayError
from trackway.ledger.blobs import get_blob
from trackway.receipts.code import CodeRef, capture_code
from trackway.receipts.data_manifest import build_data_manifest
from trackway.settings import Settings

CODE_FROM = ("submit", "receipt", "work_tree")


@dataclass(frozen=True)
class CodeGiven:
    """The code one attempt runs: where, which commit and diff, and how it was taken (the `code_capture` column)."""

    cwd: Path
    commit: str | None
    branch: str | None
    dirty_diff: bytes | None
    dirty_sha256: str | None
    record: dict[str, Any]
    repo: str | None = None


def code_for_attempt(conn, settings: Settings, run, code_from: str, remote: bool) -> CodeGiven:
    """The code an attempt of `run` is given, as `code_from` says (see the module's docstring).

    `remote`: the executor runs elsewhere and is sent a snapshot built from the commit and diff
    (executors/code_snapshot.py), so no local workspace is built for it.
    """
    workdir = Path(run["workdir"])
    if code_from == "submit":
        diff = get_blob(conn, run["code_dirty_sha256"]) if run["code_dirty_sha256"] else None
        return CodeGiven(workdir, run["code_commit"], run["code_branch"], diff, run["code_dirty_sha256"],
                         {"source": "submit", "said": "the work tree, as the run's receipt took it at submit"},
                         run["code_repo"])
    if code_from == "receipt":
        return _rebuilt(conn, settings, run, remote)
    return _work_tree_now(settings, workdir, "work_tree", "the work tree as it was when this attempt launched")


def _rebuilt(conn, settings: Settings, run, remote: bool) -> CodeGiven:
    from trackway.supervisor.workspace import prepare_workspace

    workdir = Path(run["workdir"])
    if not run["code_commit"]:
        why = "the run has no code receipt (not submitted from a git work tree)" if not run["code_repo"] else \
            "the run's work tree had no commit yet"
        return _work_tree_now(settings, workdir, "work_tree",
                              f"the work tree as it was when this attempt launched: {why}, so nothing to rebuild from")
    diff = get_blob(conn, run["code_dirty_sha256"]) if run["code_dirty_sha256"] else None
    given = dict(commit=run["code_commit"], branch=run["code_branch"], dirty_diff=diff,
                 dirty_sha256=run["code_dirty_sha256"], repo=run["code_repo"])
    if remote:
        return CodeGiven(workdir, record={"source": "receipt", "said": "the run's recorded commit and diff, sent to "
                                          "the host as a snapshot"}, **given)
    try:
        workspace = prepare_workspace(settings.runs_dir, run["run_id"], workdir, run["code_commit"], diff,
                                      home=settings.home)
    except (ExecutorError, OSError) as exc:
        # Running the work tree instead would break the promise the receipt makes: the launch fails, said.
        raise TrackwayError(f"the run's recorded code could not be rebuilt for its retry: {exc}") from exc
    if workspace is None:
        return _work_tree_now(settings, workdir, "work_tree",
                              f"the work tree as it was when this attempt launched: commit {run['code_commit'][:12]} "
                              "is no longer in the repository, so the submitted code could not be rebuilt")
    return CodeGiven(workspace.cwd, record={"source": "receipt", "said": "the run's recorded commit and diff, rebuilt "
                                            "into the attempt's own workspace", "workspace": workspace.as_record()},
                     **given)


def _work_tree_now(settings: Settings, workdir: Path, source: str, said: str) -> CodeGiven:
    code: CodeRef = capture_code(workdir, home=settings.home)
    if code.repo is None:
        said += "; not a git repository, so its code is not recorded"
    return CodeGiven(workdir, code.commit, code.branch, code.dirty_diff, code.dirty_sha256,
                     {"source": source, "said": said}, code.repo)


@dataclass(frozen=True)
class DataGiven:
    """The data manifest an attempt launches with, and what changed since the previous attempt's."""

    sha256: str | None
    canonical: bytes | None
    changes: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None  # the data could not be resolved (a path gone): the attempt's data is not known

    def message(self, since: str) -> str:
        """`3 data files changed since RUN/1: data/train.csv (8,709 → 9,141 bytes), ...` for an event."""
        if self.problem:
            return f"the data could not be resolved: {self.problem}; this attempt's data is not known"
        shown = ", ".join(_change_text(c) for c in self.changes[:5])
        more = f" and {len(self.changes) - 5} more" if len(self.changes) > 5 else ""
        return f"{len(self.changes)} data file(s) changed since {since}: {shown}{more}"


def data_for_attempt(conn, settings: Settings, run, previous_sha: str | None) -> DataGiven:
    """The run's `--data` resolved now (cached by stat), and each file changed since `previous_sha`'s manifest."""
    if not run["data_paths"]:
        return DataGiven(None, None)
    try:
        manifest = build_data_manifest(json.loads(run["data_paths"]), cache_dir=settings.home / "cache")
    except TrackwayError as exc:
        return DataGiven(None, None, problem=str(exc))
    if manifest is None:
        return DataGiven(None, None)
    before = json.loads(get_blob(conn, previous_sha)) if previous_sha else {"files": []}
    if previous_sha == manifest.sha256:
        return DataGiven(manifest.sha256, manifest.canonical)
    return DataGiven(manifest.sha256, manifest.canonical, file_changes(before, json.loads(manifest.canonical)))


def file_changes(before: Any, after: Any) -> list[dict[str, Any]]:
    """Each file added, removed or changed between two manifests: {path, before: {size, sha256}, after: {...}}."""
    a = {f["path"]: f for f in (before or {}).get("files", [])}
    b = {f["path"]: f for f in (after or {}).get("files", [])}
    changes = []
    for path in sorted(a.keys() | b.keys()):
        old, new = a.get(path), b.get(path)
        if old is not None and new is not None and old["sha256"] == new["sha256"]:
            continue
        changes.append({"path": path, "before": _side(old), "after": _side(new)})
    return changes


def _side(entry: dict | None) -> dict | None:
    return None if entry is None else {"size": entry.get("size"), "sha256": entry.get("sha256")}


def _change_text(change: dict[str, Any]) -> str:
    before, after = change["before"], change["after"]
    if before is None:
        return f"{change['path']} (added, {after['size']:,} bytes)"
    if after is None:
        return f"{change['path']} (removed)"
    return f"{change['path']} ({before['size']:,} → {after['size']:,} bytes)"
