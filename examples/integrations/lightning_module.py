"""A tiny regression model trained by Lightning under trackway: one object, passed as logger and callback.

    trackway submit --name pl -- python examples/integrations/lightning_module.py

Nothing is downloaded: the model is a small MLP and the data are seeded random tensors.
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
from torch import nn

from trackway.integrations.lightning import TrackwayLightning, resume_checkpoint


class Tiny(L.LightningModule):
    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.delay = delay

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        print(f"step {self.global_step}", flush=True)
        time.sleep(self.delay)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(seed: int = 1) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--checkpoint-every", type=int, default=20)
    args = p.parse_args()

    L.seed_everything(0)
    tw = TrackwayLightning(checkpoint_every_steps=args.checkpoint_every)   # <- trackway
    trainer = L.Trainer(
        max_epochs=args.epochs, logger=tw, callbacks=[tw], log_every_n_steps=1, accelerator="cpu",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )
    trainer.fit(Tiny(args.step_delay), data(), ckpt_path=resume_checkpoint())   # <- resume


if __name__ == "__main__":
    main()
