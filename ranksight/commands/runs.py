"""``ranksight runs [RUN_ROOT]``: list runs with job, ranks, steps, duration and status (``collectors.list_runs``)."""

from __future__ import annotations

import time

from ranksight.collectors import list_runs

from ._format import table


def add_parser(sub):
    p = sub.add_parser(
        "runs",
        help="list the runs under a folder",
        description="List the runs under a folder (default: ./ranksight-runs).",
    )
    p.add_argument("root", nargs="?", default="ranksight-runs", help="folder holding runs (default ranksight-runs)")
    return p


def run(args) -> int:
    runs = list_runs(args.root)
    if not runs:
        print(f"no runs under {args.root}: add ranksight.init() to your loop, or run `ranksight demo`")
        return 0
    rows = [
        [
            r["run"],
            r["job"],
            f"{r['ranks']}/{r['world_size']}",
            str(r["steps"]),
            f"{r['duration_s']:.1f}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_update_ns"] / 1e9)),
            r["status"],
        ]
        for r in runs
    ]
    print(table(["run", "job", "ranks", "steps", "duration s", "last update", "status"], rows))
    return 0
