"""Overhead of ranksight and its peers on a 2-rank gloo DDP job (CPU), as step-time ratios to no monitoring.

Each *round* launches the same job once per arm (baseline, ranksight, torch.profiler, TraceML, a 1 s
psutil poller; see ``_peers.py``), in an order rotated every round, so that machine noise falls on all
arms alike. Per launch the figure is rank 0's median iteration time (fetch + step) over the timed
steps; the ratio is that median over the same round's baseline median. Reported per arm: the median
ratio over rounds and its min-max, the throughput ratio (mean iteration time, which includes the
occasional slow step such as a profiler trace export), RSS after the timed steps minus the baseline's,
and the bytes each tool wrote to disk.

Two step sizes: ``5ms`` (width 128, batch 224) and ``50ms`` (width 256, batch 1024); the absolute times
depend on the machine's load and are context only.

Usage: ``python benchmarks/overhead_cpu.py [--sizes 5ms,50ms] [--rounds 3] [--steps 200] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _peers import ARMS, Launch, Workload, run_launch  # noqa: E402

SIZES = {
    "5ms": {"width": 128, "batch": 224},
    "50ms": {"width": 256, "batch": 1024},
}
DEFAULT_STEPS = {"5ms": 200, "50ms": 60}


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def buffer_bound_bytes(max_events: int = 200_000) -> int:
    """Memory held by the agent's event deque when full (EV_STEP tuples, the default bound)."""
    import tracemalloc
    from collections import deque

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    events: deque = deque(maxlen=max_events)
    t = time.perf_counter_ns()
    for step in range(max_events):
        # The shape of a step event: (tag, step, begin, end, fetch_begin, fetch_end, fwd, opt_begin, opt_end).
        events.append(("S", step, t + step, t + step + 1, t + step + 2, t + step + 3, t + 4, t + 5, t + 6))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del events
    return after - before


def run_size(size: str, rounds: int, steps: int, arms: tuple[str, ...], root: str) -> dict:
    """Run ``rounds`` rounds of every arm at one step size; return raw per-launch figures and the summary."""
    workload = Workload(**SIZES[size], steps=steps, warmup_steps=max(10, steps // 10))
    launches = []
    for r in range(rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            out = os.path.join(root, size, f"round{r}", arm)
            run_dir = os.path.join(out, "ranksight-runs")
            t0 = time.time()
            res = run_launch(
                Launch(arm=arm, workload=workload, out_dir=out, run_dir=run_dir, run_id=f"{size}-{r}-{arm}")
            )
            wall = time.time() - t0
            loop0 = res["rank0"]["loop_s"]
            disk = {
                "ranksight": _dir_bytes(run_dir),
                "profiler": _dir_bytes(os.path.join(out, "profiler")),
                "traceml": _dir_bytes(os.path.join(out, "traceml-logs")),
            }.get(arm, 0)
            launches.append(
                {
                    "round": r,
                    "arm": arm,
                    "median_s": statistics.median(loop0),
                    "mean_s": statistics.fmean(loop0),
                    "p10_s": _q(loop0, 0.1),
                    "p90_s": _q(loop0, 0.9),
                    "rss_end": [res[f"rank{k}"]["rss_end"] for k in range(workload.ranks)],
                    "rss_growth": [
                        res[f"rank{k}"]["rss_end"] - res[f"rank{k}"]["rss_start"] for k in range(workload.ranks)
                    ],
                    "aggregator_rss": res["aggregator_rss"],
                    "disk_bytes": disk,
                    "wall_s": wall,
                }
            )
            print(
                f"[{size}] round {r} {arm:9s} median {launches[-1]['median_s'] * 1e3:7.2f} ms  "
                f"mean {launches[-1]['mean_s'] * 1e3:7.2f} ms  ({wall:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return {"workload": asdict(workload), "launches": launches, "summary": summarize(launches, arms)}


def summarize(launches: list[dict], arms: tuple[str, ...]) -> dict:
    """Ratios to the same round's baseline, per arm."""
    by = {(x["round"], x["arm"]): x for x in launches}
    rounds = sorted({x["round"] for x in launches})
    out = {}
    for arm in arms:
        med = [by[r, arm]["median_s"] / by[r, "baseline"]["median_s"] for r in rounds]
        mean = [by[r, arm]["mean_s"] / by[r, "baseline"]["mean_s"] for r in rounds]
        rss = [statistics.fmean(by[r, arm]["rss_end"]) - statistics.fmean(by[r, "baseline"]["rss_end"]) for r in rounds]
        out[arm] = {
            "median_ratio": statistics.median(med),
            "median_ratio_min": min(med),
            "median_ratio_max": max(med),
            "mean_ratio": statistics.median(mean),
            "mean_ratio_min": min(mean),
            "mean_ratio_max": max(mean),
            "step_ms_median": statistics.median(by[r, arm]["median_s"] for r in rounds) * 1e3,
            "rss_delta_mb_per_rank": statistics.median(rss) / 2**20,
            "aggregator_rss_mb": statistics.median(by[r, arm]["aggregator_rss"] for r in rounds) / 2**20,
            "disk_mb": statistics.median(by[r, arm]["disk_bytes"] for r in rounds) / 2**20,
        }
    return out


def _table(size: str, summary: dict) -> str:
    rows = [
        f"\n{size}: ratio of step time to no monitoring (median over rounds, [min-max])",
        f"{'arm':10s} {'median ratio':>22s} {'throughput ratio':>22s} {'step ms':>8s} {'RSS +MB/rank':>12s}",
    ]
    for arm, s in summary.items():
        rows.append(
            f"{arm:10s} {s['median_ratio']:8.3f} [{s['median_ratio_min']:.3f}-{s['median_ratio_max']:.3f}] "
            f"{s['mean_ratio']:8.3f} [{s['mean_ratio_min']:.3f}-{s['mean_ratio_max']:.3f}] "
            f"{s['step_ms_median']:8.2f} {s['rss_delta_mb_per_rank']:12.1f}"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5ms,50ms", help="comma-separated: 5ms,50ms")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=0, help="timed steps per launch (default: 300 at 5ms, 80 at 50ms)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--json", help="write the raw results to this file")
    args = parser.parse_args()
    arms = tuple(a for a in args.arms.split(",") if a)
    if "baseline" not in arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms must include baseline and name only {', '.join(ARMS)}")
    sizes = [s for s in args.sizes.split(",") if s]
    if any(s not in SIZES for s in sizes):
        parser.error(f"--sizes must name only {', '.join(SIZES)}")

    import torch

    try:
        from importlib.metadata import version

        traceml_version = version("traceml-ai")
    except Exception:  # noqa: BLE001 - absent peer: reported as such
        traceml_version = None
    result = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": os.getloadavg()},
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "traceml-ai": traceml_version},
        "rounds": args.rounds,
        "agent_buffer_bound_mb": buffer_bound_bytes() / 2**20,
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="rs-overhead-") as root:
        for size in sizes:
            steps = args.steps or DEFAULT_STEPS[size]
            result["sizes"][size] = run_size(size, args.rounds, steps, arms, root)
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for size, data in result["sizes"].items():
        print(_table(size, data["summary"]))
    print(f"\nagent event buffer when full (200,000 step events): {result['agent_buffer_bound_mb']:.1f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
