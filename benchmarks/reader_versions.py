"""Two versions of ranksight's readers on one run folder, side by side: ``open_run`` + ``step_breakdown`` and
``diagnose()`` (with ``--what``, also the dashboard's rollup build), each in fresh processes taking turns, so
that a change is judged against the code before it on the same machine at the same moment (this VM's speed
drifts by a quarter between hours).

Why not two ``scale.py`` runs: their figures move with the machine more than with most changes. Here each
round runs the older and the newer code one after the other, and the medians of the rounds are compared.

The older version is an installed copy of an older commit, outside the checkout::

    git worktree add /tmp/ranksight-old COMMIT
    pip install --no-deps --no-build-isolation --target /tmp/ranksight-old-site /tmp/ranksight-old
    python benchmarks/reader_versions.py RUN --old-site /tmp/ranksight-old-site --json out.json

RUN needs the step digests of both versions' definitions where their keys differ (a digest is read only
under its own key): write the older one's with ``--write-old-digests`` first. The newer version is the
one this interpreter imports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import fresh_process, machine_load, write_results  # noqa: E402

_MEASURE = r"""
import json, sys, time
old_site = sys.argv[1]
if old_site:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # not the checkout's finder
    sys.path.insert(0, old_site)
import duckdb, pyarrow  # imported before the clock starts, as in a reader that has run before
from ranksight.collectors import open_run, step_breakdown
from ranksight.rules import diagnose
run, what, repeats = sys.argv[2], sys.argv[3], int(sys.argv[4])
if what == "rollup":
    from ranksight.dashboard import Rollup
times = []
for _ in range(repeats):
    t = time.perf_counter()
    if what == "breakdown":
        con = open_run(run, follow_spool=False)
        step_breakdown(con)
        con.close()
    elif what == "rollup":  # the dashboard's first build of a run
        Rollup(run).close()
    else:
        diagnose(run)
    times.append(time.perf_counter() - t)
import ranksight
print(json.dumps({"times": times, "module": ranksight.__file__}))
"""

_WRITE_DIGESTS = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path[:0] = [sys.argv[1], sys.argv[3]]  # the older version first, then this folder's scripts
from digest_verdict_corpus import digest_every_segment  # the publisher's digest beside every step segment
digest_every_segment(sys.argv[2])
"""


def measure(old_site: str, run: str, what: str, repeats: int) -> dict:
    """{"times": each of ``repeats`` calls of ``what``, "module": where ranksight came from} in one fresh
    process, the older version's (``old_site``) or, with "", this checkout's."""
    return fresh_process(_MEASURE, old_site, run, what, repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--old-site", required=True, help="pip install --target folder of the older commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="calls per process (the first is a fresh one)")
    parser.add_argument("--write-old-digests", action="store_true")
    parser.add_argument(
        "--what",
        default="breakdown,diagnose",
        help="comma-separated: breakdown, diagnose, rollup (the dashboard's Rollup)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.write_old_digests:
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, "-c", _WRITE_DIGESTS, args.old_site, args.run, here], check=True)
    results: dict = {}
    for what in args.what.split(","):
        if what not in ("breakdown", "diagnose", "rollup"):
            parser.error(f"--what: no measure {what!r} (breakdown, diagnose, rollup)")
        runs: dict[str, list] = {"older": [], "newer": []}
        loads = []
        for _ in range(args.rounds):
            loads.append(machine_load())
            for version, site in (("older", args.old_site), ("newer", "")):
                runs[version].append(measure(site, args.run, what, args.repeats))
        assert all(args.old_site in r["module"] for r in runs["older"])
        assert not any(args.old_site in r["module"] for r in runs["newer"])
        figures = {}
        for version, rounds in runs.items():
            first = [r["times"][0] for r in rounds]
            later = [t for r in rounds for t in r["times"][1:]]
            figures[version] = {
                "first_call_median_s": statistics.median(first),
                "later_calls_median_s": statistics.median(later) if later else None,
                "first_calls_s": first,
                "later_calls_s": later,
            }
        older, newer = figures["older"], figures["newer"]
        figures["newer_over_older_first"] = newer["first_call_median_s"] / older["first_call_median_s"]
        if older["later_calls_median_s"]:
            figures["newer_over_older_later"] = newer["later_calls_median_s"] / older["later_calls_median_s"]
        results[what] = {**figures, "loads": loads}
        print(
            f"{what}: first call {older['first_call_median_s']:.3f} s -> {newer['first_call_median_s']:.3f} s; "
            f"later calls {older['later_calls_median_s'] or 0:.3f} s -> {newer['later_calls_median_s'] or 0:.3f} s",
            flush=True,
        )
    if args.json:
        figures = {"run": args.run, "old_site": args.old_site, "rounds": args.rounds, "repeats": args.repeats}
        write_results(args.json, {**figures, **results}, arms=["older", "newer"], rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
