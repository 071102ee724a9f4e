"""The training stand-in of bench_supervisor_kills.py: a tiny SDK loop that writes down what it saw and how it ended.

`python kill_trial_train.py STEP_SECONDS`

It trains $KILLBENCH_STEPS steps (resuming after the latest committed checkpoint), exits preempted
when a SIGTERM arrives and completed otherwise, so the right termination reason of every attempt
is known. Its record, `<attempt state dir>/killbench/<pid>.json`, is rewritten atomically at every
step and holds the run-specific variables it was started with: the bench compares them with what
was submitted. One file per process, so an attempt launched twice leaves two.
"""

import json
import os
import sys
import time
from pathlib import Path

# Read before trackway is imported: the values the process was started with are what is judged.
SEEN = {
    "token": os.environ.get("KILLBENCH_TOKEN"),
    "steps": os.environ.get("KILLBENCH_STEPS"),
    "launcher_only": os.environ.get("KILLBENCH_LAUNCHER_ONLY"),
}
# A retry that lost KILLBENCH_STEPS trains this many instead; the bench sees it as a wrong step count.
FALLBACK_STEPS = 7

import trackway  # noqa: E402

step_seconds = float(sys.argv[1])
steps = int(SEEN["steps"]) if (SEEN["steps"] or "").isdigit() else FALLBACK_STEPS
state_dir = Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent
record_path = state_dir / "killbench" / f"{os.getpid()}.json"
record = {
    "pid": os.getpid(),
    "run_id": os.environ.get("TRACKWAY_RUN_ID"),
    "attempt_id": os.environ.get("TRACKWAY_ATTEMPT_ID"),
    "attempt_number": int(os.environ["TRACKWAY_ATTEMPT_NUMBER"]),
    "seen": SEEN,
    "steps": steps,
    "started": time.time(),
    "resumed_at": None,
    "last_step": None,
    "outcome": None,
    "ended": None,
}


def write_record() -> None:
    # Atomic, because the bench reads it while the process runs and after it was killed.
    tmp = record_path.with_name(f".{record_path.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, record_path)


record_path.parent.mkdir(parents=True, exist_ok=True)
run = trackway.init()  # installs the preemption handlers: the bench preempts only after the first record
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest is not None else 0
record["resumed_at"] = start
write_record()
for step in range(start, steps):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(step_seconds)
    record["last_step"] = step
    if run.should_stop or step % 10 == 9:
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
    if run.should_stop:
        record.update(outcome="preempted", ended=time.time())
        write_record()
        run.exit_preempted()
    write_record()
record.update(outcome="completed", ended=time.time())
write_record()
run.finish()
