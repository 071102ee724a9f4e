"""A script without the SDK that saves one file per checkpoint, numbered by its own step: ckpts/step_N.pt.

It prints `iter N: loss X`, saves every 10 steps, and resumes from the file given as its first
argument (the first line of a checkpoint file is its step). On attempt 1 it starts a save of step
35 (a torn file: it never finishes it), then is SIGTERMed, as by a reclaimed host.
"""

import os
import signal
import sys
import time

os.makedirs("ckpts", exist_ok=True)
resume = sys.argv[1] if len(sys.argv) > 1 else None
start = 0
if resume:
    with open(resume) as f:
        start = int(f.readline()) + 1
    print(f"resuming from {resume} at {start}", flush=True)
else:
    print("from scratch", flush=True)
for step in range(start, 60):
    print(f"iter {step}: loss {1 / (step + 1):.4f}", flush=True)
    time.sleep(0.05)
    if step % 10 == 0 and step > 0:
        with open(f"ckpts/step_{step}.pt", "w") as f:
            f.write(f"{step}\n" + "w" * 1000)
    if step == 35 and os.environ.get("TRACKWAY_ATTEMPT_NUMBER") == "1":
        with open("ckpts/step_35.pt", "w") as f:
            f.write("35\n" + "w" * 10)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
