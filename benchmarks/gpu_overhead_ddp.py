"""Overhead of the agent on a multi-GPU DDP job over NCCL: interleaved blocks with the agent on and off.

Launch with torchrun, one rank per GPU::

    torchrun --nproc-per-node 2 benchmarks/gpu_overhead_ddp.py --out DIR

Every rank runs the same blocks in the same rotated order (they all-reduce together):

  plain         DDP training steps, nothing else
  agent         the same DDP model with a monitor attached (CUDA-event phases, NVML, allocator, collective
                timing, the data marks; no kernel-level window inside the block)
  agent_window  as ``agent`` with one sampled kernel-level window forced inside the block: its one-off cost

Each block is timed between two ``cuda.synchronize()`` + ``barrier()`` (never inside). ``plain`` and
``agent`` alternate in many short rounds (order flipped every round) so that drifts of the machine
cancel; the figure is the median over rounds of ``agent / plain``, with its spread. The window is
measured in a few rounds of its own (``agent`` against ``agent_window``) and reported as seconds per
window, amortised over its default period.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_workload import make_batches, make_model, train_step  # noqa: E402

import ranksight  # noqa: E402

VARIANTS = ["plain", "agent", "agent_window"]
DEFAULT_WINDOW_PERIOD_STEPS = 300


def _time_block(fn, n: int) -> float:
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    fn(n)
    torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - t0) / n


def calibrate(model, opt, target_s: float, d: int, t: int) -> int:
    """Rank 0 picks the smallest power-of-two batch whose DDP step takes >= 0.75 x target; all use it."""
    b = 1
    while True:
        batches = make_batches(2, b, t, d, True)
        step_s = _time_block(
            lambda n, bb=batches: [train_step(model, opt, bb[i % 2], "cuda", True) for i in range(n)], 8
        )
        box = [b if step_s >= 0.75 * target_s or b >= 512 else 0]
        dist.broadcast_object_list(box, src=0)
        if box[0]:
            return box[0]
        b *= 2


def hot_path_cost(mon, reps: int = 5, n: int = 400) -> dict:
    """Training-thread cost of one empty monitored step with a marked fetch (event records, marks), in µs."""
    per = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            with mon.data():
                pass
            with mon.step():
                pass
        t1 = time.perf_counter_ns()
        per.append((t1 - t0) / n / 1000)
        time.sleep(2.2)  # let the agent thread resolve and recycle the events
    return {"empty_step_us_median": statistics.median(per), "empty_step_us_all": per}


def profile_one_flush(mon, loop_agent, steps: int) -> str:
    """Where the agent thread's time goes: cProfile of one flush after ``steps`` monitored steps."""
    import cProfile
    import io
    import pstats

    worker = mon._worker
    worker._safe_flush(final=False)  # empty the queue first
    loop_agent(steps)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    worker._safe_flush(final=False)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    return text.getvalue()[-4000:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-overhead-ddp"))
    ap.add_argument("--target", type=float, default=0.010)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--window-rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--t", type=int, default=512)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    ddp = torch.nn.parallel.DistributedDataParallel

    plain_model = ddp(make_model(args.d, args.layers), device_ids=[local])
    agent_model = ddp(make_model(args.d, args.layers), device_ids=[local])
    opt_p = torch.optim.AdamW(plain_model.parameters(), lr=1e-4, foreach=True)
    opt_a = torch.optim.AdamW(agent_model.parameters(), lr=1e-4, foreach=True)
    b = calibrate(plain_model, opt_p, args.target, args.d, args.t)
    batches = make_batches(2, b, args.t, args.d, True)

    mon = ranksight.init(
        run_dir=os.path.join(args.out, "runs"),
        job="gpu-overhead-ddp",
        run_id="overhead-ddp",
        gpu={"trace_first_step": 10**9, "trace_every_steps": 10**9, "trace_every_s": 10**9},
    )
    mon.watch(agent_model, optimizer=opt_a)
    window = getattr(getattr(mon, "_gpu", None), "window", None)

    def loop_plain(n):
        for i in range(n):
            train_step(plain_model, opt_p, batches[i % 2], "cuda", True)

    def loop_agent(n, force_window=False):
        if force_window and window is not None:
            window.next_step = mon.steps_recorded + 5
            window.next_ns = 0
        for i in range(n):
            with mon.data():
                batch = batches[i % 2]
            with mon.step():
                train_step(agent_model, opt_a, batch, "cuda", True)

    runners = {"plain": loop_plain, "agent": loop_agent, "agent_window": lambda n: loop_agent(n, True)}
    for name in VARIANTS:  # warm-up: CUPTI's first start is slow
        runners[name](20)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    window_agent: list[float] = []
    for r in range(args.rounds):
        for name in ("plain", "agent") if r % 2 == 0 else ("agent", "plain"):
            times[name].append(_time_block(runners[name], args.block))
    for r in range(args.window_rounds):
        for name in ("agent", "agent_window") if r % 2 == 0 else ("agent_window", "agent"):
            t = _time_block(runners[name], args.block)
            (window_agent if name == "agent" else times["agent_window"]).append(t)
    time.sleep(1.0)
    resolver = getattr(mon._worker, "gpu_resolver", None)
    errors = dict(mon.errors)
    flush_s, flushes = mon._worker.flush_seconds_total, mon._worker.flushes_total
    hot = hot_path_cost(mon)
    flush_profile = profile_one_flush(mon, loop_agent, args.block)
    mon.close()
    if rank == 0:
        plain = times["plain"]
        out = {
            "device": torch.cuda.get_device_name(local),
            "torch": torch.__version__,
            "world_size": dist.get_world_size(),
            "args": vars(args),
            "batch": b,
            "median_step_s": {v: statistics.median(ts) for v, ts in times.items() if ts},
            "ratio_to_plain": {},
            "agent_errors": errors,
            "agent_thread_seconds_per_flush": flush_s / max(1, flushes),
            "agent_flushes": flushes,
            "hot_path": hot,
            "flush_profile": flush_profile,
            "gpu_rows_resolved": getattr(resolver, "resolved_total", None),
            "gpu_rows_dropped": getattr(resolver, "dropped_total", None),
            "raw_step_s": times,
        }
        ratios = sorted(a / p for a, p in zip(times["agent"], plain))
        out["ratio_to_plain"]["agent"] = {"median": statistics.median(ratios), "p25": ratios[len(ratios) // 4],
                                          "p75": ratios[3 * len(ratios) // 4], "all": ratios}  # fmt: skip
        extra = [(w - a) * args.block for w, a in zip(times["agent_window"], window_agent)]
        out["window_extra_s_median"] = statistics.median(extra)
        out["window_extra_s_all"] = extra
        out["window_amortised_ratio_300_steps"] = statistics.median(extra) / (
            DEFAULT_WINDOW_PERIOD_STEPS * statistics.median(times["agent"])
        )
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_overhead_ddp.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(json.dumps({k: v for k, v in out.items() if k != "raw_step_s"}, default=str), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
