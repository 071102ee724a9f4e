"""The inference phase: ask the model server ($TRACKWAY_EVAL_SERVER_URL) for every task's samples.

Writes outputs.jsonl into $TRACKWAY_EVAL_OUTPUTS_DIR and appends one line per run to --log, so a
test can count how often inference ran.
"""

import argparse
import json
import os
import urllib.request
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
args = parser.parse_args()
seed = int(os.environ["TRACKWAY_EVAL_SEED"])
samples = int(json.loads(os.environ["TRACKWAY_EVAL_DECODING"]).get("samples", 1))
url = os.environ["TRACKWAY_EVAL_SERVER_URL"] + "/generate"
tasks = [json.loads(line) for line in Path(os.environ["TRACKWAY_EVAL_TASKS"]).read_text().splitlines() if line.strip()]
with open(args.log, "a") as log:
    log.write(f"seed {seed} attempt {os.environ['TRACKWAY_ATTEMPT_NUMBER']} run {os.environ['TRACKWAY_RUN_ID']}\n")
with open(Path(os.environ["TRACKWAY_EVAL_OUTPUTS_DIR"]) / "outputs.jsonl", "w") as out:
    for task in tasks:
        for sample in range(samples):
            body = json.dumps({**task, "sample": sample, "seed": seed}).encode()
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                output = json.loads(response.read())["output"]
            out.write(json.dumps({"task_id": task["task_id"], "sample": sample, "answer": task["answer"],
                                  "output": output}) + "\n")
