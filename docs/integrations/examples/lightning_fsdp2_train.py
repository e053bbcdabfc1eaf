"""Lightning's ModelParallelStrategy (FSDP2 through fully_shard in configure_model) + ranksight, 2 CPU
processes (gloo); the docs' example.

python lightning_fsdp2_train.py              # Lightning starts the second rank itself
ranksight diagnose ranksight-runs/<run>
"""

import argparse

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from ranksight.integrations.lightning import RanksightCallback


class Model(LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4))
        self.head = nn.Linear(width, 1)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]  # Lightning built the mesh; one fully_shard unit per block
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)  # through forward: FSDP2's root hooks unshard the head

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.batch * (args.steps + 2), args.width)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=args.batch)
    trainer = Trainer(
        accelerator="cpu", devices=2, max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        callbacks=[RanksightCallback(run_dir=args.run_dir, job="lightning-fsdp2-example")],
    )  # fmt: skip
    trainer.fit(Model(args.width), loader)


if __name__ == "__main__":
    main()
