"""A missing import met mid-training (a lazily imported kernel): an uncaught exception after progress."""

import trackway

run = trackway.init(checkpoint_every_steps=5)
for step in range(10):
    if step == 3:
        import flash_attn_kernels_v9  # noqa: F401  (not installed: the bug being explained)
    run.log({"loss": 1.0 / (step + 1)}, step=step)
run.finish()
