"""An evaluator shaped like lm-evaluation-harness: bundled tasks, per-sample lines with doc_id/acc/filtered_resps.

It reads the model config the checkpoint was trained with from $TRACKWAY_RUN_CONFIG (and fails
without it), scores 10 bundled docs by the step a `neutral.py` checkpoint holds, and writes one
line per doc. --bad-line N writes `acc: "yes"` on line N instead.
"""

import argparse
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--bad-line", type=int, default=0)
args = parser.parse_args()

config = json.loads(Path(os.environ["TRACKWAY_RUN_CONFIG"]).read_text())
width = config["model"]["width"]  # what a real harness needs to build the model before loading weights
assert "TRACKWAY_EVAL_TASKS" not in os.environ, "no task_set in the spec: the tasks are bundled"
step = int((Path(os.environ["TRACKWAY_CHECKPOINT"]) / "counter.txt").read_text())
print(f"lm-eval-style: width {width} step {step}", flush=True)
with open(os.environ["TRACKWAY_EVAL_OUTPUT"], "w") as out:
    for doc_id in range(10):
        acc = 1.0 if doc_id < step // 5 else 0.0
        line = {"doc_id": doc_id, "target": str(doc_id), "filtered_resps": [str(doc_id) if acc else "?"], "acc": acc}
        if doc_id + 1 == args.bad_line:
            line["acc"] = "yes"
        out.write(json.dumps(line) + "\n")
