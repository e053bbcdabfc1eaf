"""Overhead of ranksight and its peers on a 2-rank gloo DDP job (CPU), as step-time ratios to no monitoring.

Each *round* launches the same job once per arm (baseline, ranksight, torch.profiler, TraceML, a 1 s
psutil poller; see ``_peers.py``), in an order rotated every round, so that machine noise falls on all
arms alike. Per launch the figure is rank 0's median iteration time (fetch + step) over the timed
steps; the ratio is that median over the same round's baseline median. Reported per arm: the median
ratio over rounds and its min-max, the throughput ratio (mean iteration time, which includes the
occasional slow step such as a profiler trace export), process CPU per step, CPU of the training thread
and of the tool's own threads (by thread name), RSS after the timed steps minus the baseline's, the
tool's side process (TraceML's aggregator) and the bytes each tool wrote to disk. The warmup lasts at
least 3 s, past ranksight's first flush (which imports pyarrow), so the timed window is the steady state.

Then, per size, an in-process A/B for ranksight alone: two identical DDP models in each rank, one
watched, timed in alternating blocks (A-B-B-A) — a finer measurement of what ranksight adds to the
training thread, since both sides share the same process and seconds (``--no-ab`` skips it). Three
variants: ranksight as shipped; with ``comm_hook=False``; and as shipped against a plain model that also
runs PyTorch's own Python ``allreduce_hook`` (what a Python comm hook costs DDP by itself).

Two step sizes: ``5ms`` (width 128, batch 224) and ``50ms`` (width 256, batch 1024); the absolute times
depend on the machine's load and are context only.

Usage: ``python benchmarks/overhead_cpu.py [--sizes 5ms,50ms] [--rounds 4] [--no-ab] [--json OUT]``
(about 5 minutes per size on a loaded 2-core machine: run one size per command).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict

from _harness import cli, in_rounds, markdown, quantile, write_results
from _peers import ARMS, Launch, Workload, run_ab, run_launch, versions
from agent_memory import buffer_bound_mb, default_buffer_bound

SIZES = {
    "5ms": {"width": 128, "batch": 224},
    "50ms": {"width": 256, "batch": 1024},
}
# (minimum warmup steps, timed steps). The warmup also lasts at least 3 s (Workload.warmup_min_s), past
# the tools' start-up (the agent's first flush, 2 s in, imports pyarrow); the timed window spans about
# 3 s or more, so the periodic work (flushes every 2 s, 1 s polls, profiler cycles) falls inside it.
DEFAULT_STEPS = {"5ms": (200, 1000), "50ms": (20, 150)}


PER_STEP_CPU = {"cpu_per_step_s": "cpu_s", "train_thread_cpu_per_step_s": "cpu_thread_s",
                "other_threads_cpu_per_step_s": "other_threads_cpu_s"}  # fmt: skip
"""A launch's CPU figures per step (mean over ranks) and the rank's figure each is read from."""


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def run_size(size: str, rounds: int, warmup: int, steps: int, arms: tuple[str, ...], root: str) -> dict:
    """Run ``rounds`` rounds of every arm at one step size; return raw per-launch figures and the summary."""
    workload = Workload(**SIZES[size], steps=steps, warmup_steps=warmup)
    ranks = range(workload.ranks)

    def launch(arm: str, r: int) -> dict:
        out = os.path.join(root, size, f"round{r}", arm)
        run_dir = os.path.join(out, "ranksight-runs")
        t0 = time.time()
        res = run_launch(Launch(arm=arm, workload=workload, out_dir=out, run_dir=run_dir, run_id=f"{size}-{r}-{arm}"))
        loop0, each = res["rank0"]["loop_s"], [res[f"rank{k}"] for k in ranks]
        disk = {"ranksight": run_dir, "profiler": os.path.join(out, "profiler"),
                "traceml": os.path.join(out, "traceml-logs")}.get(arm)  # fmt: skip
        return {
            "arm": arm,
            "median_s": statistics.median(loop0),
            "mean_s": statistics.fmean(loop0),
            "p10_s": quantile(loop0, 0.1),
            "p90_s": quantile(loop0, 0.9),
            "warmup_total_s": sum(res["rank0"]["warmup_s"]),
            **{name: statistics.fmean(e[key] for e in each) / steps for name, key in PER_STEP_CPU.items()},
            "named_threads_cpu_s": [e["named_threads_cpu_s"] for e in each],
            "aggregator_cpu_s": res["aggregator_cpu_s"],
            "imported_rank0": res["rank0"].get("imported"),
            "rss_end": [e["rss_end"] for e in each],
            "rss_growth": [e["rss_end"] - e["rss_start"] for e in each],
            "aggregator_rss": res["aggregator_rss"],
            "disk_bytes": _dir_bytes(disk) if disk else 0,
            "wall_s": time.time() - t0,
            "steps": steps,
        }

    by_arm = in_rounds(arms, rounds, launch, lambda arm, x: f"[{size}] median {x['median_s'] * 1e3:7.2f} ms  "
                       f"mean {x['mean_s'] * 1e3:7.2f} ms  ({x['wall_s']:.0f} s)")  # fmt: skip
    launches = sorted((x for xs in by_arm.values() for x in xs), key=lambda x: (x["round"], arms.index(x["arm"])))
    return {"workload": asdict(workload), "launches": launches, "summary": summarize(launches, arms)}


# In-process A/B blocks per size: (blocks of each kind, steps per block), about 15-20 s per size.
AB_BLOCKS = {"5ms": (40, 50), "50ms": (20, 6)}


# What each A/B variant compares (the watched model against the plain one).
AB_VARIANTS = {
    "ranksight": {},
    "ranksight, comm_hook=False": {"comm_hook": False},
    "ranksight vs plain + PyTorch's Python allreduce_hook": {"plain_python_hook": True},
}


def run_ab_size(size: str, root: str, variant: str) -> dict:
    """ranksight vs the plain model in one process, alternating blocks; ratios per block pair (rank 0)."""
    blocks, block_steps = AB_BLOCKS[size]
    out = os.path.join(root, size, "ab-" + str(list(AB_VARIANTS).index(variant)))
    res = run_ab(Workload(**SIZES[size]), out, blocks, block_steps, AB_VARIANTS[variant])
    ratios = [w / p for w, p in zip(res["watched_s"], res["plain_s"])]
    cpu_ratios = [w / p for w, p in zip(res["watched_cpu_s"], res["plain_cpu_s"])]
    summary = {
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_p25": quantile(cpu_ratios, 0.25),
        "cpu_ratio_p75": quantile(cpu_ratios, 0.75),
        "extra_cpu_us_per_step_median": statistics.median(
            (w - p) * 1e6 for w, p in zip(res["watched_cpu_s"], res["plain_cpu_s"])
        ),
        "pairs": len(ratios),
        "block_steps": block_steps,
        "ratio_median": statistics.median(ratios),
        "ratio_p10": quantile(ratios, 0.1),
        "ratio_p25": quantile(ratios, 0.25),
        "ratio_p75": quantile(ratios, 0.75),
        "ratio_p90": quantile(ratios, 0.9),
        "plain_step_ms": statistics.median(res["plain_s"]) * 1e3,
        "extra_us_per_step_median": statistics.median((w - p) * 1e6 for w, p in zip(res["watched_s"], res["plain_s"])),
    }
    print(
        f"[{size}] in-process A/B {variant}: {summary['ratio_median']:.3f} "
        f"(p25-p75 {summary['ratio_p25']:.3f}-{summary['ratio_p75']:.3f}, {len(ratios)} pairs)",
        file=sys.stderr,
        flush=True,
    )
    return {"raw": res, "summary": summary}


def _tool_threads_cpu_s(launch: dict) -> float:
    """CPU seconds of the threads the tool started (by Python thread name), mean over ranks."""
    per_rank = [sum(v for k, v in named.items() if k != "native") for named in launch["named_threads_cpu_s"]]
    return statistics.fmean(per_rank)


def summarize(launches: list[dict], arms: tuple[str, ...]) -> dict:
    """Ratios to the same round's baseline, per arm: the median over rounds with its min and max."""
    by = {(x["round"], x["arm"]): x for x in launches}
    rounds = sorted({x["round"] for x in launches})
    out = {}

    def each(arm: str, key: str) -> list:
        return [by[r, arm][key] for r in rounds]

    def ratios(arm: str, key: str) -> list[float]:
        return [a / b for a, b in zip(each(arm, key), each("baseline", key))]

    for arm in arms:
        spreads = {
            name: ratios(arm, key)
            for name, key in (("median", "median_s"), ("mean", "mean_s"), ("cpu", "cpu_per_step_s"))
        }
        rss = [statistics.fmean(by[r, arm]["rss_end"]) - statistics.fmean(by[r, "baseline"]["rss_end"]) for r in rounds]
        out[arm] = {
            # Best of rounds (as timeit reports): contention only ever slows a launch down, so the fastest
            # launch of each arm is the least disturbed one.
            "best_ratio": min(each(arm, "median_s")) / min(each("baseline", "median_s")),
            "best_cpu_ratio": min(each(arm, "cpu_per_step_s")) / min(each("baseline", "cpu_per_step_s")),
            **{
                f"{name}_ratio{end}": fn(values)
                for name, values in spreads.items()
                for end, fn in (("", statistics.median), ("_min", min), ("_max", max))
            },
            "train_thread_cpu_ratio": statistics.median(ratios(arm, "train_thread_cpu_per_step_s")),
            "cpu_extra_us_per_step": statistics.median(
                (by[r, arm]["cpu_per_step_s"] - by[r, "baseline"]["cpu_per_step_s"]) * 1e6 for r in rounds
            ),
            "warmup_ratio": statistics.median(ratios(arm, "warmup_total_s")),
            "tool_threads_cpu_us_per_step": statistics.median(_tool_threads_cpu_s(by[r, arm]) for r in rounds)
            / by[rounds[0], arm]["steps"]
            * 1e6,
            "train_thread_cpu_us_per_step": statistics.median(each(arm, "train_thread_cpu_per_step_s")) * 1e6,
            "other_threads_cpu_us_per_step": statistics.median(each(arm, "other_threads_cpu_per_step_s")) * 1e6,
            "step_ms_median": statistics.median(each(arm, "median_s")) * 1e3,
            "rss_delta_mb_per_rank": statistics.median(rss) / 2**20,
            "aggregator_rss_mb": statistics.median(each(arm, "aggregator_rss")) / 2**20,
            "aggregator_cpu_s": statistics.median(each(arm, "aggregator_cpu_s")),
            "disk_mb": statistics.median(each(arm, "disk_bytes")) / 2**20,
        }
    return out


def markdown_table(result: dict) -> str:
    """The overhead tables for docs/benchmarks.md: one row per arm and step size, then the in-process A/B's."""

    def spread(s: dict, name: str) -> str:
        return f"{s[name]:.3f} ({s[name + '_min']:.3f}-{s[name + '_max']:.3f})"

    header = ["step", "arm", "step time ratio, median of rounds (min-max)", "best of rounds",
              "throughput ratio (mean step)", "process CPU per step ratio", "training thread CPU µs/step",
              "tool's threads CPU µs/step", "RSS +MB/rank", "side process", "written to disk"]  # fmt: skip
    rows = [[f"{size} ({s['step_ms_median']:.1f} ms)", arm, spread(s, "median_ratio"), f"{s['best_ratio']:.3f}",
             spread(s, "mean_ratio"), spread(s, "cpu_ratio"), f"{s['train_thread_cpu_us_per_step']:.0f}",
             f"{s['tool_threads_cpu_us_per_step']:.0f}", f"{s['rss_delta_mb_per_rank']:.1f}",
             f"{s['aggregator_rss_mb']:.0f} MB, {s['aggregator_cpu_s']:.1f} CPU s" if s["aggregator_rss_mb"] else "-",
             f"{s['disk_mb']:.2f} MB"]
            for size, data in result["sizes"].items() for arm, s in data["summary"].items()]  # fmt: skip
    ab_header = ["step", "in-process A/B (watched / plain)", "step time ratio", "p25-p75", "p10-p90", "extra µs/step",
                 "training-thread CPU ratio", "p25-p75", "extra CPU µs/step", "block pairs"]  # fmt: skip
    ab_rows = [[f"{size} ({a['plain_step_ms']:.1f} ms)", variant, f"{a['ratio_median']:.3f}",
                f"{a['ratio_p25']:.3f}-{a['ratio_p75']:.3f}", f"{a['ratio_p10']:.3f}-{a['ratio_p90']:.3f}",
                f"{a['extra_us_per_step_median']:.0f}", f"{a['cpu_ratio_median']:.3f}",
                f"{a['cpu_ratio_p25']:.3f}-{a['cpu_ratio_p75']:.3f}", f"{a['extra_cpu_us_per_step_median']:.0f}",
                f"{a['pairs']} × {a['block_steps']} steps"]
               for size, data in result["sizes"].items()
               for variant, a in ((v, ab["summary"]) for v, ab in data.get("ab", {}).items())]  # fmt: skip
    return markdown(header, rows) + ("\n\n" + markdown(ab_header, ab_rows) if ab_rows else "")


def main() -> int:
    parser = cli(__doc__, rounds=4)
    parser.add_argument("--sizes", default="5ms,50ms", help="comma-separated: 5ms,50ms")
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps per launch (default: 1000 at 5ms, 150 at 50ms)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="warmup steps per launch (at least; and at least 3 s. Default: 200 at 5ms, 20 at 50ms)",
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--no-ab", action="store_true", help="skip the in-process A/B (ranksight vs plain)")
    args = parser.parse_args()
    arms = tuple(a for a in args.arms.split(",") if a)
    if "baseline" not in arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms must include baseline and name only {', '.join(ARMS)}")
    sizes = [s for s in args.sizes.split(",") if s]
    if any(s not in SIZES for s in sizes):
        parser.error(f"--sizes must name only {', '.join(SIZES)}")

    result = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"load_avg_start": os.getloadavg()},
        "versions": versions(),
        "rounds": args.rounds,
        "agent_buffer_bound_mb": buffer_bound_mb(),
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="rs-overhead-") as root:
        for size in sizes:
            warmup, steps = args.warmup or DEFAULT_STEPS[size][0], args.steps or DEFAULT_STEPS[size][1]
            result["sizes"][size] = run_size(size, args.rounds, warmup, steps, arms, root)
            if not args.no_ab:
                result["sizes"][size]["ab"] = {v: run_ab_size(size, root, v) for v in AB_VARIANTS}
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["table"] = markdown_table(result)
    print("\n" + result["table"])
    bound_mb = result["agent_buffer_bound_mb"]
    print(f"\nagent event buffer when full ({default_buffer_bound():,} step events): {bound_mb:.1f} MB")
    if args.json:
        write_results(args.json, result, arms=list(arms), rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
