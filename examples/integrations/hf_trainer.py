"""A tiny GPT-2 trained by the Hugging Face Trainer under trackway: the integration is one line.

    trackway submit --name hf -- python examples/integrations/hf_trainer.py --output-dir out/hf

The model is built from a config (nothing is downloaded); the data are seeded random tokens.
Under DDP, the same script on every rank:

    trackway submit --name hf2 -- torchrun --standalone --nproc_per_node=2 examples/integrations/hf_trainer.py
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from trackway.integrations.huggingface import TrackwayCallback, resume_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """Prints each step (and optionally waits) so a test can aim a SIGTERM mid-run."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_step_end(self, args, state, control, **kwargs):
        print(f"step {state.global_step}", flush=True)
        time.sleep(self.delay)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", default="out/hf")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--linger", type=float, default=0.0, help="seconds to stay after training (a pod not yet deleted)")
    args = p.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=8,
        learning_rate=1e-3, logging_steps=1, save_steps=args.save_steps, save_strategy="steps",
        report_to="none", use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=training, train_dataset=Tokens(256, 16, 64, seed=1),
        callbacks=[TrackwayCallback(), Pace(args.step_delay)],       # <- trackway: the one line
    )
    trainer.train(resume_from_checkpoint=resume_checkpoint())          # <- resume from the newest committed one
    if args.linger:
        print("trained", flush=True)  # the run is finished (on_train_end): a SIGTERM from here on ends nothing
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
