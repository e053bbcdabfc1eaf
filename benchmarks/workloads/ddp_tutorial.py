"""The PyTorch DDP tutorial's trainer (multigpu_torchrun.py) with the ranksight agent attached.

Same shape as the tutorial: a map-style ``Dataset`` of synthetic samples, ``DistributedSampler`` +
``DataLoader``, a ``Trainer`` class with ``_run_batch`` / ``_run_epoch`` / ``train`` and
``sampler.set_epoch``; a small MLP classifier instead of ``nn.Linear(20, 1)`` so a step has some work.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 ddp_tutorial.py --fault none
    torchrun --standalone --nproc-per-node 2 ddp_tutorial.py --device cuda --fault none   # 2 GPUs, NCCL

On ``--device cuda`` it is the tutorial's GPU code: ``torch.cuda.set_device(LOCAL_RANK)``, NCCL, the
model moved to the GPU and ``DDP(model, device_ids=[gpu_id])``, ``pin_memory=True`` and
``source.to(gpu_id)`` (the tutorial copies without ``non_blocking``), fp32 as in the tutorial (no
autocast, TF32 off). ``--size gpu`` (implied by cuda): 8192 wide at 512 samples a rank.

Faults (``--fault``), planted the way people make the mistake:

- ``input``: per-sample augmentation in ``__getitem__`` (a Python loop of small numpy ops on each
  sample: 4 rounds on CPU, 1 at the GPU size) with ``num_workers=0``.
- ``straggler``: rank 1 runs an extra "consistency" pass through the hidden layers in forward: ~1/3
  more forward/backward work than rank 0.
- ``metric-collectives``: torchvision-references-style ``MetricLogger`` (loss, lr, acc1, acc5, grad
  norm in total and per layer, data time, img/s) synchronised every batch instead of once per epoch
  (``barrier`` + ``all_reduce`` per meter), plus ``all_gather_object`` of per-rank throughput: 26
  collectives per step.
- ``exposed-allreduce``: a 2048-wide MLP (~50 MB of gradients) at batch 8 per rank; at the GPU size a
  12288-wide MLP (1.8 GB of gradients) at batch 64.
- ``unused-params``: ``DDP(model, find_unused_parameters=True)`` though every parameter is used.
- ``graph-breaks``: ``torch.compile(model)`` of a forward with an input range check in Python
  (``if x.abs().max() > ...``: a data-dependent branch).

GPU faults (``--device cuda`` only):

- ``pageable``: image-sized samples (3 x 64 x 64 floats, 25 MB a batch of 512) into a 2048-wide
  classifier, loaded by 6 worker processes (as image pipelines are) with ``pin_memory=False`` and copied
  with the tutorial's ``source.to(gpu_id)``: a synchronous copy from pageable memory every step.
- ``cpu-ops``: a ``GaussianNoise`` layer after the first hidden layer that draws its noise with
  ``torch.randn(h.size())`` (no ``device=``, as the snippet people copy has it) and moves it over.
- ``host-sync``: per-step logging read back from the GPU: ``loss.item()``, the accuracy with ``.cpu()``,
  the misclassified samples with ``nonzero()`` (hard-example counting).

``--fix`` applies what the finding's fix says: 4 persistent loader workers prefetching 4 batches each
(input), pinned memory and ``non_blocking=True`` (pageable), ``torch.randn_like`` (cpu-ops), sums kept on
the GPU and read every 10 steps (host-sync), ``find_unused_parameters=False``, ``torch.where`` for the
range check (graph-breaks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _corpus_options import CORE_FAULTS, add_corpus_options, gpu_sampling
from _truth import Truth
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import ranksight

FAULTS = (*CORE_FAULTS, "pageable", "cpu-ops", "host-sync")


def ddp_setup(device="cpu", backend=None):
    if device == "cuda":
        # more ranks than GPUs only in the one-GPU smoke test (gloo); otherwise GPU = LOCAL_RANK
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    init_process_group(backend=backend or ("nccl" if device == "cuda" else "gloo"))


class MyTrainDataset(Dataset):
    def __init__(self, size, in_features, classes, augment_rounds=0, truth=None, distinct=None):
        self.size = size
        g = torch.Generator().manual_seed(0)
        # distinct: how many different samples to hold (large samples repeat rather than fill the RAM)
        self.distinct = min(size, distinct or size)
        self.data = torch.rand(self.distinct, in_features, generator=g)
        self.targets = torch.randint(0, classes, (size,), generator=g)
        self.augment_rounds = augment_rounds
        self.truth = truth

    def __len__(self):
        return self.size

    def _augment(self, x):
        # random feature jitter + dropout + renormalisation, one small numpy op at a time
        a = x.numpy().copy()
        rng = np.random.default_rng()
        for _ in range(self.augment_rounds):
            a = a + rng.normal(0.0, 0.01, a.shape).astype(np.float32)
            a = np.where(rng.random(a.shape) < 0.05, 0.0, a).astype(np.float32)
            a = (a - a.mean()) / (a.std() + 1e-6)
        return torch.from_numpy(a)

    def __getitem__(self, index):
        x = self.data[index % self.distinct]
        if self.augment_rounds:
            with self.truth.fault():
                x = self._augment(x)
        return x, self.targets[index]


class GaussianNoise(nn.Module):
    """Gaussian noise regularisation while training (the layer as forum snippets write it)."""

    def __init__(self, sigma=0.01, on_cpu=True, timer=None):
        super().__init__()
        self.sigma, self.on_cpu = sigma, on_cpu
        self.timer = timer

    def forward(self, x):
        if not self.training:
            return x
        if self.on_cpu:
            with self.timer():
                noise = torch.randn(x.size()) * self.sigma  # no device=: drawn on the CPU every step
                noise = noise.to(x.device)
        else:
            noise = torch.randn_like(x) * self.sigma
        return x + noise


class Net(nn.Module):
    def __init__(self, in_features, width, depth, classes, extra_passes=0, range_check=False, noise=None):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.noise = noise
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, classes)
        self.extra_passes = extra_passes  # per-rank, not a parameter: DDP does not see it
        self.range_check = range_check

    def forward(self, x):
        if self.range_check == "branch" and x.abs().max() > 1e3:  # data-dependent branch: a graph break
            x = x.clamp(-1e3, 1e3)
        elif self.range_check == "where":  # the fix: the same clamp without a Python branch
            x = torch.where(x.abs() > 1e3, x.clamp(-1e3, 1e3), x)
        h = F.relu(self.inp(x))
        if self.noise is not None:
            h = self.noise(h)
        for layer in self.hidden:
            h = F.relu(layer(h))
        for _ in range(self.extra_passes):  # the straggler's extra consistency pass, on a third of the batch
            z = h[: len(h) // 3]
            for layer in self.hidden:
                z = F.relu(layer(z))
            h = h + 0.0 * z.mean()
        return self.head(h)


def accuracy(output, target, topk=(1,)):
    """Top-k accuracy in percent (torchvision references' utils.py)."""
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target[None])
        return [correct[:k].flatten().sum(dtype=torch.float32).item() * (100.0 / len(target)) for k in topk]


class SmoothedValue:
    """Track a series of values (torchvision references' utils.py)."""

    def __init__(self):
        self.total = 0.0
        self.count = 0

    def update(self, value, n=1):
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self):
        # torchvision puts it on "cuda": NCCL reduces only GPU tensors
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([self.count, self.total], dtype=torch.float64, device=device)
        dist.barrier()
        dist.all_reduce(t)
        self.count, self.total = int(t[0].item()), t[1].item()

    @property
    def global_avg(self):
        return self.total / max(self.count, 1)


class MetricLogger:
    def __init__(self):
        self.meters = {}

    def update(self, **kwargs):
        for k, v in kwargs.items():
            self.meters.setdefault(k, SmoothedValue()).update(v)

    def synchronize_between_processes(self):
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def __str__(self):
        return "  ".join(f"{name}: {meter.global_avg:.4f}" for name, meter in self.meters.items())


class Trainer:
    def __init__(self, model, train_data, optimizer, mon, truth, log_metrics=False, find_unused_parameters=False,
                 device="cpu", read_back=None, non_blocking=False, time_copy=False):  # fmt: skip
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.model = model.to(self.device)
        device_ids = [self.device.index] if device == "cuda" else None
        self.model = DDP(self.model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
        self.train_data = train_data
        self.optimizer = optimizer
        self.mon = mon
        self.truth = truth
        self.log_metrics = log_metrics
        self.meters = MetricLogger()
        self.steps_run = 0
        self.read_back = read_back  # host-sync: "every step" (the fault) or "every 10" (its fix)
        self.non_blocking, self.time_copy = non_blocking, time_copy
        self.logged = {"loss": 0.0, "correct": 0.0, "hard": 0}
        self.mon.watch(self.model, optimizer=self.optimizer)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        if self.read_back == "every step":
            with self.truth.fault():
                pred = output.argmax(1)
                self.logged["loss"] += loss.item()
                self.logged["correct"] += (pred == targets).float().mean().cpu()
                self.logged["hard"] += (pred != targets).nonzero().size(0)  # misclassified: a shape the host waits for
        elif self.read_back == "every 10":  # the fix: sums stay on the GPU, read every 10 steps
            pred = output.argmax(1)
            self.logged["loss"] = self.logged["loss"] + loss.detach()
            self.logged["correct"] = self.logged["correct"] + (pred == targets).float().mean()
            self.logged["hard"] = self.logged["hard"] + (pred != targets).sum()
            if self.steps_run % 10 == 9:
                self.logged = {k: float(v) for k, v in self.logged.items()}
        if self.log_metrics:
            with self.truth.fault():
                acc1, acc5 = accuracy(output, targets, topk=(1, 5))
                grad_norm = torch.norm(torch.stack([p.grad.norm() for p in self.model.parameters()]))
                layer_norms = {
                    f"grad_norm/{n}": p.grad.norm().item()
                    for n, p in self.model.module.named_parameters()
                    if n.endswith("weight")
                }
                self.meters.update(loss=loss.item(), lr=self.optimizer.param_groups[0]["lr"], acc1=acc1, acc5=acc5,
                                   grad_norm=grad_norm.item(), data=self.data_time,
                                   img_per_s=len(targets) / max(time.perf_counter() - self.last_step_end, 1e-9),
                                   **layer_norms)  # fmt: skip
                self.meters.synchronize_between_processes()  # every step, so the printed numbers are global
                per_rank = [None] * dist.get_world_size()
                dist.all_gather_object(
                    per_rank, {"rank": self.gpu_id, "img_per_s": self.meters.meters["img_per_s"].total}
                )
            if self.gpu_id == 0 and self.steps_run % 10 == 0:
                print(f"step {self.steps_run} {self.meters}")

    def _run_epoch(self, epoch, max_steps):
        self.last_step_end = time.perf_counter()
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.mon.loader(self.train_data):
            self.data_time = time.perf_counter() - self.last_step_end
            with self.truth.fault() if self.time_copy else contextlib.nullcontext():
                source = source.to(self.device, non_blocking=self.non_blocking)
                targets = targets.to(self.device, non_blocking=self.non_blocking)
            with self.mon.step():
                self._run_batch(source, targets)
            self.truth.step_end()
            self.last_step_end = time.perf_counter()
            self.steps_run += 1
            if self.steps_run >= max_steps:
                return

    def train(self, max_steps: int):
        epoch = 0
        while self.steps_run < max_steps:
            self._run_epoch(epoch, max_steps)
            epoch += 1


def main():
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--batch-size", type=int, default=512, help="input batch size on each rank")
    add_corpus_options(parser, "ddp-tutorial", FAULTS, steps_help="training steps (batches)")
    args = parser.parse_args()
    fault, fix = args.fault, args.fix
    size = args.size or ("gpu" if args.device == "cuda" else "cpu")

    ddp_setup(args.device, args.dist_backend)
    rank = dist.get_rank()
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    truth = Truth(rank, fault, fix)
    in_features, width, depth, classes, batch = 64, 1024, 3, 10, args.batch_size
    if size == "gpu":  # 3 x 8192^2 weights at 512 samples: ~0.6 TFLOP forward + backward, fp32
        width = 8192
    augment_rounds, distinct = 0, None
    if fault == "input":
        augment_rounds = 4 if size == "cpu" else 1
    if fault == "pageable":  # image-sized samples: 3 x 64 x 64 floats (2,048 distinct ones, repeated)
        in_features, distinct = 3 * 64 * 64, 2048
        if size == "gpu":
            width = 2048
    if fault == "exposed-allreduce":
        width, batch = (2048, 8) if size == "cpu" else (12288, 64)
    extra_passes = 1 if fault == "straggler" and rank == args.straggler_rank else 0

    truth.samples_per_step = batch
    dataset = MyTrainDataset(batch * 2 * (args.steps + 4), in_features, classes, augment_rounds, truth, distinct)
    pin_memory = args.device == "cuda" and (fault != "pageable" or fix)
    workers = {}
    if fault == "input" and fix:  # load in parallel with training, as input-bound's fix says
        workers = dict(num_workers=4, persistent_workers=True, prefetch_factor=4)
    if fault == "pageable" and args.device == "cuda":  # an image pipeline's workers, fixed or not
        workers = dict(num_workers=6, persistent_workers=True)
    train_data = DataLoader(
        dataset, batch_size=batch, pin_memory=pin_memory, shuffle=False, sampler=DistributedSampler(dataset), **workers
    )
    range_check = ("where" if fix else "branch") if fault == "graph-breaks" else None
    noise = GaussianNoise(on_cpu=not fix, timer=truth.fault) if fault == "cpu-ops" else None
    model = Net(in_features, width, depth, classes, extra_passes=extra_passes, range_check=range_check, noise=noise)
    if fault == "graph-breaks":
        model = torch.compile(model, backend=args.compile_backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mon = ranksight.init(run_dir=args.run_dir, job=args.job, run_id=args.run_id, gpu=gpu_sampling(args.device))
    read_back = ("every 10" if fix else "every step") if fault == "host-sync" and args.device == "cuda" else None
    trainer = Trainer(model, train_data, optimizer, mon, truth, log_metrics=fault == "metric-collectives",
                      find_unused_parameters=fault == "unused-params" and not fix, device=args.device,
                      read_back=read_back, non_blocking=fault == "pageable" and fix,
                      time_copy=fault == "pageable")  # fmt: skip
    trainer.train(args.steps)
    mon.close()
    truth.write()
    destroy_process_group()


if __name__ == "__main__":
    main()
