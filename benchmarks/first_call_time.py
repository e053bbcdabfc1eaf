"""Where a fresh process's first ``diagnose()`` (or ``step_breakdown``) spends its time: wall, user and system
CPU seconds of the call, and of the reader's steps that vary most (reading the digests' parts, merging the
per-step part, the per-rank medians, the rules); and the bytes in memory of each digest part it read.

``--rules both`` alternates fresh processes whose rules run rank by rank (``per_rank=True``, the evaluator
before the columns) with processes that judge them over the features' columns, and reports each kind's
medians: the rules' share of the call before and after, side by side in one run.

``--rules-only`` reads the run's features once and times the rules and the checklist alone over them in
this process, rank by rank and over the columns in turn (``--processes`` rounds), each round on a fresh
``Frame`` (its columns built inside the timing).

Why: on this VM the same first call takes 0.6 s in one hour and 1.2 s in another with the same code;
``reader_versions.py`` says which version is faster, this says whether the difference is in user time (the
code) or in system time (the kernel's page faults for the memory the call touches).

    python benchmarks/first_call_time.py RUN [--what diagnose|breakdown] [--processes 8]
        [--rules columns|per-rank|both] [--rules-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import fresh_process, machine_load, write_results  # noqa: E402

_ONE_CALL = r"""
import functools, json, resource, sys, time
import duckdb, pyarrow  # imported before the clock starts, as in reader_versions.py
from ranksight.collectors import _digest_fold, _digest_queries, open_run, step_breakdown
from ranksight.rules import _diagnose, diagnose

steps = {}
part_bytes = {}  # part -> bytes in memory of what read_digest_parts returned (the per-step part: its largest)

def timed(module, name, label):
    inner = getattr(module, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            out = inner(*args, **kwargs)
            if name == "read_digest_parts":
                part_bytes.update({part: table.nbytes for part, table in out.items()})
            return out
        finally:
            after = resource.getrusage(resource.RUSAGE_SELF)
            wall, system = steps.get(label, (0.0, 0.0))
            steps[label] = (wall + time.perf_counter() - start, system + after.ru_stime - before.ru_stime)

    setattr(module, name, wrapper)

timed(_digest_fold, "read_digest_parts", "read digest parts")
timed(_digest_fold, "_merged", "merge per-step part")
timed(_digest_queries, "_all_medians", "per-rank medians")
run, what, rules = sys.argv[1], sys.argv[2], sys.argv[3]
if rules == "per-rank":  # the evaluator before the columns: every rule on every rank
    _diagnose.evaluate = functools.partial(_diagnose.evaluate, per_rank=True)
    _diagnose.run_checklist = functools.partial(_diagnose.run_checklist, per_rank=True)
timed(_diagnose, "evaluate", "rules")
timed(_diagnose, "run_checklist", "checklist")
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if what == "breakdown":
    con = open_run(run, follow_spool=False)
    step_breakdown(con)
    con.close()
else:
    diagnose(run)
wall = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rules": rules, "wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
                  "system_s": after.ru_stime - before.ru_stime,
                  "steps": {k: {"wall_s": w, "system_s": s} for k, (w, s) in steps.items()},
                  "part_bytes": part_bytes}))
"""


def one_call(run: str, what: str, rules: str = "columns") -> dict:
    """The first call of ``what`` on ``run`` in a fresh process of this checkout, timed."""
    return {"load": machine_load(), **fresh_process(_ONE_CALL, run, what, rules)}


def _medians(calls: list[dict]) -> dict:
    out = {k: statistics.median(c[k] for c in calls) for k in ("wall_s", "user_s", "system_s")}
    for label in ("rules", "checklist"):
        times = [c["steps"][label]["wall_s"] for c in calls if label in c["steps"]]
        if times:
            out[f"{label}_s"] = statistics.median(times)
    return out


def rules_only(run: str, rounds: int) -> dict:
    """The rules and the checklist alone over ``run``'s features, rank by rank and over columns in turn."""
    import time

    from ranksight.collectors import compute_context, compute_features, open_run, read_rank_meta
    from ranksight.rules import load_rules
    from ranksight.rules._evaluate import evaluate, run_checklist
    from ranksight.rules._vector import Frame

    rules = load_rules()
    con = open_run(run, follow_spool=False)
    metas = read_rank_meta(run)
    features = compute_features(con, metas)
    context = compute_context(con, metas, features)
    out: dict = {"ranks": len(features), "rules": len(rules.rules), "rounds": []}
    for _ in range(rounds):
        row = {}
        for kind in ("per-rank", "columns"):
            start = time.perf_counter()
            frame = Frame(features)
            findings = evaluate(rules.rules, frame, context, per_rank=kind == "per-rank")
            middle = time.perf_counter()
            checklist = run_checklist(rules.checklist, frame, per_rank=kind == "per-rank")
            end = time.perf_counter()
            row[kind] = {"rules_s": middle - start, "checklist_s": end - middle, "fallbacks": frame.fallbacks}
            row[kind]["result"] = (findings, checklist)
        row["same"] = row["per-rank"].pop("result") == row["columns"].pop("result")
        out["rounds"].append(row)
        print(
            ", ".join(f"{k}: rules {v['rules_s']:.4f} s, checklist {v['checklist_s']:.4f} s" for k, v in row.items()
                      if k != "same") + f"; same {row['same']}"
        )  # fmt: skip
    for kind in ("per-rank", "columns"):
        for what in ("rules_s", "checklist_s"):
            out[f"{kind} {what}"] = statistics.median(r[kind][what] for r in out["rounds"])
    print(", ".join(f"{k} {v:.4f}" for k, v in out.items() if k.endswith("_s")))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--what", choices=("diagnose", "breakdown"), default="diagnose")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rules", choices=("columns", "per-rank", "both"), default="columns")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rules-only", action="store_true")
    args = parser.parse_args()
    if args.rules_only:
        out = {"run": args.run, **rules_only(args.run, args.processes)}
        if args.json:
            write_results(args.json, out, rounds=args.processes)
        return 0
    kinds = ("per-rank", "columns") if args.rules == "both" else (args.rules,)
    calls = [one_call(args.run, args.what, kind) for _ in range(args.processes) for kind in kinds]
    for call in calls:
        parts = ", ".join(f"{k} {v['wall_s']:.3f} s ({v['system_s']:.3f} system)" for k, v in call["steps"].items())
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in call["part_bytes"].items())
        print(
            f"{call['rules']}: {call['wall_s']:.3f} s: user {call['user_s']:.3f}, system {call['system_s']:.3f};"
            f" {parts}; {sizes}"
        )
    summary = {kind: _medians([c for c in calls if c["rules"] == kind]) for kind in kinds}
    for kind, medians in summary.items():
        print(f"medians, rules {kind}: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    if args.json:
        medians = summary if len(kinds) > 1 else summary[kinds[0]]
        figures = {"run": args.run, "what": args.what, "medians": medians, "calls": calls}
        write_results(args.json, figures, arms=list(kinds), rounds=args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
