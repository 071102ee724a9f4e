"""A tiny torch training run through the SDK: restore_latest, log, save every 10 steps, fail or stop on cue.

`python sdk_resume.py STEPS [--fail-at S] [--stop-at S] [--big-at S]`

Prints `restored NAME` (or `restored None`) once restore_latest returned.
--fail-at: on attempt 1, raise after step S (and its save, if due).
--stop-at: on attempts after the first, finish after step S.
--big-at: on attempt 1, the save of step S carries 6 MiB more state (to fill a small disk).
"""

import argparse
import os

import torch

import trackway

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--fail-at", type=int)
parser.add_argument("--stop-at", type=int)
parser.add_argument("--big-at", type=int)
args = parser.parse_args()
attempt = int(os.environ["TRACKWAY_ATTEMPT_NUMBER"])

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
run = trackway.init(checkpoint_every_steps=10)
restored = run.checkpoints.restore_latest(model=model, optimizer=optimizer)
print(f"restored {restored.info.name if restored else None}", flush=True)
start = restored.step + 1 if restored else 0
for step in range(start, args.steps):
    loss = (model(torch.ones(8, 4)) - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    run.log({"loss": loss.item()}, step=step)
    if run.checkpoints.due(step):
        big = {"ballast": torch.zeros(6 << 20, dtype=torch.uint8)} if step == args.big_at and attempt == 1 else None
        run.checkpoints.save(step, model=model, optimizer=optimizer, data_state={"step": step}, extra=big)
    if step == args.fail_at and attempt == 1:
        raise RuntimeError(f"flaky node at step {step}")
    if step == args.stop_at and attempt > 1:
        break
run.finish()
