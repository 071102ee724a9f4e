"""The scoring phase: read the committed inference outputs, ask the local judge, write the evaluator contract's lines.

--crash-attempts N: crash the first N attempts (after reading the outputs); --unreachable-attempts N:
the judge does not answer on the first N attempts (JudgeUnreachable). Every judge answer is kept
in $TRACKWAY_EVAL_JUDGE_ANSWERS.
"""

import argparse
import json
import os
import subprocess
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--crash-attempts", type=int, default=0)
parser.add_argument("--unreachable-attempts", type=int, default=0)
args = parser.parse_args()
attempt = int(os.environ["TRACKWAY_ATTEMPT_NUMBER"])
outputs = Path(os.environ["TRACKWAY_EVAL_INFERENCE_OUTPUTS"]) / "outputs.jsonl"
lines = [json.loads(line) for line in outputs.read_text().splitlines() if line.strip()]
if attempt <= args.crash_attempts:
    raise RuntimeError("scorer bug: KeyError in the metric code (simulated)")


class JudgeUnreachable(ConnectionError):
    pass


if attempt <= args.unreachable_attempts:
    raise JudgeUnreachable("judge at http://judge.internal:8000 did not answer (simulated)")
judge = json.loads(os.environ["TRACKWAY_EVAL_JUDGE"])
rubric = Path(os.environ["TRACKWAY_EVAL_JUDGE_RUBRIC"]).read_text()
requests = "".join(json.dumps({"output": r["output"], "answer": r["answer"], "rubric": rubric}) + "\n" for r in lines)
verdicts = subprocess.run(judge["command"], input=requests, capture_output=True, text=True, check=True).stdout
with open(os.environ["TRACKWAY_EVAL_JUDGE_ANSWERS"], "w") as answers, open(os.environ["TRACKWAY_EVAL_OUTPUT"], "w") as out:
    for record, verdict in zip(lines, verdicts.splitlines()):
        answers.write(verdict + "\n")
        correct = json.loads(verdict)["correct"]
        out.write(json.dumps({"task_id": record["task_id"], "sample": record["sample"], "correct": correct,
                              "output": record["output"]}) + "\n")
