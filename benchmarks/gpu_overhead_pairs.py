"""The agent's overhead on a 2-GPU DDP job over NCCL, as whole runs with the agent on and off, alternating.

Every cost the agent has (the hot path's event records and hooks, the agent thread's flushes holding
the GIL, NCCL's collective timing, the flight-recorder reads) lands in the run that has it: unlike
two models in one process, the agent thread cannot slow the plain loop it is compared with.

``python benchmarks/gpu_overhead_pairs.py pairs --out DIR [--rounds 4] [--variants off on on_k8]``
    runs ``torchrun --nproc-per-node 2`` once per variant and round, the order rotated every round, and
    writes ``DIR/gpu_overhead_pairs.json``: per variant the mean step time of every run, and per round the
    ratio of each agent variant to that round's ``off`` run; the figure is the median ratio with its
    spread (min, max; the IQR once there are 4 rounds or more).
``torchrun --nproc-per-node 2 benchmarks/gpu_overhead_pairs.py run --variant on --out DIR``
    one run: ``--warmup`` steps, then ``--steps`` steps timed in blocks of 100 between
    ``cuda.synchronize()`` + ``barrier()`` (never inside a block), so the mean step time includes every
    flush of the agent thread that fell inside. Agent variants then time the one-off cost of a sampled
    kernel window: blocks of 60 steps with and without one forced inside (reported apart, never in the
    ratio), and the flight recorder's read cost.

Variants: ``off`` (no agent), ``on`` (the defaults: GPU events every step, NVML, allocator, collective
timing with NCCL's own timing, flight recorder read every 30 s; the kernel window held back until the
window measurement), ``on_k8`` (GPU events on one step in 8).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {"off": None, "on": {}, "on_k8": {"events_every_steps": 8}}
BLOCK = 100
WINDOW_BLOCK = 60


def _timed_blocks(step, n_blocks: int, block: int, torch, dist) -> list[float]:
    out = []
    for _ in range(n_blocks):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        torch.cuda.synchronize()
        dist.barrier()
        out.append((time.perf_counter() - t0) / block)
    return out


def run(args) -> int:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_workload import make_batches, make_model, train_step

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(make_model(args.d, args.layers), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(2, args.batch, args.t, args.d, True)
    gpu_opts = VARIANTS[args.variant]
    mon = None
    if gpu_opts is not None:
        import ranksight

        hold = {"trace_first_step": 10**9, "trace_every_steps": 10**9, "trace_every_s": 10**9}
        mon = ranksight.init(
            run_dir=os.path.join(args.out, "runs"),
            job="gpu-overhead-pairs",
            run_id=f"{args.variant}-{args.tag}",
            gpu={**hold, **gpu_opts},
        )
        mon.watch(model, optimizer=opt)
    i = [0]

    def step_plain():
        train_step(model, opt, batches[i[0] % 2], "cuda", True)
        i[0] += 1

    def step_agent():
        with mon.data():
            batch = batches[i[0] % 2]
        with mon.step():
            train_step(model, opt, batch, "cuda", True)
        i[0] += 1

    step = step_plain if mon is None else step_agent
    _timed_blocks(step, max(1, args.warmup // BLOCK), BLOCK, torch, dist)
    worker = mon._worker if mon is not None else None
    flush0 = (worker.flush_seconds_total, worker.flushes_total) if worker is not None else (0.0, 0)
    blocks = _timed_blocks(step, args.steps // BLOCK, BLOCK, torch, dist)
    out = {
        "variant": args.variant,
        "tag": args.tag,
        "batch": args.batch,
        "block_step_s": blocks,
        "mean_step_s": statistics.fmean(blocks),
        "median_block_step_s": statistics.median(blocks),
    }
    if mon is not None:
        # Flushes during the timed blocks only (the first one opens the spool and NVML: a one-off).
        n_flush = worker.flushes_total - flush0[1]
        out["agent_flushes_timed"] = n_flush
        out["agent_thread_s_per_flush"] = (worker.flush_seconds_total - flush0[0]) / max(1, n_flush)
        nccl = getattr(worker._assembler, "collective_gpu", None)
        out["nccl_timing"] = (
            None
            if nccl is None
            else {
                "dumps": nccl.dumps_total,
                "dump_s_per_read": nccl.dump_seconds_total / max(1, nccl.dumps_total),
                "steps": dict(nccl.stats),
            }
        )
        window = getattr(getattr(mon, "_gpu", None), "window", None)
        extra = []
        for _ in range(args.window_reps if window is not None else 0):
            plain = _timed_blocks(step, 1, WINDOW_BLOCK, torch, dist)[0]
            window.next_step = mon.steps_recorded + 5
            window.next_ns = 0
            with_window = _timed_blocks(step, 1, WINDOW_BLOCK, torch, dist)[0]
            window.next_step = 10**12  # no further window
            extra.append((with_window - plain) * WINDOW_BLOCK)
        out["window_one_off_s"] = extra
        out["steps_per_timed_flush"] = len(blocks) * BLOCK / max(1, n_flush)
        if args.tag == "r0":  # the training thread's own cost of an empty monitored step, once per variant
            per = []
            for _ in range(2):
                t0 = time.perf_counter_ns()
                for _ in range(400):
                    with mon.data():
                        pass
                    with mon.step():
                        pass
                per.append((time.perf_counter_ns() - t0) / 400 / 1000)
                time.sleep(2.2)  # let the agent thread resolve and recycle the events
            out["empty_step_us"] = per
        out["agent_errors"] = dict(mon.errors)
        mon.close()
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def _one(variant: str, tag: str, args) -> dict:
    cmd = [
        "torchrun",
        "--nproc-per-node",
        str(args.nproc),
        os.path.abspath(__file__),
        "run",
        "--variant",
        variant,
        "--tag",
        tag,
        "--out",
        args.out,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch",
        str(args.batch),
        "--layers",
        str(args.layers),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout_s)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.perf_counter() - t0
            return res
    return {"variant": variant, "tag": tag, "error": (proc.stderr or proc.stdout)[-2000:]}


def _spread(xs: list[float]) -> dict:
    xs = sorted(xs)
    out = {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "all": xs}
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        out["p25"], out["p75"] = q[0], q[2]
    return out


def pairs(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    runs: list[dict] = []
    ratios: dict[str, list[float]] = {v: [] for v in args.variants if v != "off"}
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants) :] + args.variants[: r % len(args.variants)]
        if r % 2:
            order = order[::-1]
        got = {}
        for v in order:
            res = _one(v, f"r{r}", args)
            runs.append(res)
            got[v] = res
            print(json.dumps({k: res.get(k) for k in ("variant", "tag", "mean_step_s", "wall_s", "error")}), flush=True)
        base = got.get("off", {}).get("mean_step_s")
        for v in ratios:
            if base and got.get(v, {}).get("mean_step_s"):
                ratios[v].append(got[v]["mean_step_s"] / base)
    result = {
        "args": vars(args),
        "ratio_to_off": {v: _spread(rs) for v, rs in ratios.items() if rs},
        "mean_step_s": {v: [x.get("mean_step_s") for x in runs if x["variant"] == v] for v in args.variants},
        "window_one_off_s": [s for x in runs for s in x.get("window_one_off_s", [])],
        "runs": runs,
    }
    with open(os.path.join(args.out, "gpu_overhead_pairs.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(
        json.dumps(
            {
                "ratio_to_off": {v: {k: s[k] for k in s if k != "all"} for v, s in result["ratio_to_off"].items()},
                "window_one_off_s": result["window_one_off_s"],
            }
        ),
        flush=True,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "pairs"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=os.environ.get("OUT", "gpu-overhead-pairs"))
        p.add_argument("--steps", type=int, default=1500)
        p.add_argument("--warmup", type=int, default=600)
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--d", type=int, default=1024)
        p.add_argument("--t", type=int, default=512)
    r = sub.choices["run"]
    r.add_argument("--variant", choices=sorted(VARIANTS), default="on")
    r.add_argument("--tag", default="r0")
    r.add_argument("--window-reps", type=int, default=2)
    p = sub.choices["pairs"]
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["off", "on", "on_k8"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--run-timeout-s", type=float, default=120)
    args = ap.parse_args()
    return run(args) if args.cmd == "run" else pairs(args)


if __name__ == "__main__":
    sys.exit(main())
