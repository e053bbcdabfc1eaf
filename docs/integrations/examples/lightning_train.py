"""Lightning + ranksight: a complete 2-process DDP job on CPU (gloo); the docs' example, run by the tests.

python lightning_train.py                 # healthy input pipeline
python lightning_train.py --slow-data     # decoding in __getitem__ in the main process: input-bound
ranksight summary ranksight-runs/<run>    # per-rank step breakdown
"""

import argparse
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ranksight.integrations.lightning import RanksightCallback


class Samples(Dataset):
    """Synthetic regression data; ``decode_s`` stands in for per-item decoding work."""

    def __init__(self, n: int, decode_s: float) -> None:
        self.x = torch.randn(n, 64)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.decode_s = decode_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.decode_s:
            time.sleep(self.decode_s)
        return self.x[i], self.y[i]


class Regressor(LightningModule):
    def __init__(self, width: int = 512, depth: int = 4) -> None:
        super().__init__()
        layers = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu", help="cpu (gloo), or gpu (NCCL, one GPU per device)")
    parser.add_argument("--slow-data", action="store_true", help="plant an input-bound loader")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    torch.manual_seed(0)
    batch = 256
    data = Samples(n=batch * (args.steps + 2) * args.devices, decode_s=0.0004 if args.slow_data else 0.0)
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps,
        callbacks=[RanksightCallback(run_dir=args.run_dir, job="lightning-example")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=batch, num_workers=0))


if __name__ == "__main__":
    main()
