"""Collective timing on NCCL against a torch.profiler trace of the same steps.

Two halves (the GPU machine has no DuckDB):

``torchrun --nproc-per-node 2 benchmarks/gpu_collectives.py run --out DIR --scenario metrics|fsdp2``
    ``metrics``: a DDP GPT-like job that all-reduces its loss for logging and calls ``barrier()`` every
    step; ``fsdp2``: the same model under ``fully_shard`` (bf16 parameters). The agent is attached (its
    own kernel window off) and ``torch.profiler`` traces steps 25-29; each rank writes the agent's run
    folder and ``trace_<scenario>_r<rank>.json``.
``python benchmarks/gpu_collectives.py report DIR``
    per traced step: the agent's figures (DDP's exposed all-reduce and the other collectives' stream
    time, both from CUDA events; host-blocked time) next to the trace's (NCCL kernels launched by the
    training thread vs by autograd's, and how long the last gradient all-reduce ran past the last
    backward kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # as well under ``python -P``, as gpu_round.sh runs it

from _harness import device_env, median, write_results  # noqa: E402

TRACED = range(25, 30)


def run(args) -> int:
    import torch
    import torch.distributed as dist
    from gpu_workload import make_batches, make_model, train_step

    import ranksight

    device_env()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    model = make_model(args.d, args.layers)
    if args.scenario == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batches = make_batches(2, args.batch, args.t, args.d)
    mon = ranksight.init(
        run_dir=os.path.join(args.out, "runs"), job="gpu-collectives", run_id=args.scenario,
        flush_interval_s=0.5, gpu={"trace_window": False, "nccl_timing_every_s": 0},
    )  # fmt: skip
    mon.watch(model, optimizer=opt)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    trace = os.path.join(args.out, f"trace_{args.scenario}_r{rank}.json")
    sched = torch.profiler.schedule(wait=TRACED.start - 3, warmup=3, active=len(TRACED), repeat=1)
    with torch.profiler.profile(
        activities=acts, schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(trace)
    ) as prof:
        for i in range(args.steps):
            with torch.profiler.record_function(f"rs_step_{i}"):
                with mon.data():
                    batch = batches[i % 2]
                with mon.step():
                    x, y = (v.to("cuda", non_blocking=True) for v in batch)
                    loss = train_step(model, opt, x, y)
                    if args.scenario == "metrics":
                        logged = loss.detach().clone()
                        dist.all_reduce(logged)
                        dist.barrier()
            prof.step()
    torch.cuda.synchronize()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------ report (here, with DuckDB)
def _trace_steps(path: str) -> dict[int, dict]:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = {}
    main_tid = None
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("rs_step_") and e.get("cat") == "user_annotation":
            steps[int(name.rsplit("_", 1)[1])] = (e["ts"], e["ts"] + e["dur"])
            main_tid = e.get("tid")
    launches = {}  # correlation -> (ts, tid) of the runtime call that launched a kernel
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = (e["ts"], e.get("tid"))
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    optimizer = [  # the optimizer's step on the training thread: where the step goes on after backward
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("name", "").startswith("Optimizer.step") and e.get("tid") == main_tid
    ]
    out = {}
    for step, (lo, hi) in steps.items():
        user, ddp, compute_from_autograd, opt_starts = [], [], [], []
        by_kind: dict[str, list[float]] = {}  # NCCL kernels by collective: AllReduce, AllGather, ReduceScatter
        for k in kernels:
            ts_tid = launches.get(k.get("args", {}).get("correlation"))
            if ts_tid is None or not lo <= ts_tid[0] <= hi:
                continue
            span = (k["ts"], k["ts"] + k["dur"])
            is_nccl = k["name"].startswith("nccl")
            if is_nccl:
                kind = next(
                    (n for n in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast") if n in k["name"]), "other"
                )
                by_kind.setdefault(kind, []).append(k["dur"] * 1e-6)
            if is_nccl and ts_tid[1] == main_tid:
                user.append(span)
            elif is_nccl:
                ddp.append(span)
            elif ts_tid[1] != main_tid:
                compute_from_autograd.append(span)
            elif any(a <= ts_tid[0] <= b for a, b in optimizer):
                opt_starts.append(span[0])
        last_ddp = max((s[1] for s in ddp), default=None)
        last_bwd = max((s[1] for s in compute_from_autograd if last_ddp is None or s[1] <= last_ddp), default=None)
        first_opt = min(opt_starts, default=None)
        out[step] = {
            "user_nccl_s": sum(b - a for a, b in user) * 1e-6,
            "grad_nccl_s": sum(b - a for a, b in ddp) * 1e-6,
            "grad_exposed_s": (last_ddp - last_bwd) * 1e-6 if last_ddp and last_bwd else None,
            # From backward's last kernel to the optimizer's first: the exposed all-reduce plus what else
            # the GPU did or waited for in between (DDP copying the reduced buckets into .grad, the host).
            "until_optimizer_s": (first_opt - last_bwd) * 1e-6 if first_opt and last_bwd else None,
            "nccl_by_kind": {kind: [len(ds), sum(ds)] for kind, ds in by_kind.items()},
        }
    return out


_OPS_OF_KIND = {
    "AllReduce": "all_reduce barrier",
    "AllGather": "all_gather_into_tensor all_gather all_gather_single all_gather_forward all_gather_backward",
    "ReduceScatter": "reduce_scatter_tensor reduce_scatter reduce_scatter_single",
    "Broadcast": "broadcast",
}
_KIND_OF_OP = {op: kind for kind, ops in _OPS_OF_KIND.items() for op in ops.split()}


def _agreement(con, rank: int, prof: dict) -> list[dict]:
    """Per traced step and NCCL kernel kind: the agent's ``gpu_s`` (NCCL's own start/end events, from
    the flight recorder) against the sum of that kind's kernels in the trace, and the counts."""
    rows = con.execute(
        "SELECT step, op, origin, sum(count), sum(gpu_s) FROM collectives WHERE rank = ? AND step BETWEEN ? AND ? "
        "AND gpu_s IS NOT NULL GROUP BY step, op, origin ORDER BY step",
        [rank, TRACED.start, TRACED.stop - 1],
    ).fetchall()
    agent: dict[tuple, list] = {}
    for step, op, _origin, n, gpu_s in rows:
        kind = _KIND_OF_OP.get(op, op)
        agg = agent.setdefault((step, kind), [0, 0.0])
        agg[0] += n
        agg[1] += gpu_s
    out = []
    for (step, kind), (n, gpu_s) in sorted(agent.items()):
        trace_n, trace_s = prof.get(step, {}).get("nccl_by_kind", {}).get(kind, [0, 0.0])
        row = {"step": step, "kind": kind, "agent_count": n, "trace_kernels": trace_n, "agent_gpu_s": gpu_s}
        out.append({**row, "trace_kernel_s": trace_s, "rel_diff": (gpu_s - trace_s) / trace_s if trace_s else None})
    return out


def report(out_dir: str) -> int:
    from ranksight.collectors import open_run

    result = {}
    for scenario in ("metrics", "fsdp2"):
        run_path = os.path.join(out_dir, "runs", scenario)
        if not os.path.isdir(run_path):
            continue
        con = open_run(run_path)
        for rank in (0, 1):
            trace = os.path.join(out_dir, f"trace_{scenario}_r{rank}.json")
            prof = _trace_steps(trace) if os.path.exists(trace) else {}
            rows = con.execute(
                "SELECT step, gpu_step_s, gpu_comm_exposed_s, gpu_comm_blocked_s, comm_blocked_s, collectives "
                "FROM steps WHERE rank = ? AND step BETWEEN ? AND ? ORDER BY step",
                [rank, TRACED.start, TRACED.stop - 1],
            ).fetchall()
            agree = _agreement(con, rank, prof)
            result[f"{scenario}_gpu_s_r{rank}"] = agree
            totals: dict[str, list] = {}
            for a in agree:
                t = totals.setdefault(a["kind"], [0.0, 0.0, 0, 0])
                t[0] += a["agent_gpu_s"]
                t[1] += a["trace_kernel_s"]
                t[2] += a["agent_count"]
                t[3] += a["trace_kernels"]
            for kind, (ag, tr, n_a, n_t) in totals.items():
                diff = f"{(ag - tr) / tr * 100:+.1f} %" if tr else "-"
                print(
                    f"{scenario} rank {rank} gpu_s {kind:13s} agent {ag * 1e3:8.3f} ms ({n_a} calls)  "
                    f"trace {tr * 1e3:8.3f} ms ({n_t} kernels)  {diff}  [steps {TRACED.start}-{TRACED.stop - 1}]"
                )
            per_step = []
            for step, gpu_step, exposed, blocked, host_blocked, n in rows:
                p = prof.get(step, {})
                per_step.append({
                    "step": step, "gpu_step_s": gpu_step, "agent_grad_exposed_s": exposed,
                    "trace_grad_exposed_s": p.get("grad_exposed_s"), "agent_other_collectives_gpu_s": blocked,
                    "trace_user_nccl_s": p.get("user_nccl_s"), "trace_grad_nccl_s": p.get("grad_nccl_s"),
                    "trace_until_optimizer_s": p.get("until_optimizer_s"),
                    "host_blocked_s": host_blocked, "collectives": n,
                })  # fmt: skip
            result[f"{scenario}_r{rank}"] = per_step
            keys = ("agent_grad_exposed_s", "trace_grad_exposed_s", "trace_until_optimizer_s")
            keys += ("agent_other_collectives_gpu_s", "trace_user_nccl_s", "trace_grad_nccl_s", "host_blocked_s")
            for key in keys:
                med = median(r[key] for r in per_step)
                med = med * 1e3 if med is not None else None
                print(f"{scenario} rank {rank} {key:32s} median {med if med is None else round(med, 3)} ms")
        ops = con.execute(
            "SELECT op, origin, sum(count), sum(bytes), round(sum(blocked_s), 4), round(sum(gpu_s), 4), "
            "count(gpu_s) FROM collectives WHERE rank = 0 GROUP BY op, origin ORDER BY op"
        ).fetchall()
        print(scenario, "collectives (rank 0):", ops)
        result[f"{scenario}_collectives_r0"] = ops
    write_results(os.path.join(out_dir, "gpu_collectives.json"), result, arms=["metrics", "fsdp2"])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default=os.environ.get("OUT", "gpu-collectives"))
    r.add_argument("--scenario", choices=("metrics", "fsdp2"), default="metrics")
    r.add_argument("--steps", type=int, default=40)
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--d", type=int, default=1024)
    r.add_argument("--layers", type=int, default=4)
    r.add_argument("--t", type=int, default=512)
    rep = sub.add_parser("report")
    rep.add_argument("out")
    args = ap.parse_args()
    return run(args) if args.cmd == "run" else report(args.out)


if __name__ == "__main__":
    sys.exit(main())
