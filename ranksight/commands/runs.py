"""``ranksight runs [RUN_ROOT]``: list runs with job, ranks, steps, duration and status (``collectors.list_runs``)."""

from __future__ import annotations

import time

from ranksight.collectors import list_runs

from ._format import table
from ._paths import resolve_root


def add_parser(sub):
    p = sub.add_parser(
        "runs",
        help="list the runs under a folder",
        description="List the runs under a folder (default: $RANKSIGHT_RUN_DIR, else ./ranksight-runs), newest first.",
    )
    p.add_argument(
        "root", nargs="?", default=None, help="folder holding runs (default: $RANKSIGHT_RUN_DIR, else ranksight-runs)"
    )
    return p


def run(args) -> int:
    root = resolve_root(args.root)  # a missing folder is a one-line error (exit 2), not an empty list
    runs = list_runs(root)
    if not runs:
        print(f"no runs under {root}: add ranksight.init() to your loop, or run `ranksight demo`")
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
