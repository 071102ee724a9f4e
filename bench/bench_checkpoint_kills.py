"""Randomized kill trials against the checkpoint protocol: ≥ 500 real SIGKILLs, 0 bad resumes, 0 lost commits.

Targets (issues 3 and 12): at least --kills (500) writers really die by SIGKILL — counted, not
assumed: a trial whose writer finished before its crash point came up is not a kill, and trials go
on until the promised kills landed (at most twice as many trials as kills); after every trial a
resume (`latest_committed()`) chooses the newest checkpoint that really committed, and nothing the
writer was told was committed is gone. Each trial kills
tests/checkpoints/fault_writer.py — at a random crash point (TRACKWAY_CHECKPOINT_CRASH_AT, a
random pass through it), at a random time after it started writing, or while two writers race on
one step — and then judges the root with the writer's independent oracle. Trials run in chains:
every writer resumes from what the killed one left, as a preempted training job would. A chain
applies retention (keep_last=2) and cleans debris in some trials, so deletes and cleanups die too.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "checkpoints" / "fault_writer.py"
_spec = importlib.util.spec_from_file_location("checkpoint_fault_writer", WRITER)
fw = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fw)

from trackway.checkpoints.layout import CRASH_POINTS  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _common import figure  # noqa: E402

RETENTION_ONLY = {"after_SUPERSEDED_rename", "delete_after_marker", "delete_mid_files"}
NEVER_REACHED = {"before_set_aside"}  # only corruption leads there, and kills do not corrupt


class Chain:
    """One checkpoint root that one killed writer after another resumes from."""

    def __init__(self, directory: Path, seed: int) -> None:
        self.root, self.log = directory / "ckpt", directory / "log"
        self.rng = random.Random(seed)
        self.size = self.rng.choice((64 << 10, 512 << 10, 2 << 20))
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []

    def writer(self, *args: str, crash: str | None = None) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("TRACKWAY_CHECKPOINT_CRASH_AT", None)
        if crash:
            env["TRACKWAY_CHECKPOINT_CRASH_AT"] = crash
        command = [sys.executable, str(WRITER), str(self.root), "--log", str(self.log), "--size", str(self.size), *args]
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def trial(self) -> None:
        kind = self.rng.choices(("crash point", "random time", "race"), weights=(5, 4, 1))[0]
        flags = [f for f, p in (("--retention", 0.6), ("--clean", 0.3)) if self.rng.random() < p]
        if kind == "race":
            killed = self._race()
        elif kind == "crash point":
            skip = NEVER_REACHED | (set() if "--retention" in flags else RETENTION_ONLY)
            point = self.rng.choice([p for p in CRASH_POINTS if p not in skip])
            proc = self.writer("--count", "6", *flags, crash=f"{point}@{self.rng.randint(1, 4)}")
            killed = self._finish(proc, deadline=60) == -signal.SIGKILL
            self.counts[f"point {point}"] += killed
        else:
            proc = self.writer("--count", "100000", *flags)
            proc.stdout.readline()
            time.sleep(self.rng.uniform(0.0, 0.25))
            proc.send_signal(signal.SIGKILL)
            killed = self._finish(proc, deadline=60) == -signal.SIGKILL
        self.counts["trials"] += 1
        self.counts["kills"] += killed
        self.counts[kind] += 1
        self._judge(kind)

    def _race(self) -> bool:
        latest = max(fw.judge(self.root, self.log).really_committed, default=0)
        barrier = self.root.parent / f"go-{time.monotonic_ns()}"
        step = str(latest + 10)
        procs = [self.writer("--step", step, "--variant", str(v), "--barrier", str(barrier)) for v in (1, 2)]
        for proc in procs:
            proc.stdout.readline()
        barrier.touch()
        victim = self.rng.choice(procs)
        time.sleep(self.rng.uniform(0.0, 0.1))
        victim.send_signal(signal.SIGKILL)
        codes = [self._finish(proc, deadline=60) for proc in procs]
        return codes[procs.index(victim)] == -signal.SIGKILL

    def _finish(self, proc: subprocess.Popen, deadline: float) -> int | None:
        """The writer's exit status; None when it hung (the SIGKILL that ends it then is no trial's kill)."""
        try:
            _, proc.stderr_text = proc.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, proc.stderr_text = proc.communicate()
            self.failures.append(f"{self.root}: writer hung")
            self.counts["writer failures"] += 1
            return None
        if proc.returncode not in (0, -signal.SIGKILL):
            self.failures.append(f"{self.root}: writer exited {proc.returncode}: {proc.stderr_text[-400:]}")
            self.counts["writer failures"] += 1
        return proc.returncode

    def _judge(self, kind: str) -> None:
        verdict = fw.judge(self.root, self.log)
        if verdict.bad_resume:
            self.counts["bad resumes"] += 1
            self.failures.append(f"{self.root} after a {kind} kill: {verdict.bad_resume}")
        lost = verdict.lost + verdict.set_aside_good
        if lost:
            self.counts["lost commits"] += len(lost)
            self.failures.append(f"{self.root} after a {kind} kill: lost {lost}")
        self.counts["committed"] = len(verdict.logged)


def run_chain(directory: Path, seed: int, kills: int) -> Chain:
    """Trials on one root until `kills` writers died by SIGKILL (or twice that many trials ran)."""
    chain = Chain(directory, seed)
    while chain.counts["kills"] < kills and chain.counts["trials"] < 2 * kills:
        chain.trial()
    return chain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500, help="SIGKILLs promised: trials go on until they landed")
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="chains run side by side")
    parser.add_argument("--seed", type=int, default=20260509)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint roots for inspection")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="trackway-kills-"))
    started = time.perf_counter()
    per_chain = [args.kills // args.chains + (i < args.kills % args.chains) for i in range(args.chains)]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        chains = list(pool.map(
            lambda i: run_chain(workdir / f"chain-{i:02d}", args.seed + i, per_chain[i]), range(args.chains)
        ))
    elapsed = time.perf_counter() - started
    totals: Counter[str] = sum((c.counts for c in chains), Counter())
    failures = [f for c in chains for f in c.failures]
    points = sorted((k[6:], v) for k, v in totals.items() if k.startswith("point "))
    print(f"trials            {totals['trials']}  (crash points {totals['crash point']}, random times "
          f"{totals['random time']}, races {totals['race']})")
    print(f"not killed        {totals['trials'] - totals['kills']}  (the writer finished before its crash point "
          "came up, or outlived the race: not counted as kills)")
    print(f"commits logged    {sum(c.counts['committed'] for c in chains)}")
    print(f"time              {elapsed:.1f} s  ({elapsed / max(1, totals['trials']) * 1000:.0f} ms per trial)")
    print("kills by point    " + ", ".join(f"{name} {n}" for name, n in points))
    met = [
        figure("SIGKILLs that landed", totals["kills"], unit="kills", target=args.kills, higher_is_better=True),
        figure("bad resumes after a kill", totals["bad resumes"], unit="resumes", target=0),
        figure("commits lost after a kill", totals["lost commits"], unit="commits", target=0),
        figure("writers that hung or failed on their own", totals["writer failures"], unit="writers", target=0),
    ]
    for failure in failures[:20]:
        print("FAIL", failure)
    if args.keep or failures:
        print(f"roots kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if all(met):
        print(f"target met: {totals['kills']} SIGKILLs (promised {args.kills}), 0 bad resumes, 0 lost commits")
        return 0
    missed = []
    if totals["kills"] < args.kills:
        missed.append(f"only {totals['kills']} SIGKILLs landed of the {args.kills} promised")
    if totals["bad resumes"]:
        missed.append(f"{totals['bad resumes']} bad resumes")
    if totals["lost commits"]:
        missed.append(f"{totals['lost commits']} lost commits")
    print("TARGET MISSED: " + "; ".join(missed or ["writers failed (see FAIL lines)"]))
    return 1


if __name__ == "__main__":
    sys.exit(main())
