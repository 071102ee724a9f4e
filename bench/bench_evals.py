"""What recording one evaluation seed costs the supervisor: reading the evaluator's output and storing its results.

The supervisor reads and stores a seed's output inside its tick, in the transaction that records
the attempt's end, so this is time during which no other attempt is looked at. Target: a
HumanEval-sized seed (164 tasks x 200 samples = 32,800 lines) recorded in ≤ 1 s on SQLite and on
PostgreSQL. Baselines, each timed in alternation with its figure: `json.loads` of every line (the
least a reader can do) for reading, and reading the same output alone for the whole recording.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, interleaved_medians, postgres_database  # noqa: E402

from trackway.checkpoints.store import CheckpointStore  # noqa: E402
from trackway.evals.launch import request_evaluation  # noqa: E402
from trackway.evals.outputs import read_output  # noqa: E402
from trackway.evals.progress import after_eval_attempt  # noqa: E402
from trackway.evals.records import seeds_of  # noqa: E402
from trackway.evals.spec import load_spec  # noqa: E402
from trackway.ledger import open_ledger  # noqa: E402
from trackway.settings import load_settings  # noqa: E402
from trackway.supervisor.submit import RunSpec, submit_run  # noqa: E402
from trackway.taxonomy import TerminationReason  # noqa: E402

TASKS, SAMPLES = 164, 200
TARGET_S = 1.0


def write_output(path: Path, salt: int) -> None:
    with path.open("w") as f:
        for t in range(TASKS):
            for s in range(SAMPLES):
                correct = (t * 7 + s * 13 + salt) % 5 == 0
                f.write(json.dumps({"task_id": f"HumanEval/{t}", "sample": s, "correct": correct,
                                    "output": f"def f():\n    return {t + s + salt}\n"}) + "\n")


def bench_backend(label: str, url: str, work: Path) -> bool:
    os.environ["TRACKWAY_HOME"] = str(work / label)
    settings = load_settings(db=url, cwd=work)
    ledger = open_ledger(url)
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, "-c", "pass"], cwd=work))
    with CheckpointStore(settings.runs_dir / run_id / "checkpoints").begin(100) as pending:
        with pending.open("weights.bin") as f:
            f.write(b"\0" * 1024)
        pending.commit()
    spec_dir = work / f"spec-{label}"
    spec_dir.mkdir()
    (spec_dir / "evaluator.py").write_text("print('stand-in')\n")
    (spec_dir / "tasks.jsonl").write_text("{}\n")
    samples: list[float] = []
    reads: list[float] = []
    for salt in range(5):
        (spec_dir / "spec.toml").write_text(
            f'name = "he"\ncommand = ["python", "evaluator.py"]\ntask_set = "tasks.jsonl"\nseeds = [0]\n'
            f'[decoding]\nsamples = {SAMPLES}\ntemperature = 0.{salt + 1}\n')
        request = request_evaluation(ledger, settings, run_id, 100, load_spec(spec_dir / "spec.toml"))
        with ledger.read() as conn:
            (seed,) = seeds_of(conn, request.eval_id)
        output_path = work / f"out-{label}-{salt}.jsonl"
        write_output(output_path, salt)
        started = time.perf_counter()
        read_output(output_path)
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        output = read_output(output_path)
        with ledger.write() as conn:
            after_eval_attempt(conn, settings, seed["eval_run_id"], TerminationReason.COMPLETED, False, output)
        samples.append(time.perf_counter() - started)
        assert output.ok and output.samples == TASKS * SAMPLES
    ledger.dispose()
    return figure(f"record one seed, {TASKS}x{SAMPLES} samples ({label})", statistics.median(samples),
                  baseline=statistics.median(reads), baseline_name="reading the output alone", target=TARGET_S)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sample_file = work / "sample.jsonl"
        write_output(sample_file, 0)
        lines = sample_file.read_bytes().splitlines()
        times = interleaved_medians({"parse": lambda: [json.loads(line) for line in lines],
                                     "read": lambda: read_output(sample_file)}, repeat=5)
        print(f"{TASKS * SAMPLES} output lines, {len(sample_file.read_bytes()) / 2**20:.1f} MiB")
        figure("read + check the evaluator's output", times["read"], baseline=times["parse"],
               baseline_name="json.loads of every line")
        ok = bench_backend("sqlite", f"sqlite:///{work / 'ledger.db'}", work)
        with postgres_database() as url:
            ok = bench_backend("postgresql", url, work) and ok
    sys.exit(0 if ok else 1)
