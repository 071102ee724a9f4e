"""A deterministic stand-in evaluator that honours trackway's evaluator contract.

It reads the step a `neutral.py` checkpoint holds (counter.txt) and answers each task correctly
with a probability that grows with the step, decided by a hash of (task, sample, seed), so the
same checkpoint and seed always give the same outputs.

Faults for tests: --crash-attempts N crashes the first N attempts (after writing a few lines),
--bad-output writes a line that breaks the contract, --version-tag is printed (edit it to change
the evaluator's code hash).
"""

import argparse
import hashlib
import json
import os
from pathlib import Path

VERSION_TAG = "v1"

parser = argparse.ArgumentParser()
parser.add_argument("--crash-attempts", type=int, default=0)
parser.add_argument("--bad-output", action="store_true")
parser.add_argument("--skill-steps", type=float, default=50.0)
args = parser.parse_args()

checkpoint = Path(os.environ["TRACKWAY_CHECKPOINT"])
step = int((checkpoint / "counter.txt").read_text())
params = json.loads(Path(os.environ["TRACKWAY_EVAL_PARAMS"]).read_text())
assert params["seed"] == int(os.environ["TRACKWAY_EVAL_SEED"])
decoding = json.loads(os.environ["TRACKWAY_EVAL_DECODING"])
samples = int(decoding.get("samples", 1))
seed = int(os.environ["TRACKWAY_EVAL_SEED"])
skill = min(1.0, step / args.skill_steps)
tasks = [json.loads(line) for line in Path(os.environ["TRACKWAY_EVAL_TASKS"]).read_text().splitlines() if line.strip()]
attempt = int(os.environ["TRACKWAY_ATTEMPT_NUMBER"])
print(f"evaluator {VERSION_TAG}: step {step} seed {seed} skill {skill:.2f} attempt {attempt}", flush=True)
with open(os.environ["TRACKWAY_EVAL_OUTPUT"], "w") as out:
    for i, task in enumerate(tasks):
        if attempt <= args.crash_attempts and i == 2:
            out.flush()
            raise RuntimeError("NCCL all_gather failed in the evaluator (simulated)")
        for sample in range(samples):
            draw = int(hashlib.sha256(f"{task['task_id']}/{sample}/{seed}".encode()).hexdigest()[:8], 16) / 2**32
            correct = draw < skill
            out.write(json.dumps({"task_id": task["task_id"], "sample": sample, "correct": correct,
                                  "output": task["answer"] if correct else "??", "prompt": task["prompt"]}) + "\n")
    if args.bad_output:
        out.write(json.dumps({"task_id": "t0", "sample": 0}) + "\n")
