"""A real, tiny PyTorch training script: a character-level GRU language model on a text corpus, on CPU.

Under trackway it reads its config from $TRACKWAY_CONFIG (the snapshot the receipt hashed);
alone it takes --config. The corpus comes from --data-file or the config's `data.path`.
It logs through the trackway SDK, checkpoints every `train.checkpoint_every` steps, resumes
from the latest committed checkpoint (model, optimizer, RNG states and the data order), and
on a preemption notice (SIGTERM) checkpoints and exits as preempted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

import torch
from torch import nn

import trackway

DEFAULTS = {
    "model": {"embed": 32, "hidden": 128},
    "train": {
        "steps": 400, "batch_size": 64, "seq_len": 48, "lr": 3e-3, "seed": 0, "log_every": 50, "checkpoint_every": 50,
    },
}


class CharLM(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


def load_config(path: str | None) -> dict:
    config = json.loads(json.dumps(DEFAULTS))
    source = path or os.environ.get("TRACKWAY_CONFIG")
    if source:
        text = Path(source).read_text()
        loaded = tomllib.loads(text) if source.endswith(".toml") else json.loads(text)
        for section, values in loaded.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:
                config[section] = values
    return config


def batches(data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
        x = torch.stack([data[s : s + seq_len] for s in starts])
        y = torch.stack([data[s + 1 : s + seq_len + 1] for s in starts])
        yield x, y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="TOML or JSON config (default: $TRACKWAY_CONFIG)")
    parser.add_argument("--data-file", help="the training corpus (default: the config's data.path)")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="sleep this long after each step, standing in for a bigger model (demos, tests)")
    args = parser.parse_args()
    config = load_config(args.config)
    train, model_cfg = config["train"], config["model"]
    data_file = args.data_file or config.get("data", {}).get("path")
    if not data_file:
        print("no corpus: pass --data-file or set data.path in the config", file=sys.stderr)
        return 2
    text = Path(data_file).read_text()
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)

    torch.manual_seed(train["seed"])
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(train["seed"])
    model = CharLM(len(vocab), model_cfg["embed"], model_cfg["hidden"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=train["lr"])
    loss_fn = nn.CrossEntropyLoss()

    run = trackway.init(config=config, checkpoint_every_steps=train["checkpoint_every"])
    restored = run.checkpoints.restore_latest(model=model, optimizer=optimizer)
    start = 1
    if restored is not None:
        generator.set_state(restored.data_state["generator"])
        start = restored.step + 1
        print(f"resumed from step {restored.step}", flush=True)
    stream = batches(data, train["batch_size"], train["seq_len"], generator)
    print(f"training CharLM vocab={len(vocab)} params={sum(p.numel() for p in model.parameters())} "
          f"steps {start}..{train['steps']} corpus={data_file} ({len(text)} chars)", flush=True)
    started = time.time()
    loss_value = math.nan
    for step in range(start, train["steps"] + 1):
        x, y = next(stream)
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, len(vocab)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if args.step_delay:
            time.sleep(args.step_delay)
        run.log({"loss": loss_value, "lr": optimizer.param_groups[0]["lr"]}, step=step)
        if step % train["log_every"] == 0 or step == train["steps"]:
            print(f"step {step} loss {loss_value:.4f} ({time.time() - started:.1f}s)", flush=True)
        if run.checkpoints.due(step) or run.should_stop or step == train["steps"]:
            run.checkpoints.save(
                step, model=model, optimizer=optimizer,
                data_state={"generator": generator.get_state()}, metrics={"loss": loss_value},
            )
        if run.should_stop:
            print(f"preemption notice at step {step}: checkpointed, exiting", flush=True)
            run.exit_preempted()
    print(f"final loss {loss_value:.4f}", flush=True)
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
