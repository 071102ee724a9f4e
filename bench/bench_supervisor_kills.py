"""Random kill -9s of `trackway supervise` and of foreground `trackway submit` while runs preempt and retry.

Target (issue 9): ≥ 50 kills delivered to live processes, and 0 lost, 0 duplicated, 0 stuck,
0 wrongly classified attempts, 0 attempts that ran with another environment than submitted.

What happens, against the real CLI and SDK on a fresh TRACKWAY_HOME (SQLite, or a fresh
PostgreSQL database with --db):

- trials: each is one foreground `trackway submit --name kb-N -- python kill_trial_train.py`,
  with KILLBENCH_TOKEN (unique) and KILLBENCH_STEPS (the script's step count) in the submitter's
  environment only. Most submitters are killed with SIGKILL at a chosen moment: at a random time
  during start-up, as soon as the run is recorded (before its first attempt), as soon as its first
  attempt is recorded (mid-launch), or while it follows the run (and ticks, launching other runs'
  retries with *its* environment at hand). The others are left to follow their run to the end.
- supervisors: one `trackway supervise` at a time, with KILLBENCH_LAUNCHER_ONLY in its
  environment (which no attempt may see), SIGKILLed after a random time or just as a retry falls
  due, then restarted after a random gap.
- preemptions: the training process of a running attempt gets a SIGTERM (a real preemption
  notice) at a random step, up to 1-3 times per run; it checkpoints and exits preempted, so the
  policy queues a retry for whichever process ticks next.
- then one healthy supervisor runs until every run is terminal and no training process is left
  (or --settle-timeout passes), and the ledger is judged against what the training processes
  wrote down (bench/scripts/kill_trial_train.py keeps one record per process).

How each figure is counted:
- lost: a run with no attempt at the end; a run whose submitter printed its id but that is not in
  the ledger; a run that ended without completing although no attempt's reason or budget says why.
- duplicated: two attempts with one number; one attempt started as two processes; two training
  processes of one run alive at once; two unfinished attempts of one run seen in the ledger at once.
- stuck: a run still queued or running at the end with attempts and no live training process.
- wrongly classified: an attempt whose reason is not what its process did (a preemption notice →
  `preempted`, the last step done → `completed`), or a launch that never started a process not
  ended as an interrupted launch (`infra_transient`), or either of those not retried.
- different environment: an attempt whose process saw another KILLBENCH_TOKEN or KILLBENCH_STEPS
  than its run was submitted with, saw KILLBENCH_LAUNCHER_ONLY, or completed a step count other
  than the submitted one.
A submitter killed before it recorded its run submitted nothing; a run that ended `failed` after
spending a retry budget is not lost (the generous budgets in the bench's trackway.toml make that rare).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PG_ADMIN_URL, figure  # noqa: E402
from sqlalchemy import create_engine, func, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from trackway.ledger.schema import attempts, runs  # noqa: E402
from trackway.supervisor import loop as supervisor_loop  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "scripts" / "kill_trial_train.py"
STEP_SECONDS = 0.06
TERMINAL = {"completed", "failed", "cancelled"}
RUN_ID = re.compile(r"^r[0-9a-f]{6,}$")
# The retries a kill can cost a run (interrupted launches, preemptions) must not run out before
# the run is done, and an interrupted launch's retry should not wait the default 30 s backoff:
# the bench judges the control plane, not the budgets.
TRACKWAY_TOML = """\
[retry.reasons.preempted]
budget = 40
[retry.reasons.infra_transient]
budget = 20
backoff_seconds = 1
"""
SUBMIT_PLANS = {"start-up": 2, "run recorded": 2, "attempt recorded": 2, "following": 3, "left alone": 1.5}


@dataclass
class Trial:
    index: int
    name: str
    token: str
    steps: int
    plan: str
    max_preemptions: int
    proc: subprocess.Popen | None = None
    killed: bool = False
    printed_run_id: str | None = None
    rng: random.Random = field(default_factory=random.Random)  # its kill delays


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    kills: Counter = field(default_factory=Counter)  # delivered, by target / plan
    missed_kills: int = 0  # the process had already exited
    preemptions: dict = field(default_factory=dict)  # pid -> (run_id, attempt_number, t)
    preemptions_by_run: Counter = field(default_factory=Counter)
    live_duplicates: dict = field(default_factory=dict)  # run_id -> attempt ids seen unfinished together
    crashes: list = field(default_factory=list)  # control-plane processes that exited by themselves, badly


class Ledger:
    """The bench's own read-only view of the ledger, as an outside observer (no trackway code path)."""

    def __init__(self, url: str):
        self.engine = create_engine(url, poolclass=NullPool)

    def query(self, statement):
        for attempt in range(20):
            try:
                with self.engine.connect() as conn:
                    return list(conn.execute(statement).mappings())
            except Exception:  # noqa: BLE001 - a locked SQLite file; the observer just asks again
                if attempt == 19:
                    raise
                time.sleep(0.05)

    def runs(self) -> list[dict]:
        return [dict(r) for r in self.query(select(runs))]

    def attempts(self) -> list[dict]:
        return [dict(r) for r in self.query(select(attempts).order_by(attempts.c.run_id, attempts.c.attempt_number))]

    def run_named(self, name: str) -> dict | None:
        rows = self.query(select(runs.c.run_id, runs.c.state).where(runs.c.name == name))
        return dict(rows[0]) if rows else None

    def attempts_of_name(self, name: str) -> list[dict]:
        query = select(attempts.c.attempt_id, attempts.c.state).join(runs, runs.c.run_id == attempts.c.run_id)
        return [dict(r) for r in self.query(query.where(runs.c.name == name))]

    def due_retry_or_launch(self) -> bool:
        """A retry is due (a supervisor is about to launch it) or some attempt is mid-launch."""
        now = datetime.now(timezone.utc)
        unfinished = select(attempts.c.run_id).where(
            attempts.c.run_id == runs.c.run_id, attempts.c.state != "ended"
        ).exists()
        has_attempt = select(attempts.c.run_id).where(attempts.c.run_id == runs.c.run_id).exists()
        due = select(runs.c.run_id).where(runs.c.state == "queued", has_attempt, ~unfinished).where(
            (runs.c.not_before.is_(None)) | (runs.c.not_before <= now)
        )
        starting = select(attempts.c.attempt_id).where(attempts.c.state == "starting")
        return bool(self.query(due.limit(1)) or self.query(starting.limit(1)))

    def unfinished_together(self) -> list[dict]:
        query = (
            select(attempts.c.run_id, func.count().label("n"))
            .where(attempts.c.state != "ended")
            .group_by(attempts.c.run_id)
            .having(func.count() > 1)
        )
        return [dict(r) for r in self.query(query)]

    def dispose(self) -> None:
        self.engine.dispose()


def training_alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process of the bench's training script."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X") and SCRIPT.name.encode() in cmdline


def read_records(home: Path) -> list[dict]:
    records = []
    for path in (home / "runs").glob("*/attempts/*/killbench/*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # replaced mid-read; the next scan sees it whole
        record["last_seen"] = path.stat().st_mtime  # rewritten at every step: when the process was last alive
        record["path"] = str(path)
        record["run_dir"] = path.parents[3].name
        record["dir_attempt"] = int(path.parents[1].name)
        records.append(record)
    return records


def kill9(proc: subprocess.Popen) -> bool:
    """SIGKILL `proc`; True only when the signal reached it alive (it did not exit by itself first)."""
    if proc.poll() is not None:
        return False
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return proc.returncode == -signal.SIGKILL


class Bench:
    def __init__(self, args, workdir: Path, db_url: str):
        self.args = args
        # One generator per thread: --seed fixes every plan and delay drawn; when processes get there is the machine's.
        self.supervisor_rng = random.Random(f"{args.seed}-supervisors")
        self.submit_rng = random.Random(f"{args.seed}-submits")
        self.preempt_rng = random.Random(f"{args.seed}-preemptions")
        self.workdir = workdir
        self.home = workdir / "home"
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True)
        self.db_url = db_url
        self.ledger = Ledger(db_url)
        self.tally = Tally()
        self.trials: list[Trial] = []
        self.stop_chaos = threading.Event()
        self.stop_watch = threading.Event()
        self.submissions_done = threading.Event()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("KILLBENCH_", "TRACKWAY_"))}
        self.base_env = {**base, "TRACKWAY_HOME": str(self.home), "TRACKWAY_DB": db_url, "PYTHONUNBUFFERED": "1"}
        self.supervisor_count = 0
        self.healthy: subprocess.Popen | None = None

    # -- processes -------------------------------------------------------------------------

    def spawn(self, args: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen:
        out = open(self.logs / f"{log_name}.out", "w")
        err = open(self.logs / f"{log_name}.err", "w")
        try:
            return subprocess.Popen([sys.executable, "-m", "trackway", *args], env=env, cwd=self.workdir,
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        finally:
            out.close()
            err.close()

    def start_supervisor(self, label: str) -> subprocess.Popen:
        self.supervisor_count += 1
        env = {**self.base_env, "KILLBENCH_LAUNCHER_ONLY": f"supervisor-{self.supervisor_count}"}
        return self.spawn(["supervise", "--interval", "0.5"], env, f"supervisor-{self.supervisor_count}-{label}")

    def note_crash(self, what: str, proc: subprocess.Popen, log_name: str, allowed: tuple[int, ...]) -> None:
        """A control-plane process that ended by itself with a traceback or an unexpected status."""
        if proc.returncode in allowed or proc.returncode == -signal.SIGKILL:
            return
        err = (self.logs / f"{log_name}.err").read_text(errors="replace")
        with self.tally.lock:
            self.tally.crashes.append(f"{what} exited {proc.returncode}: {err.strip()[-300:]}")

    # -- chaos: supervisors ----------------------------------------------------------------

    def supervisors(self) -> None:
        while True:
            label = self.supervisor_rng.choice(("random time", "random time", "retry due"))
            proc = self.start_supervisor("chaos")
            log_name = f"supervisor-{self.supervisor_count}-chaos"
            started = time.monotonic()
            if label == "random time":
                self.stop_chaos.wait(self.supervisor_rng.uniform(0.5, 5.0))
            else:
                self.stop_chaos.wait(1.0)  # its start-up; the kill should land in its work
                while not self.stop_chaos.is_set() and time.monotonic() - started < 8:
                    if self.ledger.due_retry_or_launch():
                        time.sleep(self.supervisor_rng.uniform(0.0, 0.6))  # within one --interval of the launch
                        break
                    time.sleep(0.05)
            delivered = kill9(proc)
            self.count_kill("supervisor", label, delivered)
            if not delivered:
                self.note_crash("a chaos supervisor", proc, log_name, allowed=())
            if self.stop_chaos.is_set():
                return
            self.stop_chaos.wait(self.supervisor_rng.uniform(0.0, 2.0))  # no supervisor for a while: retries wait

    def count_kill(self, target: str, plan: str, delivered: bool) -> None:
        with self.tally.lock:
            if delivered:
                self.tally.kills[target] += 1
                self.tally.kills[f"{target}: {plan}"] += 1
            else:
                self.tally.missed_kills += 1

    def kills_delivered(self) -> int:
        with self.tally.lock:
            return self.tally.kills["supervisor"] + self.tally.kills["submitter"]

    # -- chaos: submitters -----------------------------------------------------------------

    def submitters(self, count: int) -> None:
        killers = []
        plans, weights = zip(*SUBMIT_PLANS.items())
        for index in range(count):
            waited = time.monotonic()
            # Bounded load on a small machine; a gate that stuck runs would hold shut forever opens after 20 s.
            while not self.stop_chaos.is_set() and time.monotonic() - waited < 20:
                killable = sum(1 for t in self.trials if t.plan != "left alone" and t.proc.poll() is None)
                active = sum(1 for r in self.ledger.runs() if r["state"] not in TERMINAL)
                if killable < 2 and active < 6:
                    break
                time.sleep(0.2)
            if self.stop_chaos.is_set():
                break
            trial = Trial(
                index=index,
                name=f"kb-{index:03d}",
                token=f"kb-{index:03d}-{self.submit_rng.getrandbits(64):016x}",
                steps=self.submit_rng.randint(25, 60),
                plan=self.submit_rng.choices(plans, weights)[0],
                max_preemptions=self.submit_rng.randint(1, 3),
                rng=random.Random(f"{self.args.seed}-{index}"),
            )
            env = {**self.base_env, "KILLBENCH_TOKEN": trial.token, "KILLBENCH_STEPS": str(trial.steps)}
            command = ["submit", "--name", trial.name, "--", sys.executable, str(SCRIPT), str(STEP_SECONDS)]
            trial.proc = self.spawn(command, env, f"submit-{trial.name}")
            self.trials.append(trial)
            if trial.plan != "left alone":  # a left-alone submitter follows its run into the settle phase
                thread = threading.Thread(target=self.kill_submitter, args=(trial,), daemon=True)
                thread.start()
                killers.append(thread)
            time.sleep(self.submit_rng.uniform(0.5, 3.0))
        for thread in killers:
            thread.join()
        self.submissions_done.set()

    def kill_submitter(self, trial: Trial) -> None:
        proc = trial.proc
        if trial.plan == "start-up":
            time.sleep(trial.rng.uniform(0.1, 1.5))
        elif trial.plan == "run recorded":
            self.wait_for(proc, lambda: self.ledger.run_named(trial.name) is not None, 0.01)
        elif trial.plan == "attempt recorded":
            self.wait_for(proc, lambda: bool(self.ledger.attempts_of_name(trial.name)), 0.01)
        elif trial.plan == "following":
            running = lambda: any(a["state"] == "running" for a in self.ledger.attempts_of_name(trial.name))  # noqa: E731
            if self.wait_for(proc, running, 0.1):
                time.sleep(trial.rng.uniform(0.0, 4.0))
        trial.killed = kill9(proc)
        self.count_kill("submitter", trial.plan, trial.killed)

    def finish_trials(self) -> None:
        """What each submitter printed, and whether one ended by itself badly (a followed run that did not
        complete exits 1; a submitter meant to be killed that exited first must have exited 0 or 1 too)."""
        for trial in self.trials:
            log_name = f"submit-{trial.name}"
            trial.printed_run_id = self.printed_run_id(log_name)
            if trial.proc.poll() is not None:
                self.note_crash(f"submit {trial.name}", trial.proc, log_name, allowed=(0, 1))

    def wait_for(self, proc: subprocess.Popen, condition, every: float, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(every)
        return False

    def printed_run_id(self, log_name: str) -> str | None:
        for line in (self.logs / f"{log_name}.out").read_text(errors="replace").splitlines():
            if RUN_ID.match(line.strip()):
                return line.strip()
        return None

    # -- chaos: preemptions and the live duplicate watch ----------------------------------

    def preempter(self) -> None:
        targets: dict[int, int] = {}  # pid -> the step at which it gets its notice
        limits = {}
        while not self.stop_chaos.is_set():
            names = {r["run_id"]: r["name"] for r in self.ledger.runs()}
            limits.update({t.name: t.max_preemptions for t in self.trials})
            for record in read_records(self.home):
                pid, run_id = record["pid"], record["run_dir"]
                if record["outcome"] is not None or record["resumed_at"] is None or pid in self.tally.preemptions:
                    continue
                target = targets.setdefault(pid, record["resumed_at"] + self.preempt_rng.randint(2, 14))
                if not self.notice_due(record, target):
                    continue
                if self.tally.preemptions_by_run[run_id] >= limits.get(names.get(run_id), 0):
                    continue
                if self.notice_due(json.loads(Path(record["path"]).read_text()), target) and training_alive(pid):
                    os.kill(pid, signal.SIGTERM)
                    with self.tally.lock:
                        self.tally.preemptions[pid] = (run_id, record["attempt_number"], time.time())
                        self.tally.preemptions_by_run[run_id] += 1
            self.stop_chaos.wait(0.15)

    @staticmethod
    def notice_due(record: dict, target: int) -> bool:
        """Past its random target step, and far enough from the end that the notice arrives before `finish()`
        (a SIGTERM after it would kill a script that did complete: the bench's fault, not a misreading)."""
        last = record["last_step"]
        return record["outcome"] is None and last is not None and last >= target and record["steps"] - 1 - last >= 8

    def watch_duplicates(self) -> None:
        while not self.stop_watch.is_set():
            for row in self.ledger.unfinished_together():
                with self.tally.lock:
                    self.tally.live_duplicates[row["run_id"]] = row["n"]
            self.stop_watch.wait(0.3)

    # -- the phases --------------------------------------------------------------------------

    def chaos(self) -> float:
        started = time.monotonic()
        trials = self.args.trials or max(12, self.args.kills // 3)
        threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in (
            (self.supervisors, ()), (self.submitters, (trials,)), (self.preempter, ()),
        )]
        watcher = threading.Thread(target=self.watch_duplicates, daemon=True)
        watcher.start()
        for thread in threads:
            thread.start()
        deadline = started + self.args.chaos_timeout
        while time.monotonic() < deadline:
            if self.submissions_done.is_set() and self.kills_delivered() >= self.args.kills:
                break
            time.sleep(0.2)
        self.stop_chaos.set()
        for thread in threads:
            thread.join()
        self.watcher = watcher
        return time.monotonic() - started

    def settle(self) -> tuple[float, bool]:
        """One healthy supervisor until every run is terminal and nothing of the bench still runs."""
        started = time.monotonic()
        self.healthy = self.start_supervisor("healthy")
        self.healthy_log = f"supervisor-{self.supervisor_count}-healthy"
        deadline = started + self.args.settle_timeout
        settled = False
        while time.monotonic() < deadline:
            submitters_alive = any(t.proc is not None and t.proc.poll() is None for t in self.trials)
            runs_open = any(r["state"] not in TERMINAL for r in self.ledger.runs())
            training = any(r["outcome"] is None and training_alive(r["pid"]) for r in read_records(self.home))
            if self.healthy.poll() is not None:
                break
            if not (submitters_alive or runs_open or training):
                settled = True
                break
            time.sleep(1.0)
        self.stop_watch.set()
        self.watcher.join()
        return time.monotonic() - started, settled

    def cleanup(self) -> None:
        if self.healthy is None:
            pass  # the chaos phase failed before settling
        elif self.healthy.poll() is None:
            self.healthy.send_signal(signal.SIGTERM)
            try:
                self.healthy.wait(15)
            except subprocess.TimeoutExpired:
                kill9(self.healthy)
        else:
            self.note_crash("the healthy supervisor", self.healthy, self.healthy_log, allowed=())
        for trial in self.trials:
            if trial.proc is not None and trial.proc.poll() is None:
                kill9(trial.proc)
        for record in read_records(self.home):
            if training_alive(record["pid"]):
                try:
                    os.killpg(os.getpgid(record["pid"]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.ledger.dispose()


def judge(bench: Bench) -> tuple[Counter, list[str], dict]:
    """Count each category from the ledger and the training processes' own records."""
    counts: Counter = Counter()
    failures: list[str] = []
    info: dict = {}
    ledger_runs = {r["run_id"]: r for r in bench.ledger.runs()}
    by_name = {r["name"]: r for r in ledger_runs.values()}
    all_attempts = bench.ledger.attempts()
    records = read_records(bench.home)
    of_run: dict[str, list[dict]] = defaultdict(list)
    for attempt in all_attempts:
        of_run[attempt["run_id"]].append(attempt)
    recs: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for record in records:
        recs[(record["run_dir"], record["dir_attempt"])].append(record)
    trials = {t.name: t for t in bench.trials}
    info["recorded"] = sum(1 for t in bench.trials if t.name in by_name)
    info["retries"] = sum(1 for a in all_attempts if a["attempt_number"] > 1)
    info["reasons"] = Counter(a["termination_reason"] or f"({a['state']})" for a in all_attempts)
    info["run states"] = Counter(r["state"] for r in ledger_runs.values())

    def fail(category: str, message: str) -> None:
        counts[category] += 1
        failures.append(f"{category}: {message}")

    for trial in bench.trials:
        if trial.printed_run_id and trial.printed_run_id not in ledger_runs:
            fail("lost", f"{trial.name}: its submitter printed {trial.printed_run_id}, which the ledger does not hold")

    for run_id, run in sorted(ledger_runs.items()):
        trial = trials.get(run["name"])
        tries = of_run.get(run_id, [])
        if trial is None:
            failures.append(f"note: run {run_id} ({run['name']!r}) was not submitted by this bench")
            continue
        label = f"{run_id} ({trial.name})"
        # Duplicates: numbers, processes per attempt, processes alive at once, the live watch.
        numbers = Counter(a["attempt_number"] for a in tries)
        for number, n in numbers.items():
            if n > 1:
                fail("duplicated", f"{label}: {n} attempts numbered {number}")
        lifetimes = []
        for number in numbers:
            started = recs.get((run_id, number), [])
            if len(started) > 1:
                fail("duplicated", f"{label}/{number}: launched as {len(started)} processes "
                                   f"(pids {', '.join(str(r['pid']) for r in started)})")
            for record in started:
                # A process that died without an end was last seen alive at its record's last write.
                end = record["ended"] or (time.time() if training_alive(record["pid"]) else record["last_seen"])
                lifetimes.append((record["started"], end, number, record["pid"]))
        lifetimes.sort()
        for (s1, e1, n1, p1), (s2, e2, n2, p2) in zip(lifetimes, lifetimes[1:]):
            if s2 < e1 and n1 != n2:
                fail("duplicated", f"{label}: attempts {n1} (pid {p1}) and {n2} (pid {p2}) trained at the same time")
        if run_id in bench.tally.live_duplicates:
            fail("duplicated", f"{label}: {bench.tally.live_duplicates[run_id]} unfinished attempts at once in the ledger")

        if not tries:
            fail("lost", f"{label}: {run['state']} with no attempt at all")
            continue
        alive = [r for n in numbers for r in recs.get((run_id, n), []) if training_alive(r["pid"])]
        if run["state"] not in TERMINAL:
            if alive:
                fail("unsettled", f"{label}: still {run['state']} with pid {alive[0]['pid']} training at the timeout")
            else:
                states = ", ".join(f"{a['attempt_number']}:{a['state']}" for a in tries)
                fail("stuck", f"{label}: left {run['state']} with no live process (attempts {states})")

        last = tries[-1]
        # An attempt of a run still open is not judged "not retried": the run is stuck or unsettled.
        retried_or_ended = run["state"] in TERMINAL
        for attempt in tries:
            judge_attempt(bench, label, attempt, attempt is last, retried_or_ended,
                          recs.get((run_id, attempt["attempt_number"]), []), trial, fail)
        if run["state"] in ("failed", "cancelled"):
            decision = json.loads(last["retry_decision"]) if last["retry_decision"] else {}
            spent = decision.get("action") == "stop" and "budget" in str(decision.get("rule", ""))
            if spent:
                counts["failed, budget spent"] += 1
            else:
                fail("lost", f"{label}: ended {run['state']} after {last['termination_reason']} "
                             f"with decision {decision or 'none'}: it should have gone on")
    return counts, failures, info


def judge_attempt(bench: Bench, label: str, attempt: dict, is_last: bool, run_ended: bool, started: list[dict],
                  trial: Trial, fail) -> None:
    """One attempt: the environment its processes saw, and its reason against what its process did."""
    where = f"{label}/{attempt['attempt_number']}"
    reason = attempt["termination_reason"]
    decision = json.loads(attempt["retry_decision"]) if attempt["retry_decision"] else {}
    budget_spent = decision.get("action") == "stop" and "budget" in str(decision.get("rule", ""))
    last_of_ended_run = is_last and run_ended
    for record in started:
        seen = record["seen"]
        wrong = []
        if seen["token"] != trial.token:
            wrong.append(f"KILLBENCH_TOKEN={seen['token']!r}")
        if seen["steps"] != str(trial.steps):
            wrong.append(f"KILLBENCH_STEPS={seen['steps']!r} (submitted {trial.steps})")
        if seen["launcher_only"] is not None:
            wrong.append(f"the launcher's KILLBENCH_LAUNCHER_ONLY={seen['launcher_only']!r}")
        trained_to = record["last_step"] if record["last_step"] is not None else (record["resumed_at"] or 0) - 1
        if record["outcome"] == "completed" and trained_to != trial.steps - 1:
            wrong.append(f"completed at step {trained_to + 1} of the submitted {trial.steps}")
        if wrong:
            fail("different environment", f"{where} (pid {record['pid']}) ran with {'; '.join(wrong)}")
    if attempt["state"] != "ended":
        return  # the run is stuck or unsettled: counted there
    if not started:
        # No process ever ran: the launch was interrupted before the executor took it.
        evidence = attempt["termination_evidence"] or ""
        if reason != "infra_transient" or "launch" not in evidence:
            fail("wrongly classified", f"{where}: never started a process, ended {reason} ({evidence[:160]})")
        elif not (decision.get("action") == "resume" or budget_spent) or (last_of_ended_run and not budget_spent):
            fail("wrongly classified", f"{where}: interrupted launch not retried (decision {decision})")
        return
    outcome = started[-1]["outcome"]
    if outcome is None:
        fail("wrongly classified", f"{where}: its process died without ending on its own (pid {started[-1]['pid']}); "
                                   f"recorded {reason}")
        return
    if outcome == "preempted":
        if started[-1]["pid"] not in bench.tally.preemptions:
            fail("wrongly classified", f"{where}: exited preempted without a notice from the bench")
        if reason != "preempted":
            fail("wrongly classified", f"{where}: got a preemption notice and checkpointed, recorded {reason}")
        elif not (decision.get("action") == "resume" or budget_spent) or (last_of_ended_run and not budget_spent):
            fail("wrongly classified", f"{where}: preempted but not retried (decision {decision})")
    elif outcome == "completed":
        if reason != "completed":
            fail("wrongly classified", f"{where}: trained to the end, recorded {reason}")
        elif not is_last:
            fail("duplicated", f"{where}: completed, yet the run has a later attempt")


@contextmanager
def database(url: str | None):
    """The ledger URL: a fresh SQLite file, or a fresh PostgreSQL database on --db's server, dropped afterwards."""
    if url is None:
        yield None
        return
    admin_url = make_url(PG_ADMIN_URL if url == "postgresql" else url)
    if not admin_url.drivername.startswith("postgresql"):
        raise SystemExit(f"--db {url}: expected a PostgreSQL URL (SQLite is the default)")
    name = f"killbench_{os.getpid()}"
    admin = create_engine(admin_url.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="kill -9s to deliver to live processes (default 50)")
    parser.add_argument("--trials", type=int, default=0, help="submits (default: a third of the kills, at least 12)")
    parser.add_argument("--seed", type=int, default=20260909)
    parser.add_argument("--db", default=None, metavar="URL",
                        help="a PostgreSQL server URL (or 'postgresql' for $TRACKWAY_TEST_PG): a fresh database "
                             "killbench_<pid> is created there and dropped afterwards; default a fresh SQLite file")
    parser.add_argument("--chaos-timeout", type=float, default=300.0, help="seconds the kills may take at most")
    parser.add_argument("--settle-timeout", type=float, default=supervisor_loop.STALE_LAUNCH_S + 90.0,
                        help="seconds the healthy supervisor gets to settle everything (default: the "
                             "interrupted-launch cutoff + 90 s, since such launches are only recovered after it)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory for inspection")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="trackway-supervisor-kills-"))
    started = time.perf_counter()
    with database(args.db) as pg_url:
        db_url = pg_url or f"sqlite:///{workdir / 'home' / 'ledger.db'}"
        bench = Bench(args, workdir, db_url)
        init = subprocess.run([sys.executable, "-m", "trackway", "init"], env=bench.base_env, cwd=workdir,
                              capture_output=True, text=True)
        if init.returncode != 0:
            raise SystemExit(f"trackway init failed: {init.stderr.strip()}")
        (workdir / "trackway.toml").write_text(TRACKWAY_TOML)
        print(f"ledger {'PostgreSQL' if pg_url else 'SQLite'}, {args.kills} kills promised, seed {args.seed}; "
              f"working in {workdir}", flush=True)
        try:
            chaos_s = bench.chaos()
            print(f"chaos done after {minutes(chaos_s)}; settling with one healthy supervisor ...", flush=True)
            settle_s, settled = bench.settle()
            bench.finish_trials()
            counts, failures, info = judge(bench)
        finally:
            bench.cleanup()
    elapsed = time.perf_counter() - started

    kills = bench.tally.kills
    delivered = kills["supervisor"] + kills["submitter"]
    plans = lambda target: ", ".join(f"{k.split(': ', 1)[1]} {v}" for k, v in sorted(kills.items())  # noqa: E731
                                     if k.startswith(f"{target}: "))
    trials = bench.trials
    attempts_n = sum(info["reasons"].values())
    categories = ("lost", "duplicated", "stuck", "wrongly classified", "different environment")
    rows = [
        ("kills delivered", f"{delivered}  (target ≥ {args.kills}; {bench.tally.missed_kills} more found the process gone)"),
        ("  supervisor", f"{kills['supervisor']}  ({plans('supervisor')})"),
        ("  submitter", f"{kills['submitter']}  ({plans('submitter')})"),
        ("preemptions sent", f"{len(bench.tally.preemptions)}  (SIGTERM to a training process)"),
        ("trials (submits)", f"{len(trials)}  ({sum(t.killed for t in trials)} killed, "
                             f"{sum(t.plan == 'left alone' for t in trials)} left to follow their run)"),
        ("runs recorded", f"{info['recorded']}  ({len(trials) - info['recorded']} submitters died before recording; "
                          + ", ".join(f"{k} {v}" for k, v in sorted(info['run states'].items())) + ")"),
        ("attempts", f"{attempts_n}  ({info['retries']} of them retries; " + ", ".join(f"{k} {v}" for k, v in sorted(info['reasons'].items())) + ")"),
        ("failed, budget spent", f"{counts['failed, budget spent']}  (legitimate, not counted as lost)"),
    ]
    rows += [(name, f"{counts[name]}  (target 0)") for name in categories]
    if counts["unsettled"]:
        rows.append(("unsettled", f"{counts['unsettled']}  (still training at the settle timeout: not judged)"))
    rows.append(("control-plane crashes", f"{len(bench.tally.crashes)}  (exited by themselves, not killed; target 0)"))
    rows.append(("wall time", f"{minutes(elapsed)}  (chaos {minutes(chaos_s)}, settle {minutes(settle_s)}"
                              f"{'' if settled else ', TIMED OUT'})"))
    for name, value in rows:
        print(f"{name:<24} {value}")
    for failure in failures[:40]:
        print("FAIL" if not failure.startswith("note:") else "   ", failure)
    if len(failures) > 40:
        print(f"... and {len(failures) - 40} more")
    for crash in bench.tally.crashes[:10]:
        print("CRASH", crash)

    # The same verdicts as figures, for `make bench`'s one table.
    figure("kill -9 of supervise / submit: kills that landed", delivered, unit="kills", target=args.kills,
           higher_is_better=True)
    for name in categories:
        figure(f"kill -9 of supervise / submit: {name} runs", counts[name], unit="runs", target=0)
    figure("kill -9 of supervise / submit: control-plane crashes", len(bench.tally.crashes), unit="crashes", target=0)
    ok = (delivered >= args.kills and all(counts[c] == 0 for c in categories)
          and not counts["unsettled"] and not bench.tally.crashes and settled)
    if args.keep or not ok:
        print(f"working directory kept: {workdir}" + (" (the PostgreSQL database was dropped)" if args.db else ""))
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
