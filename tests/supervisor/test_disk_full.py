"""A full disk is told as a full disk: infra_transient with "disk full:" evidence, never retried blindly.

Regression for issue 9.6: a training script that died of ENOSPC during a checkpoint save was
`code_error` with "fix the training code", and the policy would have retried an infra_transient
ending into the same full disk. Real processes under `trackway submit`, a real full tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trackway.sdk.hooks import describe_exception, reason_for_exception
from trackway.supervisor.classify import DiskFull
from trackway.supervisor.policy import AttemptOutcome, decide, load_policy
from trackway.taxonomy import TerminationReason as R

PY = sys.executable
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "disk_full_save.py")


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 256 KiB tmpfs: the script fills it with its 'checkpoint' and meets a real ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"a real full disk needs a tmpfs mount, and it failed: {done.stderr.strip() or done.returncode}")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _ended(cli, name: str) -> tuple[dict, dict, dict]:
    """The only attempt of run `name`, its decision, and what `trackway explain` says of it."""
    (attempt,) = cli("attempts", name, "--json").json()  # exactly one: nothing was retried
    decision = json.loads(attempt["retry_decision"])
    facts = cli("explain", name, "--json").json()
    return attempt, decision, facts


def test_a_checkpoint_save_that_fills_the_disk_is_disk_full_and_not_retried(cli, full_disk):
    result = cli("submit", "--name", "full", "--", PY, SCRIPT, str(full_disk), "sdk-wrapped")
    assert result.code == 1, result.err
    attempt, decision, facts = _ended(cli, "full")
    assert attempt["termination_reason"] == "infra_transient"
    evidence = attempt["termination_evidence"]
    assert evidence["rule"] == "sdk:note"
    assert evidence["lines"][0] == f"disk full: {full_disk}"  # the path the wrapping save named
    assert any("No space left on device" in line for line in evidence["lines"])
    assert (decision["action"], decision["rule"]) == ("stop", "infra_transient: disk full")
    assert f"free space on the file system holding {full_disk}" in decision["message"]
    assert "`trackway resume full`" in decision["message"]
    # What a person reads the next morning: the reason, the evidence and the advice, from the ledger alone.
    assert facts["ended_by"]["reason"] == "infra_transient"
    assert facts["ended_by"]["evidence"][0].startswith("disk full:")
    assert "`trackway resume full`" in facts["next"] and "code" not in facts["next"]
    assert cli("runs", "--json").json()[0]["state"] == "failed"


@pytest.mark.parametrize(
    ("mode", "first_line", "where"),
    [
        ("named", "disk full: {disk}/model.bin", "the file system holding {disk}/model.bin"),
        ("plain", "disk full: path not reported", "the disk the attempt writes to"),
    ],
)
def test_a_script_without_the_sdk_dying_of_enospc_is_disk_full(cli, full_disk, mode, first_line, where):
    result = cli("submit", "--name", mode, "--", PY, SCRIPT, str(full_disk), mode)
    assert result.code == 1, result.err
    attempt, decision, facts = _ended(cli, mode)
    assert attempt["termination_reason"] == "infra_transient"
    assert attempt["termination_evidence"]["rule"] == "log:disk-full"
    assert attempt["termination_evidence"]["lines"][0] == first_line.format(disk=full_disk)
    assert decision["action"] == "stop" and decision["rule"] == "infra_transient: disk full"
    assert where.format(disk=full_disk) in decision["message"] and f"`trackway resume {mode}`" in decision["message"]
    assert f"`trackway resume {mode}`" in facts["next"]


def test_a_policy_that_resumes_infra_transient_still_stops_on_a_full_disk(tmp_path):
    policy_file = tmp_path / "p.toml"
    policy_file.write_text("[reasons.infra_transient]\nbudget = 50\nbackoff_seconds = 0\n")
    policy = load_policy(policy_file)
    full = DiskFull("/ckpt/step-5", 0)
    stopped = decide(policy, [AttemptOutcome(R.INFRA_TRANSIENT, disk_full=full)], run_ref="big")
    assert (stopped.action, stopped.rule) == ("stop", "infra_transient: disk full")
    assert "(0 bytes were free)" in stopped.message and "`trackway resume big`" in stopped.message
    # Without the full disk, the same policy retries: the stop is the disk's doing.
    assert decide(policy, [AttemptOutcome(R.INFRA_TRANSIENT)]).action == "resume"


def test_enospc_anywhere_in_the_exception_chain_is_disk_full(full_disk):
    target = full_disk / "model.bin"
    try:
        with target.open("wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
    except OSError as real:
        enospc = real
    assert enospc.errno == errno.ENOSPC
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        except OSError as exc:
            raise RuntimeError("checkpoint save failed") from exc
    except RuntimeError as wrapped:
        outer = wrapped
    assert reason_for_exception(enospc, made_progress=True) is R.INFRA_TRANSIENT
    assert reason_for_exception(outer, made_progress=True) is R.INFRA_TRANSIENT
    assert reason_for_exception(RuntimeError("x"), made_progress=True) is R.CODE_ERROR
    # The SDK's note measures the free space where the disk filled up.
    assert describe_exception(outer).startswith(f"disk full: {target}, 0 bytes free (RuntimeError: ")


TS = "2026-11-22T04:10:00.000000Z err "


@pytest.mark.parametrize(
    ("line", "path", "free"),
    [
        ("OSError: [Errno 28] No space left on device: '/ckpt/step-5/model.pt'", "/ckpt/step-5/model.pt", None),
        ("shutil.Error: [Errno 28] No space left on device: '/a/x' -> '/ckpt/x'", "/ckpt/x", None),
        ("cp: error writing '/data/shard-3': No space left on device", "/data/shard-3", None),
        ("write /scratch/out.bin: ENOSPC (12 bytes free)", "/scratch/out.bin", 12),
        ("checkpoint writer: disk full", None, None),
    ],
)
def test_the_log_names_the_full_disk_with_its_path_and_free_bytes(line, path, free):
    from trackway.supervisor.classify import Evidence, classify

    verdict = classify(Evidence(exit_code=1, log_tail=[TS + "Traceback (most recent call last):", TS + line]))
    assert (verdict.reason, verdict.rule) == (R.INFRA_TRANSIENT, "log:disk-full")
    assert verdict.disk_full == DiskFull(path, free)
    assert verdict.lines[0] == DiskFull(path, free).line() and verdict.lines[0].startswith("disk full: ")


def test_the_sdk_note_that_measured_the_free_space_is_kept_as_it_is():
    from trackway.supervisor.classify import Evidence, classify

    message = "disk full: /ckpt/step-5/model.pt, 0 bytes free (RuntimeError: checkpoint save failed)"
    verdict = classify(Evidence(exit_code=1, sdk_note={"reason": "infra_transient", "message": message}))
    assert verdict.lines[0] == message and verdict.disk_full == DiskFull("/ckpt/step-5/model.pt", 0)


def test_an_evaluation_that_filled_the_disk_is_not_retried_either():
    from trackway.supervisor.classify import Evidence, classify
    from trackway.supervisor.policy import RetryPolicy
    from trackway.supervisor.retry import disk_full_of

    verdict = classify(Evidence(exit_code=1, log_tail=[TS + "OSError: [Errno 28] No space left on device"], evaluation=True))
    assert verdict.reason is R.EVALUATOR_CRASH  # evaluator_crash is retried twice by default...
    stored = disk_full_of(verdict.evidence_json(Evidence(exit_code=1)))
    decision = decide(RetryPolicy(), [AttemptOutcome(R.EVALUATOR_CRASH, disk_full=stored)], run_ref="ev1")
    assert decision.action == "stop" and "`trackway resume ev1`" in decision.message  # ...but not into a full disk
