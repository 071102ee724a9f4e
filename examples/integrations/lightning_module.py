"""A tiny regression model trained by Lightning under trackway: one object, passed as logger and callback.

    trackway submit --name pl -- python examples/integrations/lightning_module.py
    trackway submit --name pl-ddp -- python examples/integrations/lightning_module.py --devices 2 --strategy ddp
    trackway submit --name pl-torchrun -- torchrun --nproc_per_node=2 examples/integrations/lightning_module.py \\
        --devices 2 --strategy ddp

The same lines run on every rank: Lightning's own launcher (`--devices 2 --strategy ddp`) starts this
script again for rank 1, torchrun starts it once per rank. `--shuffle` draws a new order each epoch;
`--stateful-loader` uses torchdata's StatefulDataLoader, whose position Lightning saves in the
checkpoint, so a resume from the middle of an epoch continues with the very next batch.

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
    def __init__(self, delay: float = 0.0, samples: int = 64, shuffle: bool = False, stateful: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.delay = delay
        self.data = (samples, shuffle, stateful)

    def train_dataloader(self):
        # Made here, once the ranks are known and a resumed epoch is restored (see `data`).
        return data(*self.data, epoch=self.trainer.current_epoch, world=(self.trainer.world_size, self.global_rank))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        print(f"step {self.global_step}", flush=True)
        time.sleep(self.delay)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(samples: int, shuffle: bool, stateful: bool, epoch: int = 0, world: tuple[int, int] = (1, 0)):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    dataset = torch.utils.data.TensorDataset(x, y)
    if not stateful:
        # Under DDP Lightning puts a DistributedSampler in; a mid-epoch resume starts the epoch's batches again.
        return torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=shuffle)
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    if world[0] == 1:
        return StatefulDataLoader(dataset, batch_size=16, shuffle=shuffle)
    # Our own sampler (use_distributed_sampler=False), told the epoch now: Lightning 2.6 makes the
    # resumed epoch's iterator before it calls set_epoch, which would replay epoch 0's order.
    sampler = StatefulDistributedSampler(dataset, num_replicas=world[0], rank=world[1], shuffle=shuffle, seed=0)
    sampler.set_epoch(epoch)
    return StatefulDataLoader(dataset, batch_size=16, sampler=sampler)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--stateful-loader", action="store_true")
    args = p.parse_args()

    L.seed_everything(0)
    tw = TrackwayLightning(checkpoint_every_steps=args.checkpoint_every)   # <- trackway, on every rank
    trainer = L.Trainer(
        max_epochs=args.epochs, logger=tw, callbacks=[tw], log_every_n_steps=1, accelerator="cpu",
        devices=args.devices, strategy=args.strategy, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, use_distributed_sampler=not args.stateful_loader,
    )
    model = Tiny(args.step_delay, args.samples, args.shuffle, args.stateful_loader)
    trainer.fit(model, ckpt_path=resume_checkpoint())   # <- resume, on every rank


if __name__ == "__main__":
    main()
