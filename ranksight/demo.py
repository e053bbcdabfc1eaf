"""``ranksight demo``: a real multi-rank training job with the agent attached and one planted fault.

Ranks are started with ``torch.multiprocessing`` (gloo on CPU; NCCL when every rank gets its own
GPU). Each fault is a realistic mistake, planted the way users make it:

- ``none``: a healthy MLP job.
- ``input``: a dataset whose ``__getitem__`` is slow and a loader with no workers (input-bound).
- ``sync``: large layers and a tiny batch, so gradient all-reduce dominates (exposed sync).
- ``straggler``: the last rank does several times the compute (the others wait in all-reduce).
- ``graph-break``: a compiled model with a data-dependent branch and changing batch shapes.
- ``unused-params``: ``find_unused_parameters=True`` on a model that uses every parameter.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass

FAULTS = ("none", "input", "sync", "straggler", "graph-break", "unused-params")


@dataclass
class DemoConfig:
    """One demo launch."""

    fault: str = "none"
    ranks: int = 2
    steps: int = 60
    run_dir: str = "ranksight-runs"
    job: str = "demo"
    run_id: str = ""
    flush_interval_s: float = 1.0
    kill_rank_at_step: int = -1
    """Test hook: SIGKILL this rank (the last one) at that step, to show what survives a crash."""
    extra_env: tuple = ()

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose one of: {', '.join(FAULTS)}")
        if not 1 <= self.ranks <= 64:
            raise ValueError(f"--ranks must be in 1..64, got {self.ranks}")
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if not self.run_id:
            self.run_id = f"{self.job}-{self.fault}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(cfg: DemoConfig, rank: int, device):
    """Model, data and loader for the fault; returns (model, loader, loss_fn)."""
    import torch
    from torch import nn

    # Healthy shape: enough compute per step that 2 CPU ranks are not all-reduce bound.
    width, depth, batch, n_items, item_sleep_s = 128, 3, 8192, 65536, 0.0
    if cfg.fault == "input":
        item_sleep_s = 0.00001  # 10 us per item: ~80 ms per 8192-item batch
    if cfg.fault == "sync":
        width, depth, batch = 1536, 6, 4
    slow_factor = 6 if cfg.fault == "straggler" and rank == cfg.ranks - 1 else 1

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(32, width)
            self.body = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.out = nn.Linear(width, 1)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for layer in self.body:
                h = torch.relu(layer(h))
                for _ in range(slow_factor - 1):  # the straggler's extra work, same result
                    h = h + 0.0 * torch.relu(layer(h))
            if cfg.fault == "graph-break" and h.abs().max() > 1e6:  # data-dependent branch: a graph break
                h = h.clamp(-1e6, 1e6)
            return self.out(h)

    class Synthetic(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(rank)  # shuffled once here, so batches are cheap slices
            self.x = torch.randn(n_items, 32, generator=g)
            self.y = self.x.sum(dim=1, keepdim=True) * 0.1

        def __len__(self) -> int:
            return n_items

        def __getitem__(self, idx):
            # Batched indexing (the loader hands over a list of indices): the cheap, healthy path.
            if item_sleep_s:
                time.sleep(item_sleep_s * len(idx))  # e.g. decoding JPEGs one by one in the main process
            return self.x[idx[0] : idx[-1] + 1], self.y[idx[0] : idx[-1] + 1]

    model = Net().to(device)
    sampler = torch.utils.data.BatchSampler(range(n_items), batch, drop_last=False)
    loader = torch.utils.data.DataLoader(Synthetic(), sampler=sampler, batch_size=None, num_workers=0)
    return model, loader, nn.MSELoss()


def _worker(rank: int, cfg: DemoConfig, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(cfg.ranks),
        LOCAL_WORLD_SIZE=str(cfg.ranks),
        RANKSIGHT_RUN_ID=cfg.run_id,
    )
    os.environ.update(dict(cfg.extra_env))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight

    torch.set_num_threads(1)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= cfg.ranks
    device = torch.device(f"cuda:{rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=cfg.ranks)
    torch.manual_seed(0)

    mon = ranksight.init(run_dir=cfg.run_dir, job=cfg.job, flush_interval_s=cfg.flush_interval_s)
    model, loader, loss_fn = _build(cfg, rank, device)
    if cfg.ranks > 1:
        # The sync fault also makes one huge bucket: nothing overlaps with backward (a real misconfiguration).
        bucket_cap_mb = 512 if cfg.fault == "sync" else 25
        model = DDP(model, find_unused_parameters=cfg.fault == "unused-params", bucket_cap_mb=bucket_cap_mb)
    if cfg.fault == "graph-break":
        model = torch.compile(model, backend="eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)

    step = 0
    while step < cfg.steps:
        for x, y in mon.loader(loader):
            if cfg.fault == "graph-break" and step % 10 == 9:
                x, y = x[: 8 + step % 7], y[: 8 + step % 7]  # ragged batches: recompiles
            with mon.step():
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            step += 1
            if step == cfg.kill_rank_at_step and rank == cfg.ranks - 1:
                time.sleep(cfg.flush_interval_s * 2.5)  # let at least one flush happen first
                os.kill(os.getpid(), 9)
            if step >= cfg.steps:
                break
    mon.close()
    dist.barrier()
    dist.destroy_process_group()


def run_demo(cfg: DemoConfig) -> str:
    """Run the job to completion and return the run's folder."""
    import torch.multiprocessing as mp

    port = _free_port()
    if cfg.ranks == 1:
        _worker(0, cfg, port)
    else:
        mp.start_processes(_worker, args=(cfg, port), nprocs=cfg.ranks, start_method="spawn", join=True)
    return os.path.join(cfg.run_dir, cfg.run_id)
