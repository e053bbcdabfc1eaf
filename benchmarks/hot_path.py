"""Hot-path cost of the agent on the training thread, in microseconds per step (CPU, one process).

Two measurements, each as interleaved A/B blocks in one run (blocks alternate so machine noise hits
both sides alike); the figure is the median over blocks of (monitored - plain) per step:

1. ``step+loader``: ``for b in mon.loader(data): with mon.step(): pass`` against a plain loop.
2. ``watched step``: what ``mon.watch(model, opt)``'s hooks (forward pre-hook, optimizer pre/post hooks)
   add to a tiny model's forward/backward/optimizer step already inside loader and step marks: the same
   model with its hooks switched off and on between blocks (ABBA), in wall time and in the training
   thread's own CPU time. The hot path of a watched step is the two figures' sum.
3. ``components``: each part alone in tight loops (the empty monitored step, the forward hook, the optimizer
   hooks, PyTorch's dispatch to them included) and their sum: the least noisy figure.
4. ``--fsdp`` (alone): what the FSDP2 hooks add per all-gather and per reduce-scatter, interleaved blocks.

Usage: ``python benchmarks/hot_path.py [--blocks 30] [--steps 2000] [--json OUT]``;
``python benchmarks/hot_path.py --fsdp [--calls 20000] [--blocks 7] [--json OUT]``
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from _harness import alternating, cli, free_port, loop_us, quantile, write_results


def bench_step_and_loader(mon, blocks: int, steps: int) -> list[float]:
    """Per block, the µs per step that ``mon.loader`` + ``mon.step()`` add to an empty loop."""
    data = list(range(steps))

    def plain():
        for _ in data:
            pass

    def monitored():
        for _ in mon.loader(data):
            with mon.step():
                pass

    return [(b[0] - a[0]) / steps * 1e6 for a, b in alternating(plain, monitored, blocks)]


def bench_watched_step(mon, blocks: int, steps: int) -> tuple[list[float], list[float], float]:
    """Wall and training-thread CPU time that ``watch()``'s hooks add per step: one model and optimizer,
    their hooks switched off and on between blocks (ABBA), every block through ``mon.loader`` and
    ``mon.step`` (their cost is the first figure). The same tensors on both sides, so the difference is the
    hooks' and PyTorch's dispatch to them; the CPU figure leaves out time the thread waited for a core."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, optimizer=opt)
    hooks = [(d, dict(d)) for d in (model._forward_pre_hooks, opt._optimizer_step_pre_hooks,
                                    opt._optimizer_step_post_hooks)]  # fmt: skip
    data = [torch.randn(8, 16) for _ in range(steps)]

    def loop():
        for x in mon.loader(data):
            with mon.step():
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

    def plain():
        for d, _ in hooks:
            d.clear()
        loop()

    def watched():
        for d, saved in hooks:
            d.update(saved)
        loop()

    pairs = alternating(plain, watched, blocks)
    deltas = [(b[0] - a[0]) / steps * 1e6 for a, b in pairs]
    cpu_deltas = [(b[1] - a[1]) / steps * 1e6 for a, b in pairs]
    return deltas, cpu_deltas, statistics.median(a[0] / steps * 1e6 for a, _ in pairs)


def bench_components(mon, calls: int = 20000, repeats: int = 9) -> dict:
    """Each part of a watched step's hot path timed alone (best of ``repeats`` loops of ``calls``): the empty
    monitored step, the forward call with and without the agent's pre-hook (PyTorch's dispatch to a hook
    included), ``optimizer.step()`` with and without its pre/post hooks. Tight loops on one core: far less
    spread than the A/B blocks, and the sum of the parts is what the agent adds per step."""
    import torch

    def best(fn) -> float:
        return min(loop_us(fn, calls) for _ in range(repeats))

    torch.manual_seed(0)
    model, x = torch.nn.Linear(16, 4), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx = mon.step()

    def empty_step():
        with ctx:
            pass

    def forward():
        mon._fwd_ns = 0  # as at a step's first forward: the hook takes its mark every call
        model(x)

    plain_forward, plain_step = best(forward), best(opt.step)
    mon.watch(model, optimizer=opt)
    mon._in_step = True
    try:
        hooked_forward, hooked_step = best(forward), best(opt.step)
    finally:
        mon._in_step = False
    parts = {
        "empty_step_us": best(empty_step),
        "forward_hook_us": hooked_forward - plain_forward,
        "optimizer_hooks_us": hooked_step - plain_step,
    }
    parts["total_us"] = sum(parts.values())
    return parts


def bench_fsdp_hooks(calls: int, blocks: int) -> dict:
    """What the FSDP2 hooks add on the training thread, per all-gather and per reduce-scatter: a 1-rank gloo
    group and a real FSDP2 model watched by a real monitor; the hooks of its first unit driven directly with
    the collective replaced by a no-op, so what is timed is the agent's own code (the issue wrapper, the wait
    wrapper with its one ``collectives`` event, the reduce-scatter wrapper) against calling the no-op."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 1))
    fully_shard(model[0])
    fully_shard(model)
    mon = ranksight.init(run_dir=tempfile.mkdtemp(), job="bench", flush_interval_s=0.2)
    mon.watch(model)
    recorder = mon._closers[-1]
    hooks = recorder.units[0]
    hooks.original_wait = lambda: None  # FSDP2's copy-out is not the agent's cost
    out, inp = torch.empty(128), torch.empty(64)

    def noop(comm, *a, **k):
        return None

    comm = hooks.group._all_gather_comm

    def all_gather():
        hooks.all_gather(noop, comm, (out, inp, None), {})
        hooks.wait_for_unshard()

    calls_of = {"plain_ns": lambda: noop(comm, out, inp, None), "all_gather_ns": all_gather,
                "reduce_scatter_ns": lambda: hooks.reduce_scatter(noop, comm, (inp, out, None, None), {})}  # fmt: skip
    results: dict[str, list[float]] = {name: [] for name in calls_of}
    with mon.step():
        for _ in range(blocks):
            for name, fn in calls_of.items():
                results[name].append(loop_us(fn, calls) * 1000)
            time.sleep(0.3)  # let the agent thread drain the events between blocks
    mon.close()
    plain = statistics.median(results["plain_ns"])
    summary = {
        "all_gather_us": (statistics.median(results["all_gather_ns"]) - plain) / 1000,
        "reduce_scatter_us": (statistics.median(results["reduce_scatter_ns"]) - plain) / 1000,
        "torch": torch.__version__,
        "load_avg_1m": os.getloadavg()[0],
    }
    print(
        f"per all-gather (issue + wait wrappers): {summary['all_gather_us']:.2f} us; "
        f"per reduce-scatter: {summary['reduce_scatter_us']:.2f} us (load {summary['load_avg_1m']:.1f})"
    )
    dist.destroy_process_group()
    return {"summary": summary, "blocks": results}


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument(
        "--blocks", "--rounds", dest="blocks", type=int, default=None, help="A/B block pairs (30; --fsdp: 7)"
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--fsdp", action="store_true", help="the FSDP2 hooks alone, per collective")
    parser.add_argument("--calls", type=int, default=20000, help="--fsdp: calls per block")
    args = parser.parse_args()
    if args.fsdp:
        result = bench_fsdp_hooks(args.calls, args.blocks or 7)
        if args.json:
            write_results(args.json, result, rounds=args.blocks or 7)
        return 0
    args.blocks = args.blocks or 30
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch

    import ranksight

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        # A buffer large enough for every block's events (we measure the hot path, not drops), and no flush
        # while the blocks run: the agent thread's own cost is benchmarks/agent_thread_cost.py's figure.
        mon = ranksight.init(
            run_dir=tmp, job="bench", run_id="hot", max_buffered_events=10**7, flush_interval_s=3600, stack_window=False
        )
        loop = bench_step_and_loader(mon, args.blocks, args.steps)
        watched, watched_cpu, base_us = bench_watched_step(mon, args.blocks, args.steps)
        components = bench_components(mon)
        mon.close()
    result = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "blocks": args.blocks,
        "steps_per_block": args.steps,
        "step_and_loader_us": _tails(loop),
        "watched_step_us": _tails(watched),
        "watched_step_thread_cpu_us": _tails(watched_cpu),
        "tiny_step_baseline_us": base_us,
        "components_us": components,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        write_results(args.json, result, rounds=args.blocks)
    return 0


def _tails(values: list[float]) -> dict:
    return {"median": statistics.median(values), "p10": quantile(values, 0.1), "p90": quantile(values, 0.9)}


if __name__ == "__main__":
    sys.exit(main())
