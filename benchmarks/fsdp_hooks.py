"""What the FSDP2 hooks add on the training thread, per all-gather and per reduce-scatter.

One process, a 1-rank gloo group and a real FSDP2 model watched by a real monitor; the hooks of its
first unit are driven directly with the collective itself replaced by a no-op, so what is timed is the
agent's own code: the issue wrapper, the wait wrapper (one ``collectives`` event) and the
reduce-scatter wrapper, against calling the no-op directly. Interleaved blocks, medians.

    python benchmarks/fsdp_hooks.py [--calls 20000] [--json benchmarks/results/cpu_fsdp_hooks.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import write_results  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
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
    results: dict[str, list[float]] = {"plain_ns": [], "all_gather_ns": [], "reduce_scatter_ns": []}
    with mon.step():
        for _ in range(args.blocks):
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                noop(comm, out, inp, None)
            results["plain_ns"].append((time.perf_counter_ns() - t0) / args.calls)
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                hooks.all_gather(noop, comm, (out, inp, None), {})
                hooks.wait_for_unshard()
            results["all_gather_ns"].append((time.perf_counter_ns() - t0) / args.calls)
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                hooks.reduce_scatter(noop, comm, (inp, out, None, None), {})
            results["reduce_scatter_ns"].append((time.perf_counter_ns() - t0) / args.calls)
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
    if args.json:
        write_results(args.json, {"summary": summary, "blocks": results})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
