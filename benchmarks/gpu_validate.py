"""Validate the GPU signals on a real GPU: planted faults, agreement with an independent trace analysis,
and several ranks (gloo) on one GPU.

Run on a CUDA machine: ``python benchmarks/gpu_validate.py --out DIR``. Writes ``DIR/gpu_validate.json``
(every figure quoted in docs/gpu-validation.md), the windows' Chrome traces under ``DIR/traces/`` and
small fixtures for the CPU unit tests under ``DIR/fixtures/``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import device_env, median, read_rows, write_results  # noqa: E402
from gpu_truth import truth_from_trace  # noqa: E402
from gpu_workload import Fragmenter, make_batches, make_model, train_step  # noqa: E402

import ranksight  # noqa: E402
import ranksight.format.schema  # noqa: E402

SCENARIOS = ["baseline", "pageable", "cpu_layernorm", "item", "fragment"]
SHARES = ["compute_kernel_ratio", "comm_kernel_ratio", "memcpy_ratio", "h2d_copy_ratio", "idle_ratio"]


def run_scenario(name: str, args, out: str) -> dict:
    """Train ``args.steps`` monitored steps with one fault planted; return what the agent recorded."""
    dev = "cuda"
    pinned = name != "pageable"
    model = make_model(args.d, args.layers, dev, cpu_layernorm=name == "cpu_layernorm")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(4, args.b, args.t, args.d, pinned)
    frag = Fragmenter(dev) if name == "fragment" else None
    trace_dir = os.path.join(out, "traces", name)
    mon = ranksight.init(
        run_dir=os.path.join(out, "runs"),
        job="gpu-validate",
        run_id=f"val-{name}",
        flush_interval_s=0.5,
        gpu=dict(
            trace_first_step=args.window_at,
            trace_steps=2,
            trace_every_steps=10_000,
            trace_dir=trace_dir,
            allocator_every_s=0.5,
            snapshot_every_s=0.5,
        ),
    )
    mon.watch(model, optimizer=opt)
    for i in range(args.steps):
        with mon.step():
            train_step(model, opt, batches[i % len(batches)], dev, pinned, fault=name, fragmenter=frag)
    torch.cuda.synchronize()
    time.sleep(1.5)  # let NVML and the allocator sampler take a reading at the end
    if name == "fragment":
        record_snapshot_fixture(out)
    mon.close()
    run_path = mon.run_path
    steps = read_rows(run_path, "steps")
    samples = read_rows(run_path, "samples")
    events = read_rows(run_path, "events")
    by_name: dict[str, list[float]] = {}
    for s in samples:
        by_name.setdefault(s["name"], []).append(s["value"])
    window = {k: v[-1] for k, v in by_name.items() if k in ranksight.format.schema.SAMPLE_NAMES}
    res = {
        "steps_recorded": len(steps),
        "steps_with_gpu_columns": sum(1 for r in steps if r["gpu_step_s"] is not None),
        "median_step_s": median(r["step_s"] for r in steps[5:]),
        "median_gpu_step_s": median(r["gpu_step_s"] for r in steps[5:]),
        "median_h2d_s": median(r["h2d_s"] for r in steps[5:]),
        "median_gpu_compute_s": median(r["gpu_compute_s"] for r in steps[5:]),
        "samples_last": window,
        "nvml_util_mean": statistics.mean(by_name["gpu_utilization_ratio"])
        if "gpu_utilization_ratio" in by_name
        else None,
        "nvml_util_samples": len(by_name.get("gpu_utilization_ratio", [])),
        "fragmentation_max": max(by_name["memory_fragmentation_ratio"])
        if "memory_fragmentation_ratio" in by_name
        else None,
        "events": [f"{e['level']} {e['component']}: {e['message']}" for e in events],
        "agent_errors": dict(mon.errors),
    }
    traces = sorted(os.listdir(trace_dir)) if os.path.isdir(trace_dir) else []
    if traces:
        path = os.path.join(trace_dir, traces[0])
        with open(path) as f:
            trace = json.load(f)
        truth = truth_from_trace(trace)
        res["truth"] = truth
        res["agreement_pp"] = {
            k: round(100 * abs(window[k] - truth[k]), 3) for k in SHARES if k in window and k in truth
        }
        res["hta"] = hta_breakdown(trace_dir)
        if name in ("baseline", "pageable", "cpu_layernorm", "item"):
            with gzip.open(os.path.join(out, "fixtures", f"window_{name}.json.gz"), "wt") as f:
                json.dump(trace, f)
    del model, opt, batches, frag
    torch.cuda.empty_cache()
    return res


def record_snapshot_fixture(out: str) -> None:
    """Save a trimmed allocator snapshot plus the allocator's own counters to cross-check it on CPU."""
    torch.cuda.synchronize()
    snap = torch.cuda.memory_snapshot()
    stats = torch.cuda.memory_stats()
    segs = [
        {
            "device": s["device"],
            "total_size": s["total_size"],
            "allocated_size": s["allocated_size"],
            "segment_type": s.get("segment_type"),
            "blocks": [{"size": b["size"], "state": b["state"]} for b in s["blocks"]],
        }
        for s in snap
    ]
    keys = [
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "allocated_bytes.all.current",
        "inactive_split_bytes.all.current",
        "inactive_split.all.current",
    ]
    with gzip.open(os.path.join(out, "fixtures", "snapshot_fragmented.json.gz"), "wt") as f:
        json.dump({"segments": segs, "memory_stats": {k: stats.get(k) for k in keys}}, f)


def hta_breakdown(trace_dir: str):
    """Holistic Trace Analysis' temporal breakdown of the whole trace file, when HTA is importable."""
    try:
        from hta.trace_analysis import TraceAnalysis

        df = TraceAnalysis(trace_dir=trace_dir).get_temporal_breakdown(visualize=False)
        return {k: float(v) for k, v in df.iloc[0].to_dict().items()}
    except Exception as exc:  # HTA is optional here (carried as wheels)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def nccl_single_rank(args, out: str) -> dict:
    """One-rank NCCL DDP, to see communication kernels in the window (NCCL cannot share one GPU)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        model = DDP(make_model(args.d, args.layers), device_ids=[0], bucket_cap_mb=4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        batches = make_batches(2, args.b, args.t, args.d, True)
        trace_dir = os.path.join(out, "traces", "nccl1")
        mon = ranksight.init(
            run_dir=os.path.join(out, "runs"),
            job="gpu-validate",
            run_id="val-nccl1",
            flush_interval_s=0.5,
            gpu=dict(trace_first_step=args.window_at, trace_steps=2, trace_every_steps=10_000, trace_dir=trace_dir),
        )
        mon.watch(model, optimizer=opt)
        for i in range(args.steps):
            with mon.step():
                train_step(model, opt, batches[i % 2], "cuda", True)
        torch.cuda.synchronize()
        mon.close()
        samples = {s["name"]: s["value"] for s in read_rows(mon.run_path, "samples")}
        steps = read_rows(mon.run_path, "steps")
        res = {
            "samples_last": samples,
            "median_gpu_compute_s": median(r["gpu_compute_s"] for r in steps[5:]),
            "median_compute_s": median(r["compute_s"] for r in steps[5:]),
            "agent_errors": dict(mon.errors),
        }
        traces = sorted(os.listdir(trace_dir)) if os.path.isdir(trace_dir) else []
        if traces:
            with open(os.path.join(trace_dir, traces[0])) as f:
                truth = truth_from_trace(json.load(f))
            res["truth"] = truth
            res["agreement_pp"] = {
                k: round(100 * abs(samples[k] - truth[k]), 3) for k in SHARES if k in samples and k in truth
            }
        return res
    finally:
        dist.destroy_process_group()


def _gloo_rank(rank: int, world: int, args, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), RANKSIGHT_RUN_ID="val-gloo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29612", rank=rank, world_size=world)
    model = DDP(make_model(args.d, 2), device_ids=[0], bucket_cap_mb=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(2, max(1, args.b // 4), args.t, args.d, True)
    mon = ranksight.init(
        run_dir=os.path.join(out, "runs"),
        job="gpu-validate",
        flush_interval_s=0.5,
        gpu=dict(trace_first_step=10, trace_steps=2, trace_every_steps=10_000),
    )
    mon.watch(model, optimizer=opt)
    extra = torch.randn(4096, 4096, device="cuda")
    for i in range(30):
        with mon.step():
            x, y = batches[i % 2]
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out_ = model(x)
                if rank == world - 1:  # the planted straggler: extra GPU work inside the forward
                    for _ in range(20):
                        extra = (extra @ extra).tanh_()
            torch.nn.functional.mse_loss(out_.float(), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    mon.close()
    dist.destroy_process_group()


def gloo_ranks(args, out: str, world: int = 3) -> dict:
    """Several ranks on the one GPU through gloo; the last rank does extra GPU work (a straggler)."""
    import torch.multiprocessing as mp

    mp.start_processes(_gloo_rank, args=(world, args, out), nprocs=world, start_method="spawn")
    run_path = os.path.join(out, "runs", "val-gloo")
    steps = read_rows(run_path, "steps")
    buckets = read_rows(run_path, "buckets")
    samples = read_rows(run_path, "samples")
    per_rank = {}
    for r in range(world):
        rs = [s for s in steps if s["rank"] == r][5:]
        per_rank[r] = {
            "steps": len(rs) + 5,
            "median_step_s": median(s["step_s"] for s in rs),
            "median_compute_s": median(s["compute_s"] for s in rs),
            "median_gpu_compute_s": median(s["gpu_compute_s"] for s in rs),
            "median_gpu_step_s": median(s["gpu_step_s"] for s in rs),
            "buckets": sum(1 for b in buckets if b["rank"] == r),
            "window_samples": sorted({s["name"] for s in samples if s["rank"] == r}),
        }
    return per_rank


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-validate-out"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--window-at", type=int, default=20)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--t", type=int, default=512)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    out = args.out
    os.makedirs(os.path.join(out, "fixtures"), exist_ok=True)
    device_env()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}
    path = os.path.join(out, "gpu_validate.json")
    parts = [(n, lambda n=n: run_scenario(n, args, out)) for n in SCENARIOS]
    parts += [("nccl1", lambda: nccl_single_rank(args, out)), ("gloo", lambda: gloo_ranks(args, out))]
    for name, fn in parts:
        if args.only and name not in args.only.split(","):
            continue
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception:
            result[name] = {"error": traceback.format_exc()[-2000:]}
        result[name]["wall_s"] = round(time.perf_counter() - t0, 2) if isinstance(result[name], dict) else None
        print(f"== {name}: {json.dumps(result[name], default=str)[:3000]}", flush=True)
        write_results(path, result, arms=[n for n, _ in parts if not args.only or n in args.only.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
