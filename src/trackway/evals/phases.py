"""Two-phase evaluations: which phase a seed's run is, and the inference outputs committed like a checkpoint.

The inference run writes the model's outputs into `$TRACKWAY_EVAL_OUTPUTS_DIR` (a directory in
its attempt's state directory). When it exits 0, the supervisor commits that directory, before
anything else reads it, through the checkpoint protocol (checkpoints/store.py): content-addressed
files under `runs/INFERENCE_RUN/outputs/step-N` (N: the attempt number) with a manifest of their
sizes and sha256, and a commit marker. The scoring run reads the committed directory as
`$TRACKWAY_EVAL_INFERENCE_OUTPUTS`; a retry of the scorer reads the same one. A scorer that asks
a judge writes every answer to `$TRACKWAY_EVAL_JUDGE_ANSWERS`, kept as a blob beside the outputs.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

PHASE_ENV = "TRACKWAY_EVAL_PHASE"  # `inference` or `scoring`, in the run's env: absent for an evaluation in one command
INFERENCE = "inference"
SCORING = "scoring"
OUTPUTS_DIR = "inference-outputs"  # in the inference attempt's state directory: $TRACKWAY_EVAL_OUTPUTS_DIR
JUDGE_ANSWERS_FILE = "judge-answers.jsonl"  # in the scoring attempt's state directory: $TRACKWAY_EVAL_JUDGE_ANSWERS
STORE_DIR = "outputs"  # runs/INFERENCE_RUN/outputs: the committed outputs, one step per successful attempt


def run_phase(run: Mapping[str, Any]) -> str | None:
    """The phase a run of kind eval runs (`inference`, `scoring`), or None (one command, or not an evaluation)."""
    try:
        env = json.loads(run["env"]) if run["env"] else {}
    except (ValueError, TypeError):
        return None
    phase = env.get(PHASE_ENV) if isinstance(env, dict) else None
    return phase if phase in (INFERENCE, SCORING) else None


def phase_environment(phase: str | None, state_dir: Path) -> dict[str, str]:
    """Where a phase's attempt writes: the inference outputs' directory (made now), or the scorer's output files."""
    from trackway.evals.outputs import OUTPUT_FILE

    if phase == INFERENCE:
        outputs = state_dir / OUTPUTS_DIR
        outputs.mkdir(parents=True, exist_ok=True)
        return {"TRACKWAY_EVAL_OUTPUTS_DIR": str(outputs)}
    env = {"TRACKWAY_EVAL_OUTPUT": str(state_dir / OUTPUT_FILE)}
    if phase == SCORING:
        env["TRACKWAY_EVAL_JUDGE_ANSWERS"] = str(state_dir / JUDGE_ANSWERS_FILE)
    return env


@dataclass(frozen=True)
class CommittedOutputs:
    """An inference attempt's outputs as committed (path and manifest hash), or why they could not be."""

    path: str | None = None
    manifest_sha256: str | None = None
    files: int = 0
    bytes: int = 0
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def commit_inference_outputs(run_dir: Path, state_dir: Path, run_id: str, attempt_id: str,
                             attempt_number: int) -> CommittedOutputs:
    """Commit what an inference attempt wrote into its outputs directory; a second call returns the first commit.

    The files are moved (one rename each, on the same file system), not copied, into the pending
    checkpoint, hashed and fsynced by its commit. Nothing written is a problem: a scorer given no
    outputs would score nothing.
    """
    from trackway.checkpoints.store import CheckpointStore
    from trackway.errors import TrackwayError
    from trackway.receipts.canonical import sha256_hex

    store = CheckpointStore(run_dir / STORE_DIR)
    held = store.get(attempt_number) if store.root.is_dir() else None
    if held is None or not held.state.readable:
        written = state_dir / OUTPUTS_DIR
        entries = sorted(written.iterdir()) if written.is_dir() else []
        if not entries:
            return CommittedOutputs(problem=f"the inference phase wrote nothing into $TRACKWAY_EVAL_OUTPUTS_DIR "
                                            f"({written})")
        try:
            pending = store.begin(attempt_number, run_id=run_id, attempt_id=attempt_id)
            for entry in entries:
                shutil.move(str(entry), str(pending.path / entry.name))
            held = pending.commit(extra={"kind": "eval_inference_outputs"})
        except (OSError, TrackwayError) as exc:
            return CommittedOutputs(problem=f"the inference outputs could not be committed: {exc}")
    manifest = (held.path / "MANIFEST.json").read_bytes()
    files = json.loads(manifest).get("files") or {}
    size = sum(int(f.get("size") or 0) for f in files.values()) if isinstance(files, dict) else 0
    return CommittedOutputs(str(held.path), sha256_hex(manifest), len(files), size)


def judge_answers(state_dir: Path) -> bytes | None:
    """What the scorer kept of its judge's answers (None: it wrote no such file)."""
    try:
        return (state_dir / JUDGE_ANSWERS_FILE).read_bytes()
    except OSError:
        return None
