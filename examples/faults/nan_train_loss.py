"""NaN under another loss name: `train/loss` (Lightning/W&B naming) diverges at step 6."""

import trackway

run = trackway.init()
for step in range(12):
    loss = float("nan") if step == 6 else 1.0 / (step + 1)
    run.log({"train/loss": loss, "lr": 0.1}, step=step)
run.finish()
