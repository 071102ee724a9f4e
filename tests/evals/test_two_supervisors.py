"""Two supervisors on one PostgreSQL ledger trigger, launch and retry each evaluation exactly once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from trackway.ledger import open_ledger
from trackway.ledger.schema import attempts, evaluation_seeds, evaluations, runs

NEUTRAL = str(Path(__file__).resolve().parents[1] / "cli" / "scripts" / "neutral.py")
TRAINING_RUNS = 3


def _supervisor() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trackway", "supervise", "--interval", "0.05"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def test_two_supervisors_evaluate_each_checkpoint_once(home, pg_url, monkeypatch, write_spec):
    monkeypatch.setenv("TRACKWAY_DB", pg_url)
    spec = write_spec("toy", ["--crash-attempts", "1"])
    supervisors = [_supervisor(), _supervisor()]
    ledger = open_ledger(pg_url)
    try:
        for i in range(TRAINING_RUNS):
            done = subprocess.run(
                [sys.executable, "-m", "trackway", "submit", "--detach", "--name", f"job{i}", "--eval", str(spec),
                 "--", sys.executable, NEUTRAL, "40"],
                capture_output=True, text=True, timeout=120,
            )
            assert done.returncode == 0, done.stderr
        deadline = time.time() + 180
        while time.time() < deadline:
            with ledger.read() as conn:
                states = list(conn.execute(select(evaluations.c.state)).scalars())
            if len(states) == 3 * TRAINING_RUNS and all(s != "running" for s in states):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"evaluations did not finish: {states}")
    finally:
        for s in supervisors:
            s.terminate()
            s.wait(10)
    with ledger.read() as conn:
        per_checkpoint = conn.execute(
            select(evaluations.c.run_id, evaluations.c.checkpoint_step, func.count())
            .group_by(evaluations.c.run_id, evaluations.c.checkpoint_step)
        ).all()
        seeds_per_eval = dict(conn.execute(
            select(evaluation_seeds.c.eval_id, func.count()).group_by(evaluation_seeds.c.eval_id)).all())
        eval_runs = conn.execute(select(func.count()).where(runs.c.kind == "eval")).scalar_one()
        reasons_per_run = {}
        for run_id, reason in conn.execute(
            select(attempts.c.run_id, attempts.c.termination_reason)
            .join(runs, runs.c.run_id == attempts.c.run_id)
            .where(runs.c.kind == "eval")
            .order_by(attempts.c.run_id, attempts.c.attempt_number)
        ):
            reasons_per_run.setdefault(run_id, []).append(reason)
        training = list(conn.execute(select(runs.c.state).where(runs.c.kind != "eval")).scalars())
    ledger.dispose()
    assert len(per_checkpoint) == 3 * TRAINING_RUNS and all(count == 1 for *_, count in per_checkpoint)
    assert sorted(seeds_per_eval.values()) == [2] * (3 * TRAINING_RUNS)
    assert eval_runs == 2 * 3 * TRAINING_RUNS  # no duplicate seed run
    # Each seed crashed once and was retried once: no double launch, no lost retry.
    assert all(reasons == ["evaluator_crash", "completed"] for reasons in reasons_per_run.values()), reasons_per_run
    assert training == ["completed"] * TRAINING_RUNS
