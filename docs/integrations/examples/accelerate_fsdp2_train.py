"""Accelerate with FSDP2 + ranksight on 2 CPU processes (gloo); the docs' example, run by the tests.

torchrun --nproc-per-node 2 accelerate_fsdp2_train.py            # GPUs: one fully_shard unit per block
torchrun --nproc-per-node 2 accelerate_fsdp2_train.py --no-prefetch --batch 16   # exposed all-gathers
torchrun --nproc-per-node 2 accelerate_fsdp2_train.py --cpu      # CPU: Accelerate wraps DDP instead
ranksight diagnose ranksight-runs/<run>

Accelerate shards with FSDP only on GPUs: with ``cpu=True`` it ignores ``fsdp_plugin`` and wraps the model
in DDP, which ranksight's ``watch`` event then names ("DDP: ...") instead of "FSDP2 (...)".
"""

import argparse

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ranksight.integrations.accelerate import attach


class Block(nn.Module):
    """One unit of sharding: Accelerate's auto-wrap policy shards every module of this class."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear, self.act = nn.Linear(width, width), nn.ReLU()

    def forward(self, x):
        return self.act(self.linear(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--no-prefetch", action="store_true", help="all-gathers async, nothing prefetched")
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True): no FSDP there (DDP instead)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    torch.manual_seed(0)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=True, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
    )  # fmt: skip
    accelerator = Accelerator(cpu=args.cpu, fsdp_plugin=plugin)
    model = nn.Sequential(*[Block(args.width) for _ in range(4)], nn.Linear(args.width, 1))
    x = torch.randn(args.batch * (args.steps + 2) * accelerator.num_processes, args.width)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=args.batch)
    model = accelerator.prepare(model)  # FSDP2: shard first, then build the optimizer on the sharded parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    optimizer, loader = accelerator.prepare(optimizer, loader)
    if args.no_prefetch and hasattr(model, "_set_unshard_async_op"):
        model._set_unshard_async_op(True)  # all-gathers on the compute stream, no prefetch: the mistake

    tracker = attach(accelerator, model, optimizer, run_dir=args.run_dir, job="accelerate-fsdp2-example")
    for step, (xb, yb) in enumerate(tracker.loader(loader)):
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 >= args.steps:
            break
    tracker.close()


if __name__ == "__main__":
    main()
