"""Config error: a nanoGPT-style configurator refuses an override key before the first step.

nanoGPT's configurator.py raises `ValueError(f"Unknown config key: {key}")` for `--lrr=0.1`; this
script does the same, without the SDK, as an unchanged script would.
"""

import sys

config = {"learning_rate": 6e-4, "max_iters": 10, "batch_size": 12}
overrides = sys.argv[1:] or ["--lrr=0.1"]  # the typo is the fault
for arg in overrides:
    key, value = arg.removeprefix("--").split("=", 1)
    if key not in config:
        raise ValueError(f"Unknown config key: {key}")
    config[key] = type(config[key])(value)
for it in range(config["max_iters"]):
    print(f"iter {it}: loss {1.0 / (it + 1):.4f}", flush=True)
