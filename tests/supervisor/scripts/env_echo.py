"""Trains for $KB_STEPS steps and writes what it saw of its environment beside its spool.

On attempt 1 it sends itself a real preemption notice at step 5, checkpoints and exits
preempted, so that the supervisor has a retry to launch.
"""

import json
import os
import signal
from pathlib import Path

import trackway

attempt = int(os.environ["TRACKWAY_ATTEMPT_NUMBER"])
steps = int(os.environ.get("KB_STEPS", "10"))
seen = {name: os.environ.get(name) for name in ("KB_FOO", "KB_STEPS", "HF_TOKEN", "KB_LAUNCHER_ONLY")}
(Path(os.environ["TRACKWAY_SPOOL_DIR"]).parent / "seen-env.json").write_text(json.dumps(seen))

run = trackway.init()
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest is not None else 0
for step in range(start, steps):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if attempt == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    if run.should_stop:
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
        run.exit_preempted()
run.finish()
