"""``ranksight demo``: a real multi-rank training job with the agent attached and one planted fault.

Ranks are started with ``torch.multiprocessing`` (gloo on CPU; NCCL when every rank gets its own
GPU). Each fault is a realistic mistake, planted the way users make it:

- ``none``: a healthy MLP job.
- ``input``: a dataset whose ``__getitem__`` is slow and a loader with no workers (input-bound).
- ``sync``: large layers and a tiny batch, so gradient all-reduce dominates (exposed sync).
- ``straggler``: the last rank does several times the compute (the others wait in all-reduce).
- ``graph-break``: a compiled model with a data-dependent branch and changing batch shapes.
- ``unused-params``: ``find_unused_parameters=True`` on a model that uses every parameter.
- ``straggler30``: the last rank does 30 % more compute (a slightly slower host: the others wait for it).
- ``blocking``: three metrics all-reduced one by one for logging, counters gathered with
  ``all_gather_object`` and a barrier, in every step of a short step.
- ``oversubscribed``: every rank runs as many torch threads as the host has CPUs.
- ``fsdp``: a healthy FSDP2 job (``fully_shard`` per block, explicit forward and backward prefetching,
  enough work per parameter byte that the all-gathers are a few % of the step).
- ``fsdp-no-prefetch``: the FSDP2 mistake: wide blocks, a small batch, and all-gathers issued on the
  compute stream (``_set_unshard_async_op(True)``, e.g. to avoid inter-stream fragmentation) without the
  explicit prefetching that must then replace FSDP2's implicit one: every block waits for its own
  all-gather in forward (and in backward on a GPU).

GPU-only faults (their code paths only run on CUDA; on a CPU machine the demo refuses them):

- ``pageable``: wide batches copied from pageable memory (``pin_memory=False``) to a small model.
- ``cpu-op``: a tensor created on the CPU inside forward every step (``torch.randn`` without ``device=``).
- ``host-sync``: per-batch normalisation with ``.item()`` on GPU tensors before forward.
- ``fragmentation``: scratch tensors of random sizes, every other one kept alive for a while.

On one GPU with several ranks, every rank shares it and gloo carries the all-reduce (NCCL refuses two
ranks on one device); with a GPU per rank NCCL is used.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass

CPU_FAULTS = (
    "none", "input", "sync", "straggler", "graph-break", "unused-params", "straggler30", "blocking", "oversubscribed",
    "fsdp", "fsdp-no-prefetch",
)  # fmt: skip
FSDP_FAULTS = ("fsdp", "fsdp-no-prefetch")
GPU_FAULTS = ("pageable", "cpu-op", "host-sync", "fragmentation")
FAULTS = CPU_FAULTS + GPU_FAULTS
DDP_STATS_EVERY_STEPS = 10  # read DDP's logging data (unused parameters) often: demo runs are short
# GPU sampling settings (Config.extra) sized for a demo of tens of steps instead of hours: a traced
# window early and then every 20 steps, allocator stats twice a second, a memory snapshot every 2 s.
GPU_SAMPLING = {
    "trace_first_step": 10,
    "trace_first_s": 0.0,
    "trace_every_steps": 20,
    "allocator_every_s": 0.5,
    "snapshot_every_s": 2.0,
}


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


MULTI_RANK_FAULTS = ("sync", "straggler", "unused-params", "straggler30", "blocking", *FSDP_FAULTS)  # need ranks


def default_ranks(fault: str) -> int:
    """2 ranks, except on a machine with one GPU for a fault that does not need several: two ranks
    there would share the GPU through gloo (NCCL refuses them), which is itself a finding (gloo-on-gpu)."""
    import torch

    if fault not in MULTI_RANK_FAULTS and torch.cuda.is_available() and torch.cuda.device_count() == 1:
        return 1
    return 2


class NeedsGPUError(RuntimeError):
    """The fault plants a GPU-only mistake and this machine has no CUDA device."""


def check_device(cfg: DemoConfig) -> None:
    """Raise NeedsGPUError when the fault needs a GPU and torch sees none."""
    import torch

    if cfg.fault in GPU_FAULTS and not torch.cuda.is_available():
        raise NeedsGPUError(
            f"fault {cfg.fault!r} needs a GPU (CUDA) and torch sees none; CPU faults: {', '.join(CPU_FAULTS)}"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Synthetic:
    """A map-style dataset of random regression data, shuffled once so that batches are cheap slices.

    Module-level (not local to ``_build``) so DataLoader workers can receive it under any start method.
    """

    def __init__(self, n_items: int, in_features: int, seed: int, item_sleep_s: float = 0.0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n_items, in_features, generator=g)
        self.y = self.x[:, :32].sum(dim=1, keepdim=True) * 0.1
        self.item_sleep_s = item_sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx):
        # Batched indexing (the loader hands over a list of indices): the cheap, healthy path.
        if self.item_sleep_s:
            time.sleep(self.item_sleep_s * len(idx))  # e.g. decoding JPEGs one by one in the main process
        return self.x[idx[0] : idx[-1] + 1], self.y[idx[0] : idx[-1] + 1]


def mlp(in_features: int, width: int, depth: int, slow: int = 1, extra_rows: float = 0.0, fault: str = "none"):
    """The demo's model: an MLP of ``depth`` hidden layers. A straggler runs each layer ``slow`` times, or
    ``extra_rows`` of its rows once more (the extra passes leave the result unchanged); the ``cpu-op`` and
    ``graph-break`` faults add their mistakes to ``forward``."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(in_features, width)
            self.body = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.out = nn.Linear(width, 1)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for layer in self.body:
                h = torch.relu(layer(h))
                for _ in range(slow - 1):  # the straggler's extra work, same result
                    h = h + 0.0 * torch.relu(layer(h))
                if extra_rows:
                    k = max(1, round(extra_rows * h.shape[0]))
                    h = torch.cat([h[:k] + 0.0 * torch.relu(layer(h[:k])), h[k:]])
            if fault == "cpu-op":
                # The mistake: no device= here, so the noise is drawn on the CPU every step, then copied.
                noise = torch.randn(h.shape[0], h.shape[1]) * 1e-3
                noise = torch.tanh(noise) + noise.abs().sqrt() * 0.0
                h = h + noise.to(h.device)
            if fault == "graph-break" and h.abs().max() > 1e6:  # data-dependent branch: a graph break
                h = h.clamp(-1e6, 1e6)
            return self.out(h)

    return Net()


def _build(cfg: DemoConfig, rank: int, device):
    """Model, data and loader for the fault; returns (model, loader, loss_fn)."""
    import torch
    from torch import nn

    # Healthy shape: enough compute per step that 2 CPU ranks are not all-reduce bound.
    width, depth, batch, n_items, in_features, item_sleep_s = 128, 3, 8192, 65536, 32, 0.0
    on_gpu = device.type == "cuda"
    # The healthy way to feed a GPU: pinned batches prepared by worker processes. On a GPU the model is
    # wider too, so a healthy step is GPU work rather than Python overhead. (On CPU, workers would only
    # compete with the ranks for the same cores.)
    pin_memory, num_workers = on_gpu, (2 if on_gpu else 0)
    if on_gpu:
        width, depth, batch = 2048, 4, 16384  # ~2 TFLOP per step: tens of ms of kernels, few launches
        # Long epochs: the first batch of each epoch cannot be prefetched, and with 4-batch epochs that
        # alone measured 14 % data wait on an H200.
        n_items = batch * 64
    if cfg.fault == "input":
        item_sleep_s, num_workers = 0.00001, 0  # 10 us per item in the main process: ~80 ms per batch
    if cfg.fault == "sync":
        width, depth, batch = 1536, 6, 4
    if cfg.fault == "blocking":
        batch = 1024  # a short step, as in a job whose per-step work is small next to its logging
    if cfg.fault == "pageable":
        in_features, n_items, pin_memory = 2048, 32768, False  # 128 MiB batches from pageable memory
    slow_factor = 4 if cfg.fault == "straggler" and rank == cfg.ranks - 1 else 1
    # straggler30: this share of each batch's rows goes through every hidden layer once more (same result).
    extra_rows = 0.3 if cfg.fault == "straggler30" and rank == cfg.ranks - 1 else 0.0

    if cfg.fault in FSDP_FAULTS:
        model, in_features, batch, n_items = _fsdp_model(cfg, device)
    else:
        model = mlp(in_features, width, depth, slow_factor, extra_rows, cfg.fault).to(device)
    sampler = torch.utils.data.BatchSampler(range(n_items), batch, drop_last=False)
    loader = torch.utils.data.DataLoader(
        _Synthetic(n_items, in_features, seed=rank, item_sleep_s=item_sleep_s),
        sampler=sampler,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
    return model, loader, nn.MSELoss()


#: (width, blocks, batch) of the FSDP2 demo, per fault and device. The healthy job does enough work per
#: parameter byte that its all-gathers are a few % of the step; the fault's wide blocks and small batch
#: make every all-gather a real part of it, exposed once the prefetching is gone.
FSDP_SHAPES = {
    ("fsdp", "cpu"): (128, 2, 32768),
    ("fsdp-no-prefetch", "cpu"): (1024, 4, 64),
    ("fsdp", "cuda"): (4096, 8, 8192),
    ("fsdp-no-prefetch", "cuda"): (4096, 8, 256),
}


def _fsdp_model(cfg: DemoConfig, device):
    """A stack of Linear+ReLU blocks sharded with FSDP2, one ``fully_shard`` unit per block, then the root.

    ``fsdp``: each block prefetches the next two in forward and the previous one in backward (FSDP2's
    explicit prefetching, torch >= 2.6). On CPU gloo still runs those all-gathers on the training
    thread (async ones ran slower on a 2-core host, where gloo's own thread has no core to spare), so
    what keeps the CPU job healthy is the work per parameter byte. ``fsdp-no-prefetch``: async
    all-gathers with no prefetching, so each block waits for its own (on a GPU, on the compute stream).
    Returns (model, in_features, batch, n_items)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    width, depth, batch = FSDP_SHAPES[(cfg.fault, device.type)]
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    model = nn.Sequential(*blocks, nn.Linear(width, 1)).to(device)
    # The mesh on the ranks' own device: without one, fully_shard builds it on CUDA whenever CUDA is
    # available, also for ranks that run on CPU (gloo) beside a GPU.
    mesh = init_device_mesh(device.type, (cfg.ranks,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if cfg.fault == "fsdp":
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 3])
            if i > 0:
                block.set_modules_to_backward_prefetch([blocks[i - 1]])
    else:
        model._set_unshard_async_op(True)  # the mistake: all-gathers on the compute stream, no prefetch
    return model, width, batch, max(4096, batch * 4)


def _host_sync_normalise(x):
    """The host-sync fault: per-batch statistics read back with .item(), each one a device sync."""
    scale = x.abs().max().item()
    mean = x.mean().item()
    std = x.std().item()
    nonzero = int((x != 0).sum().item())
    return (x - mean) / (std + 1e-6) / max(scale, 1e-6) * (nonzero > 0)


class _Fragmenter:
    """The fragmentation fault: a nearly full GPU (a ballast tensor stands for a large model's weights and
    optimizer state), and scratch buffers of random sizes (1-10 MiB: the allocator carves them out of
    20 MiB segments), every other one kept alive for a while. Freed blocks leave holes that segments can
    neither return nor reuse for the next, differently sized, request; near the memory limit that is
    what turns into allocator retries and OOMs."""

    def __init__(self, device, seed: int, sharing: int) -> None:
        import collections
        import random

        import torch

        self._device, self._rng = device, random.Random(seed)
        self._kept = collections.deque(maxlen=48)
        total = torch.cuda.get_device_properties(device).total_memory
        self._ballast = torch.empty(int(total * 0.92 / sharing), dtype=torch.uint8, device=device)

    def step(self, step: int) -> None:
        import torch

        try:
            for i in range(12):
                n = self._rng.randrange(256 * 1024, 10 * 256 * 1024)  # float32 elements: 1-10 MiB
                t = torch.empty(n, device=self._device)
                if i % 2:
                    self._kept.append(t)
        except torch.cuda.OutOfMemoryError:
            self.release()

    def release(self) -> None:
        """What a user's code does after an OOM: drop its own cache and go on."""
        import torch

        for _ in range(len(self._kept) // 2):
            self._kept.popleft()
        torch.cuda.empty_cache()


def _device_and_backend(cfg: DemoConfig, rank: int):
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    count = torch.cuda.device_count()
    if cfg.fault in FSDP_FAULTS and count < cfg.ranks:
        return torch.device("cpu"), "gloo"  # FSDP2 needs NCCL on GPUs (one per rank); else it runs on CPU
    device = torch.device(f"cuda:{rank % count}")
    # NCCL refuses two ranks on one GPU; gloo all-reduces CUDA tensors (through host memory) instead.
    return device, "nccl" if count >= cfg.ranks else "gloo"


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
    if cfg.fault == "oversubscribed":
        torch.set_num_threads(max(2, os.cpu_count() or 2))  # the default outside torchrun: every core, per rank
    device, backend = _device_and_backend(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=cfg.ranks)
    torch.manual_seed(0)

    mon = ranksight.init(
        run_dir=cfg.run_dir,
        job=cfg.job,
        flush_interval_s=cfg.flush_interval_s,
        ddp_stats_every_steps=DDP_STATS_EVERY_STEPS,
        gpu=dict(GPU_SAMPLING) if device.type == "cuda" else None,
    )
    model, loader, loss_fn = _build(cfg, rank, device)
    if cfg.ranks > 1 and cfg.fault not in FSDP_FAULTS:
        # The sync fault also makes one huge bucket: nothing overlaps with backward (a real misconfiguration).
        bucket_cap_mb = 512 if cfg.fault == "sync" else 25
        model = DDP(model, find_unused_parameters=cfg.fault == "unused-params", bucket_cap_mb=bucket_cap_mb)
    if cfg.fault == "graph-break":
        model = torch.compile(model, backend="eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    fragmenter = None
    if cfg.fault == "fragmentation":
        sharing = cfg.ranks if torch.cuda.device_count() < cfg.ranks else 1  # ranks sharing one GPU
        fragmenter = _Fragmenter(device, rank, sharing)
    # Healthy GPU runs copy from pinned memory asynchronously; the pageable fault's copy cannot be.
    non_blocking = device.type == "cuda"

    step = 0
    while step < cfg.steps:
        for x, y in mon.loader(loader):
            if cfg.fault == "graph-break" and step % 10 == 9:
                x, y = x[: 8 + step % 7], y[: 8 + step % 7]  # ragged batches: recompiles
            try:
                with mon.step():
                    x, y = x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)
                    if cfg.fault == "host-sync":
                        x = _host_sync_normalise(x)
                    if fragmenter is not None:
                        fragmenter.step(step)
                    loss = loss_fn(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    if cfg.fault == "blocking":
                        for metric in (loss.detach(), loss.detach().abs(), loss.detach() ** 2):
                            dist.all_reduce(metric.clone())  # each metric averaged for a log line, every step
                        dist.all_gather_object([None] * cfg.ranks, {"step": step})  # per-rank counters
                        dist.barrier()  # "keep the ranks together"
            except torch.cuda.OutOfMemoryError:
                if fragmenter is None:
                    raise
                fragmenter.release()  # the capped fragmentation fault: shed scratch memory and go on
            step += 1
            if step == cfg.kill_rank_at_step and rank == cfg.ranks - 1:
                time.sleep(cfg.flush_interval_s * 2.5)  # let at least one flush happen first
                os.kill(os.getpid(), 9)
            if step >= cfg.steps:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()


def run_demo(cfg: DemoConfig) -> str:
    """Run the job to completion and return the run's folder."""
    import torch.multiprocessing as mp

    check_device(cfg)
    port = _free_port()
    if cfg.ranks == 1:
        _worker(0, cfg, port)
    else:
        mp.start_processes(_worker, args=(cfg, port), nprocs=cfg.ranks, start_method="spawn", join=True)
    return os.path.join(cfg.run_dir, cfg.run_id)
