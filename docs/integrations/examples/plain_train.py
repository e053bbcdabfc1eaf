"""A plain DDP training script with no ranksight code in it: ``ranksight run`` attaches the agent.
The docs' example, run by the tests.

    ranksight run -- torchrun --nproc-per-node 2 plain_train.py
    ranksight run -- torchrun --nproc-per-node 2 plain_train.py --slow-data
    ranksight run -- python plain_train.py        # a single process works too
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


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
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--slow-data", action="store_true", help="plant an input-bound loader")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    torch.manual_seed(0)
    distributed = "RANK" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")
    width, batch = 512, 256
    hidden = [m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), *hidden, nn.Linear(width, 1))
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ranks = dist.get_world_size() if distributed else 1
    data = Samples(batch * (args.steps + 2) * ranks, decode_s=0.0004 if args.slow_data else 0.0)
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=0)

    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step + 1 >= args.steps:
            break
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
