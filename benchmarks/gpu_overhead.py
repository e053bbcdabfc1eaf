"""Overhead of the agent on a real GPU: interleaved A/B blocks in one process, at a short and a long step.

Variants, each a block of ``--block`` steps timed with a device sync at both ends (never inside):
  plain         the training loop alone
  agent         ranksight monitor (CUDA-event phases, NVML, allocator samplers; no window in the block)
  agent_window  same, with one sampled kernel-level window forced inside the block
  profiler      torch.profiler left on with a schedule (wait 20, warmup 5, active 5, repeating)
  nvml_thread   a plain NVML poller thread (1 s) beside the loop
Rounds rotate the order; figures are the median of per-round ratios to ``plain`` and their spread.
The window's cost is amortised over its default period (300 steps). Run on a CUDA machine:
``python benchmarks/gpu_overhead.py --out DIR`` → ``DIR/gpu_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_workload import make_batches, make_model, train_step  # noqa: E402

import ranksight  # noqa: E402

VARIANTS = ["plain", "agent", "agent_window", "profiler", "nvml_thread"]
DEFAULT_WINDOW_PERIOD_STEPS = 300


def time_steps(n: int, batch_size: int, d: int, layers: int, t: int) -> float:
    model = make_model(d, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(2, batch_size, t, d, True)
    for i in range(3):
        train_step(model, opt, batches[i % 2], "cuda", True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        train_step(model, opt, batches[i % 2], "cuda", True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def calibrate(target_s: float, d: int, layers: int, t: int) -> tuple[int, float]:
    """Smallest power-of-two batch whose step takes at least ~0.75 x target."""
    b = 1
    while True:
        s = time_steps(5, b, d, layers, t)
        if s >= 0.75 * target_s or b >= 1024:
            return b, s
        b *= 2


class NvmlPoller:
    """What a user might run instead: a thread reading NVML utilization and memory every second."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv = pynvml
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.stop = threading.Event()
        self.readings = 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.nv.nvmlDeviceGetUtilizationRates(self.h)
            self.nv.nvmlDeviceGetMemoryInfo(self.h)
            self.readings += 1


def bench(target_s: float, rounds: int, block: int, d: int, layers: int, t: int, run_dir: str) -> dict:
    b, calib = calibrate(target_s, d, layers, t)
    plain_model = make_model(d, layers)
    agent_model = make_model(d, layers)
    opt_p = torch.optim.AdamW(plain_model.parameters(), lr=1e-4, foreach=True)
    opt_a = torch.optim.AdamW(agent_model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(2, b, t, d, True)
    mon = ranksight.init(
        run_dir=run_dir,
        job="gpu-overhead",
        run_id=f"overhead-{int(target_s * 1000)}ms",
        gpu=dict(trace_first_step=10**9, trace_every_steps=10**9, trace_every_s=10**9),  # windows only where forced
    )
    mon.watch(agent_model, optimizer=opt_a)
    window = mon._gpu.window if mon._gpu is not None else None

    def loop_plain(n):
        for i in range(n):
            train_step(plain_model, opt_p, batches[i % 2], "cuda", True)

    def loop_agent(n, force_window=False):
        if force_window and window is not None:
            window.next_step = mon.steps_recorded + 5
            window.next_ns = 0
        for _i, batch in zip(range(n), mon.loader(batches * (n // 2 + 1))):
            with mon.step():
                train_step(agent_model, opt_a, batch, "cuda", True)

    def loop_profiler(n):
        sched = torch.profiler.schedule(wait=20, warmup=5, active=5)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, schedule=sched) as prof:
            for i in range(n):
                train_step(plain_model, opt_p, batches[i % 2], "cuda", True)
                prof.step()

    def loop_nvml(n):
        poller = NvmlPoller()
        th = threading.Thread(target=poller.run, daemon=True)
        th.start()
        loop_plain(n)
        poller.stop.set()
        th.join()

    runners = {
        "plain": loop_plain,
        "agent": loop_agent,
        "agent_window": lambda n: loop_agent(n, force_window=True),
        "profiler": loop_profiler,
        "nvml_thread": loop_nvml,
    }
    # Warm-up: every variant once, including the first (slow) profiler start of CUPTI.
    for name in VARIANTS:
        runners[name](min(block, 30))
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    stop_costs = []
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for name in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runners[name](block)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / block)
            if name == "agent_window" and window is not None:
                stop_costs.append(window.last_stop_cost_ns * 1e-9)
    time.sleep(1.0)
    hot = hot_path_cost(mon) if target_s < 0.05 else None
    resolver = mon._worker.gpu_resolver
    mon.close()
    plain = times["plain"]
    out = {
        "target_step_s": target_s,
        "batch": b,
        "calibration_step_s": calib,
        "rounds": rounds,
        "block_steps": block,
        "median_step_s": {v: statistics.median(ts) for v, ts in times.items()},
        "ratio_to_plain": {},
        "window_stop_cost_s_median": statistics.median(stop_costs) if stop_costs else None,
        "hot_path": hot,
        "gpu_rows_resolved": getattr(resolver, "resolved_total", None),
        "gpu_rows_dropped": getattr(resolver, "dropped_total", None),
        "agent_errors": dict(mon.errors),
        "raw_step_s": times,
    }
    for v in VARIANTS[1:]:
        ratios = sorted(a / p for a, p in zip(times[v], plain))
        out["ratio_to_plain"][v] = {
            "median": statistics.median(ratios),
            "p10": ratios[int(0.1 * (len(ratios) - 1))],
            "p90": ratios[int(0.9 * (len(ratios) - 1))],
        }
    # Window cost: extra time of a block with one window over an agent block, spread over the period.
    extra = [(w - a) * block for w, a in zip(times["agent_window"], times["agent"])]
    step_s = statistics.median(times["agent"])
    out["window_extra_s_median"] = statistics.median(extra)
    out["window_amortised_ratio_300_steps"] = statistics.median(extra) / (DEFAULT_WINDOW_PERIOD_STEPS * step_s)
    out["window_amortised_ratio_60_s"] = statistics.median(extra) / 60.0
    return out


def hot_path_cost(mon, reps: int = 5, n: int = 500) -> dict:
    """CPU cost of one empty monitored step (two CUDA event records and deque appends), in µs."""
    per = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with mon.step():
                pass
        t1 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t2 = time.perf_counter_ns()
        per.append(((t1 - t0) - (t2 - t1)) / n / 1000)
        time.sleep(2.2)  # let the agent thread resolve and recycle the events
    # For scale: one CUDA event record and one tiny kernel launch on this machine (same clock).
    ev = torch.cuda.Event(enable_timing=True)
    tiny = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        ev.record()
    t1 = time.perf_counter_ns()
    for _ in range(2000):
        tiny.add_(1)
    t2 = time.perf_counter_ns()
    torch.cuda.synchronize()
    return {
        "empty_step_us_median": statistics.median(per),
        "empty_step_us_all": per,
        "event_record_us": (t1 - t0) / 2000 / 1000,
        "tiny_kernel_launch_us": (t2 - t1) / 2000 / 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-overhead-out"))
    ap.add_argument("--targets", default="0.01,0.1")
    ap.add_argument("--rounds", default="16,4")
    ap.add_argument("--block", default="40,20")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--t", type=int, default=512)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}
    path = os.path.join(args.out, "gpu_overhead.json")
    targets = [float(x) for x in args.targets.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    blocks = [int(x) for x in args.block.split(",")]
    for target, r, blk in zip(targets, rounds, blocks):
        t0 = time.perf_counter()
        res = bench(target, r, blk, args.d, args.layers, args.t, os.path.join(args.out, "runs"))
        res["wall_s"] = time.perf_counter() - t0
        result[f"step_{int(target * 1000)}ms"] = res
        print(json.dumps({k: v for k, v in res.items() if k != "raw_step_s"}, default=str), flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
