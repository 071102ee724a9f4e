"""A training script written the way nanoGPT's train.py is, knowing nothing of trackway.

No `import trackway`: it prints `iter N: loss X, time Yms`, saves `OUT_DIR/ckpt.pt` in place every
`--ckpt-every` iterations (torch.save of a tiny model, its optimizer and `iter_num`), and resumes from
that file when it exists (nanoGPT's `init_from='resume'`). It has no SIGTERM handler: a SIGTERM kills
it (exit -15), whatever it was doing. `--nan-from N` makes it print `loss nan` from iteration N on
and carry on to a normal exit 0, as a diverged nanoGPT does.

Under trackway, with nothing changed in the script:

    trackway submit --metric-pattern 'iter (?P<step>\\d+): loss (?P<loss>\\S+)' \\
        --checkpoint-path out/ckpt.pt -- python examples/nanogpt_style.py

records its losses, commits out/ckpt.pt once complete, puts the last committed one back before a
retry, and ends the attempt `nan_loss` when a `loss nan` is printed. `--resume-from PATH` (e.g.
`--resume-from={resume_from}` in the submitted command) resumes from PATH instead of OUT_DIR/ckpt.pt.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="out")
    parser.add_argument("--max-iters", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds per iteration (a GPU step's stand-in)")
    parser.add_argument("--nan-from", type=int, default=None, help="print `loss nan` from this iteration on")
    parser.add_argument("--init-from", choices=("auto", "scratch", "resume"), default="auto",
                        help="auto: resume when the checkpoint file exists")
    parser.add_argument("--resume-from", default=None, help="the checkpoint file to resume from")
    args = parser.parse_args()

    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt_path = args.resume_from or os.path.join(args.out_dir, "ckpt.pt")
    iter_num = 0
    if args.init_from == "resume" or (args.init_from == "auto" and os.path.exists(ckpt_path)):
        print(f"Resuming training from {ckpt_path}", flush=True)
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = int(checkpoint["iter_num"]) + 1
    else:
        print("Initializing a new model from scratch", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    generator = torch.Generator().manual_seed(iter_num)
    while iter_num <= args.max_iters:
        t0 = time.time()
        x = torch.randn(32, 8, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(args.delay)
        shown = math.nan if args.nan_from is not None and iter_num >= args.nan_from else loss.item()
        print(f"iter {iter_num}: loss {shown:.4f}, time {(time.time() - t0) * 1000:.1f}ms", flush=True)
        if iter_num > 0 and iter_num % args.ckpt_every == 0:
            checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
            print(f"saving checkpoint to {args.out_dir}", flush=True)
            torch.save(checkpoint, os.path.join(args.out_dir, "ckpt.pt"))  # in place, as nanoGPT does
        iter_num += 1


if __name__ == "__main__":
    main()
