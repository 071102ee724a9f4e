"""A training-loop stand-in driven by the SDK tests: `python sdk_script.py MODE [STEPS]`.

Modes: ok, preempt (waits for SIGTERM, then exits preempted), bad_data, oom, nan, nan_tensor, code_error.
"""

import os
import sys
import time

import trackway

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
run = trackway.init(config={"mode": mode, "steps": steps}, name=os.environ.get("SDK_RUN_NAME"))
print("ready", run.run_id, run.attempt_id, flush=True)
for step in range(steps):
    loss = 1.0 / (step + 1)
    if mode == "nan" and step == 7:
        loss = float("nan")
    if mode == "nan_tensor" and step == 7:
        import torch

        loss = torch.tensor(float("inf"))
    run.log({"loss": loss, "lr": 0.1, "grad_norm": 2.0, "tokens_per_s": 1000.0 + step, "epoch": 0}, step=step)
    if mode == "bad_data" and step == 3:
        raise trackway.BadData("shard 3: field 'text' missing")
    if mode == "oom" and step == 11:

        class OutOfMemoryError(RuntimeError):  # what torch.cuda.OutOfMemoryError is called
            pass

        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if mode == "code_error" and step == 2:
        {}["missing"]
    if mode == "preempt":
        if step == 5:
            open(os.environ["SDK_READY_FILE"], "w").close()
        waited = 0.0
        while step >= 5 and not run.should_stop:
            time.sleep(0.01)
            waited += 0.01
            if waited > 60:  # nobody sent the notice: do not linger after a failed test
                raise SystemExit(3)
        if run.should_stop:
            run.exit_preempted()
if mode == "nan_tensor":
    time.sleep(1)
    run.log({"loss": 0.5}, step=steps)
run.finish()
