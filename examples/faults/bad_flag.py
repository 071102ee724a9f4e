"""Config error: an unchanged argparse script given a flag it does not know (`--lrr`), before its first step."""

import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args(sys.argv[1:] or ["--lrr", "0.1"])  # the typo is the fault
for step in range(args.steps):
    print(f"step {step}: loss {1.0 / (step + 1):.4f}", flush=True)
