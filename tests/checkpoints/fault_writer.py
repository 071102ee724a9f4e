"""A checkpoint writer to kill, and the independent oracle that judges what it left behind.

As a script it resumes like a training job (from `latest_committed()`), then writes checkpoints
with real, deterministic payload (several files, one in a subdirectory, one written with
`write_held`, one dropped in without `open()`), and appends `commit STEP VARIANT` to a ground-truth
log, fsynced, only after `commit()` returned. With --retention it also supersedes/deletes (logging
`delete STEP` before deleting), with --clean it removes debris. Kill it anywhere (SIGKILL from
outside, or TRACKWAY_CHECKPOINT_CRASH_AT).

As a module, `judge()` checks a root against the log without trusting the protocol's own code:
markers, manifests and payload bytes are re-derived here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trackway.checkpoints.layout import parse_step
from trackway.checkpoints.retention import RetentionPolicy, apply_retention, plan_retention
from trackway.checkpoints.store import CheckpointStore

SHARDS = ("shard-0.bin", "shard-1.bin", "nested/deeper/shard-2.bin")
NEUTRAL = "neutral.json"


def payload(step: int, variant: int, relpath: str, size: int) -> bytes:
    """The bytes a file of checkpoint `step` must hold; anything else is corruption."""
    if relpath == NEUTRAL:
        return json.dumps({"step": step, "variant": variant}).encode()
    seed = int.from_bytes(hashlib.sha256(f"{step}/{variant}/{relpath}".encode()).digest()[:8], "big")
    return random.Random(seed).randbytes(size)


def shard_size(step: int, index: int, base: int) -> int:
    return base + (step * 7919 + index * 104729) % max(1, base // 2)


def write_checkpoint(store: CheckpointStore, step: int, variant: int, base: int, parent: str | None) -> int:
    """Write and commit one checkpoint; return the variant that storage holds for the step afterwards."""
    rng = random.Random(step * 31 + variant)
    with store.begin(step, run_id="fault", attempt_id=str(os.getpid()), parent=parent) as pending:
        for index, rel in enumerate(SHARDS):
            data = memoryview(payload(step, variant, rel, shard_size(step, index, base)))
            with pending.open(rel) as f:
                # The second shard's bytes stay put until close, as a snapshot's tensors do: hashed in place.
                write = (lambda chunk: f.write_held(chunk, data)) if index == 1 else f.write
                pos = 0
                while pos < len(data):  # a mix of big writes and small ones
                    n = rng.choice((4096, 65536, 1 << 20, 3 << 20))
                    write(data[pos : pos + n])
                    pos += n
        (pending.path / NEUTRAL).write_bytes(payload(step, variant, NEUTRAL, 0))  # no open(), no fsync
        info = pending.commit(metrics={"loss": 1.0 / (step + 1)}, extra={"variant": variant, "base": base})
    return int(info.manifest["extra"]["variant"])


def log_line(log: Path, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--count", type=int, default=3, help="checkpoints to write before exiting")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--size", type=int, default=1 << 20, help="base size of each shard in bytes")
    parser.add_argument("--step", type=int, help="write this one step (for races) instead of resuming")
    parser.add_argument("--variant", type=int, default=0)
    parser.add_argument("--barrier", type=Path, help="wait for this file to exist before writing")
    parser.add_argument("--retention", action="store_true", help="apply keep_last=2 after each commit")
    parser.add_argument("--clean", action="store_true", help="clean debris (min_age_s=0) after each commit")
    args = parser.parse_args(argv)

    store = CheckpointStore(args.root)
    latest = store.latest_committed()
    print("ready", flush=True)
    if args.barrier is not None:
        while not args.barrier.exists():
            time.sleep(0.001)
    steps = [args.step] if args.step is not None else [
        (latest.step if latest else 0) + args.every * (i + 1) for i in range(args.count)
    ]
    parent = latest.name if latest else None
    for step in steps:
        variant = write_checkpoint(store, step, args.variant, args.size, parent)
        log_line(args.log, f"commit {step} {variant}")
        parent = f"step-{step:08d}"
        if args.retention:
            plan = plan_retention(store.list(), RetentionPolicy(keep_last=2))
            for doomed in plan.delete:
                log_line(args.log, f"delete {doomed}")
            apply_retention(store, plan)
        if args.clean:
            store.clean_debris(min_age_s=0)
    return 0


@dataclass
class Verdict:
    """What one look at a root found; `ok` when the resume target is right and nothing committed is lost."""

    logged: list[int] = field(default_factory=list)
    really_committed: set[int] = field(default_factory=set)
    latest: int | None = None
    bad_resume: str | None = None
    lost: list[int] = field(default_factory=list)
    set_aside_good: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.bad_resume is None and not self.lost and not self.set_aside_good


def really_committed(directory: Path) -> bool:
    """The protocol's commit rule, re-derived: marker names the manifest, manifest names every byte."""
    try:
        marker = json.loads((directory / "COMMITTED").read_bytes())
        manifest_bytes = (directory / "MANIFEST.json").read_bytes()
        manifest = json.loads(manifest_bytes)
        if marker["manifest_sha256"] != hashlib.sha256(manifest_bytes).hexdigest():
            return False
        if manifest["step"] != parse_step(directory.name):
            return False
        step, variant, base = manifest["step"], manifest["extra"]["variant"], manifest["extra"]["base"]
        if set(manifest["files"]) != {*SHARDS, NEUTRAL}:
            return False
        for rel, entry in manifest["files"].items():
            data = (directory / rel).read_bytes()
            if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                return False
            size = 0 if rel == NEUTRAL else shard_size(step, SHARDS.index(rel), base)
            if data != payload(step, variant, rel, size):
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def judge(root: Path, log: Path) -> Verdict:
    """Resume as a new attempt would, then compare with the ground-truth log and with storage itself."""
    lines = log.read_text().split("\n") if log.exists() else []
    logged = [int(x.split()[1]) for x in lines if x.startswith("commit ")]
    deleted = {int(x.split()[1]) for x in lines if x.startswith("delete ")}
    verdict = Verdict(logged=logged, really_committed=_oracle(root))
    latest = CheckpointStore(root).latest_committed()
    verdict.latest = latest.step if latest else None
    newest_real = max(verdict.really_committed, default=None)
    if verdict.latest != newest_real:
        verdict.bad_resume = f"latest_committed() chose {verdict.latest}, newest really committed is {newest_real}"
    elif logged and (verdict.latest is None or verdict.latest < max(logged)):
        verdict.bad_resume = f"latest_committed() chose {verdict.latest}, but step {max(logged)} was committed"
    verdict.lost = sorted(set(logged) - deleted - verdict.really_committed)
    verdict.set_aside_good = sorted(verdict.really_committed - _oracle(root))
    return verdict


def _oracle(root: Path) -> set[int]:
    if not root.is_dir():
        return set()
    return {step for p in root.iterdir() if (step := parse_step(p.name)) is not None and really_committed(p)}


if __name__ == "__main__":
    sys.exit(main())
