"""Accelerate + ranksight: a plain Accelerate loop on 2 CPU processes (gloo); the docs' example, run by the tests.

torchrun --nproc-per-node 2 accelerate_train.py               # or: accelerate launch --cpu --num_processes 2
torchrun --nproc-per-node 2 accelerate_train.py --slow-data   # decoding in __getitem__: input-bound
ranksight summary ranksight-runs/<run>
"""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ranksight.integrations.accelerate import attach


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--slow-data", action="store_true", help="plant an input-bound loader")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    width, batch = 512, 256
    hidden = [m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), *hidden, nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    n = batch * args.accumulate * (args.steps + 2) * accelerator.num_processes
    loader = DataLoader(Samples(n, decode_s=0.0004 if args.slow_data else 0.0), batch_size=batch, num_workers=0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    tracker = attach(accelerator, model, optimizer, run_dir=args.run_dir, job="accelerate-example")
    for step, (x, y) in enumerate(tracker.loader(loader)):
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if step + 1 >= args.steps * args.accumulate:
            break
    tracker.close()


if __name__ == "__main__":
    main()
