"""Cost against fix: did the step time a fix gave back match the cost its finding stated?

Reads the results of ``diagnosis_corpus.py --check-fix`` (its ``--json``, or its ``--rediagnose``'s) and prints
its ``fix_check`` per (script, fault) with faulty and fixed runs: the cost the planted fault's finding stated
against the step time the fix gave back per sample, and whether the two lie within 5 pp of the step.

    python benchmarks/diagnosis_corpus.py --device cuda --gpus 1 --check-fix --json corpus.json ...
    python benchmarks/fix_check.py corpus.json [more.json ...] [--json fix_check.json]

Several files are pooled by (script, fault): the faulty runs of one device call with the fixed runs of
another compare across machines (noisier); each row says how many runs of each it used.

A finding the plant did not mean to cause (``--co-finding RULE``) is checked the same way where a changed
plant applied its fix: ``--after`` names the runs of that plant, whose steps do ``--work-ratio`` times the
work, and the gain is ``1 - (after / ratio) / before`` per sample on the script's clock (medians over runs).

    python benchmarks/fix_check.py before.json --co-finding launch-bound --after after.json --work-ratio 1.56
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import fields

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import diagnosis_corpus as corpus  # noqa: E402
from _harness import cli, write_results  # noqa: E402


def load_runs(paths: list) -> list:
    known = {f.name for f in fields(corpus.RunResult)}
    runs = []
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        runs += [corpus.RunResult(**{k: v for k, v in r.items() if k in known}) for r in doc.get("runs", [])]
    return runs


def main(argv=None) -> int:
    parser = cli(__doc__)
    parser.add_argument("results", nargs="+", help="diagnosis_corpus.py --json files (or their --rediagnose)")
    parser.add_argument("--co-finding", default=None, help="a rule the plant did not mean: its cost against --after")
    parser.add_argument("--after", nargs="+", default=[], help="runs of the plant with that rule's fix applied")
    parser.add_argument("--work-ratio", type=float, default=1.0, help="work of an --after step over a step before")
    args = parser.parse_args(argv)
    if args.co_finding:
        return co_finding(args)
    rows = corpus.fix_check(load_runs(args.results))
    if not rows:
        print("no (script, fault) has both faulty and fixed runs (run the corpus with --check-fix)")
        return 1
    print("\n".join(corpus.fix_check_text(rows)))
    within = sum(r["within"] for r in rows)
    print(f"\nwithin {corpus.FIX_TOLERANCE:.0%} of the step: {within}/{len(rows)}")
    if args.json:
        write_results(args.json, {"sources": args.results, "tolerance": corpus.FIX_TOLERANCE, "rows": rows})
    return 0


def co_finding(args) -> int:
    """The co-finding's stated cost (median over the faulty runs that named it) against the step time the
    changed plant gave back per unit of work."""

    def per_sample(runs):  # the fix check's own clock (the script's median step over its samples)
        return [s for r in runs if not r.fixed and (s := corpus._per_sample_s(r)) is not None]

    before_runs, after_runs = load_runs(args.results), load_runs(args.after)
    costs = [
        f["cost_share"] for r in before_runs if not r.fixed for f in r.findings if f.get("rule") == args.co_finding
    ]
    before, after = per_sample(before_runs), per_sample(after_runs)
    if not costs or not before or not after:
        print(f"no {args.co_finding} finding in the runs before, or no step times on either side")
        return 1
    row = {"rule": args.co_finding, "named_in": len(costs), "runs_before": len(before), "runs_after": len(after),
           "cost_stated": statistics.median(costs), "costs": sorted(costs), "work_ratio": args.work_ratio,
           "sample_before_s": statistics.median(before), "sample_after_s": statistics.median(after)}  # fmt: skip
    row["gain"] = round(1 - row["sample_after_s"] / args.work_ratio / row["sample_before_s"], 4)
    row["diff_pp"] = round(100 * (row["cost_stated"] - row["gain"]), 1)
    print(f"{args.co_finding}: named in {len(costs)} of {len(before)} runs, stated {row['cost_stated']:.1%} "
          f"({min(costs):.1%}-{max(costs):.1%}); {row['sample_before_s'] * 1e3:.3f} ms a sample before, "
          f"{row['sample_after_s'] * 1e3:.3f} ms after for {args.work_ratio}x the work: gain {row['gain']:.1%}, "
          f"stated - gain {row['diff_pp']:+.1f} pp")  # fmt: skip
    if args.json:
        write_results(args.json, {"sources": args.results, "after": args.after, "co_finding": row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
