"""Per-step cost of each integration (Lightning, Hugging Face Trainer, Accelerate, ``ranksight run``), CPU.

Two figures per integration, each from interleaved A/B blocks in one run (blocks alternate, so machine
noise hits both sides alike):

1. ``end_to_end``: a real single-process training run of a tiny model (near-empty steps: the worst case
   for relative overhead) with and without the integration. Per block, the median interval between
   consecutive steps (a first-in-line clock callback / the loop's own clock); reported: the median
   over blocks of (with - without) in microseconds, and the ratio of medians with / without.
   ``ranksight run`` blocks are subprocesses (``ranksight run --quiet -- python -c LOOP`` against
   ``python -c LOOP``), because its patches live for the whole interpreter.
2. ``hook_path_us``: the integration's own per-step hook sequence called in a tight loop with a live
   monitor (e.g. Lightning: batch start, before optimizer step, optimizer post-hook, batch end),
   minus the same loop calling no-op functions: the cost the integration itself adds per step,
   without the framework around it.

Usage: ``python benchmarks/integrations_overhead.py [--blocks 6] [--steps 150] [--only lightning,run] [--json OUT]``
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _harness import cli, loop_us, write_results

INTEGRATIONS = ("lightning", "transformers", "accelerate", "run")


def _median_interval_us(stamps: list[int], skip: int = 10) -> float:
    gaps = [(b - a) / 1000 for a, b in zip(stamps[skip:], stamps[skip + 1 :])]
    return statistics.median(gaps)


def _summarise(block, blocks: int) -> dict:
    """``block(with_ranksight, i)``'s figure (µs per step) without and with the integration, ``blocks`` times."""
    pairs = [(block(False, i), block(True, i)) for i in range(blocks)]
    without = [a for a, _ in pairs]
    with_ = [b for _, b in pairs]
    return {
        "step_without_us": statistics.median(without),
        "step_with_us": statistics.median(with_),
        "overhead_us": statistics.median(b - a for a, b in pairs),
        "ratio": statistics.median(with_) / statistics.median(without),
        "blocks": len(pairs),
    }


def _hook_path_us(calls: list[tuple], steps: int = 20000, blocks: int = 7) -> float:
    """Median over blocks of (the integration's hook sequence - the same calls to a no-op) per step, in
    microseconds. ``calls``: (hook, its arguments, or a function returning them when they change per call)."""

    def noop(*a, **k):
        return None

    def sequence(calls):
        def run():
            for fn, args in calls:
                fn(*(args() if callable(args) else args))

        return run

    hooked, plain = sequence(calls), sequence([(noop, args) for _, args in calls])
    return statistics.median(loop_us(hooked, steps) - loop_us(plain, steps) for _ in range(blocks))


# ---------------------------------------------------------------- Lightning
def bench_lightning(blocks: int, steps: int, tmp: str) -> dict:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer

    from ranksight.integrations._common import start_monitor
    from ranksight.integrations.lightning import RanksightCallback

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 32)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Clock(Callback):
        def __init__(self) -> None:
            self.stamps: list[int] = []

        def on_train_batch_start(self, *args) -> None:
            self.stamps.append(time.perf_counter_ns())

    data = torch.utils.data.TensorDataset(torch.randn(64 * (steps + 1), 32))

    def block(with_ranksight: bool, i: int) -> float:
        clock = Clock()
        callbacks = [clock] + ([RanksightCallback(run_dir=tmp, job="bench", run_id=f"l{i}")] if with_ranksight else [])
        trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, callbacks=callbacks, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          default_root_dir=tmp)  # fmt: skip
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=64))
        return _median_interval_us(clock.stamps)

    result = _summarise(block, blocks)

    cb = RanksightCallback()
    cb.monitor = cb._m = start_monitor({"run_dir": tmp, "job": "bench", "run_id": "lhook"})

    none3 = (None, None, None)
    hooks = [(cb.on_train_batch_start, (*none3, 0)), (cb.on_before_optimizer_step, none3),
             (cb._optimizer_done, none3), (cb.on_train_batch_end, (*none3, None, 0))]  # fmt: skip
    result["hook_path_us"] = _hook_path_us(hooks)
    cb.monitor.close()
    return result


# ---------------------------------------------------------------- Hugging Face Trainer
def bench_transformers(blocks: int, steps: int, tmp: str) -> dict:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ranksight.integrations._common import start_monitor
    from ranksight.integrations.transformers import RanksightCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 32)

        def forward(self, x, labels=None):
            return {"loss": (self.net(x) - labels).square().mean()}

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.x = torch.randn(n, 32)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.x[i]}

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.stamps: list[int] = []

        def on_step_begin(self, *args, **kwargs) -> None:
            self.stamps.append(time.perf_counter_ns())

    def block(with_ranksight: bool, i: int) -> float:
        clock = Clock()
        callbacks = [clock] + ([RanksightCallback(run_dir=tmp, job="bench", run_id=f"t{i}")] if with_ranksight else [])
        args = TrainingArguments(
            output_dir=os.path.join(tmp, "hf"),
            per_device_train_batch_size=64,
            max_steps=steps,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        Trainer(model=Tiny(), args=args, train_dataset=Rows(64 * (steps + 1)), callbacks=callbacks).train()
        return _median_interval_us(clock.stamps)

    result = _summarise(block, blocks)

    cb = RanksightCallback()
    cb.monitor = cb._m = start_monitor({"run_dir": tmp, "job": "bench", "run_id": "thook"})

    hooks = [(hook, (None, None, None)) for hook in (cb.on_step_begin, cb.on_pre_optimizer_step, cb.on_optimizer_step,
                                                      cb.on_step_end)]  # fmt: skip
    result["hook_path_us"] = _hook_path_us(hooks)
    cb.monitor.close()
    return result


# ---------------------------------------------------------------- Accelerate
def bench_accelerate(blocks: int, steps: int, tmp: str) -> dict:
    import torch
    from accelerate import Accelerator

    from ranksight.integrations._common import ImplicitSteps, TimedIterator, start_monitor
    from ranksight.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64 * (steps + 1), 32)), 64)

    def block(with_ranksight: bool, i: int) -> float:
        model = torch.nn.Linear(32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        model, opt, dl = accelerator.prepare(model, opt, loader)
        tracker = attach(accelerator, model, opt, run_dir=tmp, job="bench", run_id=f"a{i}") if with_ranksight else None
        stamps = []
        for (x,) in tracker.loader(dl) if tracker else dl:
            stamps.append(time.perf_counter_ns())
            loss = model(x).square().mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if tracker:
            tracker.close()
        return _median_interval_us(stamps)

    result = _summarise(block, blocks)

    mon = start_monitor({"run_dir": tmp, "job": "bench", "run_id": "ahook"})
    steps_marks = ImplicitSteps(mon)
    timed = TimedIterator(iter(()), steps_marks, mon._clock)
    clock = mon._clock

    hooks = [(steps_marks.fetched, lambda: (timed, clock())), (steps_marks.optimizer_pre, (None, None, None)),
             (steps_marks.optimizer_post, (None, None, None))]  # fmt: skip
    result["hook_path_us"] = _hook_path_us(hooks)
    mon.close()
    return result


# ---------------------------------------------------------------- ranksight run (zero-edit)
_LOOP = """
import json, sys, time, torch
torch.set_num_threads(1)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64 * ({steps} + 1), 32)), 64)
stamps = []
for (x,) in loader:
    stamps.append(time.perf_counter_ns())
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
print(json.dumps(stamps))
"""


def bench_run(blocks: int, steps: int, tmp: str) -> dict:
    loop = _LOOP.format(steps=steps * 4)  # subprocess blocks: longer loops amortise nothing but noise

    def block(with_ranksight: bool, i: int) -> float:
        cmd = [sys.executable, "-c", loop]
        if with_ranksight:
            cmd = [
                sys.executable,
                "-m",
                "ranksight",
                "run",
                "--quiet",
                "--run-dir",
                tmp,
                "--run-id",
                f"r{i}",
                "--",
            ] + cmd
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
        out = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=True)
        return _median_interval_us(json.loads(out.stdout.strip().splitlines()[-1]))

    return _summarise(block, blocks)


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument("--blocks", "--rounds", dest="blocks", type=int, default=6, help="A/B block pairs")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument(
        "--only", default=",".join(INTEGRATIONS), help="comma-separated subset of: " + ", ".join(INTEGRATIONS)
    )
    args = parser.parse_args()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import logging

    import torch

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    benches = {
        "lightning": bench_lightning,
        "transformers": bench_transformers,
        "accelerate": bench_accelerate,
        "run": bench_run,
    }
    result: dict = {"python": sys.version.split()[0], "torch": torch.__version__, "steps_per_block": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            result[name] = benches[name](args.blocks, args.steps, os.path.join(tmp, name))
            print(name, json.dumps(result[name]), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))
    if args.json:
        write_results(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
