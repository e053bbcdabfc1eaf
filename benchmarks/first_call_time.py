"""Where a fresh process's first ``diagnose()`` (or ``step_breakdown``) spends its time: wall, user and system
CPU seconds of the call, and of the reader's steps that vary most (reading the digests' parts, merging the
per-step part, the per-rank medians, the rules); and the bytes in memory of each digest part it read.

Why: on this VM the same first call takes 0.6 s in one hour and 1.2 s in another with the same code;
``reader_versions.py`` says which version is faster, this says whether the difference is in user time (the
code) or in system time (the kernel's page faults for the memory the call touches).

    python benchmarks/first_call_time.py RUN [--what diagnose|breakdown] [--processes 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

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
timed(_diagnose, "evaluate", "rules")
run, what = sys.argv[1], sys.argv[2]
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if what == "breakdown":
    con = open_run(run, follow_spool=False)
    step_breakdown(con)
    con.close()
else:
    diagnose(run)
wall = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
                  "system_s": after.ru_stime - before.ru_stime,
                  "steps": {k: {"wall_s": w, "system_s": s} for k, (w, s) in steps.items()},
                  "part_bytes": part_bytes}))
"""


def one_call(run: str, what: str) -> dict:
    """The first call of ``what`` on ``run`` in a fresh process of this checkout, timed."""
    out = subprocess.run([sys.executable, "-c", _ONE_CALL, run, what], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--what", choices=("diagnose", "breakdown"), default="diagnose")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    calls = [one_call(args.run, args.what) for _ in range(args.processes)]
    for call in calls:
        parts = ", ".join(f"{k} {v['wall_s']:.3f} s ({v['system_s']:.3f} system)" for k, v in call["steps"].items())
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in call["part_bytes"].items())
        print(f"{call['wall_s']:.3f} s: user {call['user_s']:.3f}, system {call['system_s']:.3f}; {parts}; {sizes}")
    summary = {k: statistics.median(c[k] for c in calls) for k in ("wall_s", "user_s", "system_s")}
    print("medians: " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "what": args.what, "medians": summary, "calls": calls}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
