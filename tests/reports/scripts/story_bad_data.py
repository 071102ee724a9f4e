"""Bad data: reads every JSONL file of the data directory given; a record without 'text' is declared bad."""

import json
import sys
from pathlib import Path

import trackway

run = trackway.init(checkpoint_every_steps=5)
records = [(path.name, number, line) for path in sorted(Path(sys.argv[1]).glob("*.jsonl"))
           for number, line in enumerate(path.read_text().splitlines(), 1)]
for step, (name, number, line) in enumerate(records):
    record = json.loads(line)
    if "text" not in record:
        raise trackway.BadData(f"{name} line {number}: no 'text' field (keys: {sorted(record)})")
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    if run.checkpoints.due(step) and step > 0:
        with run.checkpoints.writing(step) as directory:
            (directory / "step.txt").write_text(str(step))
run.finish()
