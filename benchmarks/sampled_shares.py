"""Do phase shares from sampled steps agree with every step's? Runs recorded with CUDA events on every step, read
again as if events had been recorded on one step in N only.

Why this way: two runs of one job differ by more than the sampling error (run to run noise), so the honest
comparison is within one run. Each run folder (recorded with ``RANKSIGHT_GPU='{"events_every_steps": 1}'``)
is copied, and in the copy the steps the agent's schedule (``ranksight.agent._event_sampling``) would not have
sampled at N get ``gpu_sampled = false`` and their GPU columns NULL, exactly as the agent writes an unsampled
step; then the real readers give each phase's share and the first finding, for every step and for each N.

    python benchmarks/sampled_shares.py compare DIR/runs/* [--every 4 8 16] [--json OUT]

``benchmarks/gpu_round.sh`` (``PARTS=shares``) records the runs: the demo's one-GPU jobs with events on every
step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # as well under ``python -P``, as gpu_round.sh runs it

from _harness import write_results  # noqa: E402

_GPU_COLUMNS = (
    "h2d_s", "gpu_compute_s", "gpu_step_s", "gpu_gap_s", "gpu_comm_exposed_s", "gpu_optimizer_s",
    "gpu_comm_blocked_s", "gpu_data_idle_s",
)  # fmt: skip


def _mask(src: str, dst: str, every: int) -> int:
    """Copy run ``src`` to ``dst`` with the steps outside the schedule at ``every`` unsampled; return how
    many steps stay sampled."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ranksight.agent._event_sampling import is_sampled, threshold

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".digests", "store.duckdb*", "*.lock"))
    bound, kept = threshold(every), 0
    folder = os.path.join(dst, "steps")
    for name in os.listdir(folder):
        if not name.endswith(".parquet"):
            continue
        path = os.path.join(folder, name)
        table = pq.read_table(path)
        on = [is_sampled(s, bound) for s in table["step"].to_pylist()]
        kept += sum(on)
        mask = pa.array(on)
        cols = {}
        for field in table.schema:
            col = table[field.name]
            if field.name in _GPU_COLUMNS:
                col = pa.compute.if_else(mask, col, pa.scalar(None, field.type))
            cols[field.name] = col
        cols["gpu_sampled"] = mask
        pq.write_table(pa.table(cols), path)
    return kept


def _read(path: str) -> dict:
    from ranksight.collectors import PHASES, open_run
    from ranksight.collectors._queries import step_breakdown
    from ranksight.rules import diagnose

    (row,) = [r for r in step_breakdown(open_run(path)) if r["rank"] == 0]
    found = [f for f in diagnose(path)["findings"] if f["severity"] != "info"]
    shares = {p[:-2]: row[f"{p[:-2]}_share"] for p in PHASES}
    return {"steps": row["steps"], "shares": shares, "first": found[0]["rule"] if found else "silent"}


def compare(args) -> int:
    import pyarrow.compute  # noqa: F401  (pa.compute above)

    results = []
    for run in args.runs:
        full = _read(run)
        line = {"run": os.path.basename(run.rstrip("/")), "every_step": full, "sampled": {}}
        with tempfile.TemporaryDirectory() as tmp:
            for every in args.every:
                dst = os.path.join(tmp, f"n{every}")
                _mask(run, dst, every)
                got = _read(dst)
                diffs = {
                    p: None if full["shares"][p] is None or got["shares"][p] is None
                    else abs(full["shares"][p] - got["shares"][p])
                    for p in full["shares"]
                }  # fmt: skip
                got["max_diff_pp"] = 100 * max(d for d in diffs.values() if d is not None)
                got["diff_pp"] = {p: None if d is None else 100 * d for p, d in diffs.items()}
                line["sampled"][every] = got
        results.append(line)
    header = f"{'run':<28} {'steps':>5} {'first (every step)':<22}" + "".join(
        f" | N={n}: steps  max|d| pp  first" for n in args.every
    )
    print(header)
    worst = 0.0
    for line in results:
        full = line["every_step"]
        text = f"{line['run']:<28} {full['steps']:>5} {full['first']:<22}"
        for n in args.every:
            got = line["sampled"][n]
            worst = max(worst, got["max_diff_pp"])
            same = "same" if got["first"] == full["first"] else got["first"]
            text += f" | {got['steps']:>10} {got['max_diff_pp']:>9.2f}  {same}"
        print(text)
    print(f"largest share difference: {worst:.2f} pp")
    if args.json:
        doc = {"command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "every": args.every, "runs": results, "largest_diff_pp": worst}  # fmt: skip
        write_results(args.json, doc)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("runs", nargs="+")
    c.add_argument("--every", type=int, nargs="+", default=[4, 8, 16])
    c.add_argument("--json")
    args = ap.parse_args()
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
