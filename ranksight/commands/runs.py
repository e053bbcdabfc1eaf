"""``ranksight runs [RUN_ROOT]``: list runs with job, ranks, steps, duration and status."""

from __future__ import annotations

import os
import time

from ranksight.collectors import read_rank_meta
from ranksight.schema import RANKS_DIR

from ._format import table

STALE_AFTER_FLUSHES = 5  # a rank silent this many flush intervals is no longer live


def list_runs(root: str) -> list[dict]:
    """Describe every run folder under ``root`` (newest first)."""
    runs = []
    if not os.path.isdir(root):
        return runs
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not os.path.isdir(os.path.join(path, RANKS_DIR)):
            continue
        metas = read_rank_meta(path)
        if not metas:
            continue
        now = time.time_ns()
        live = any(
            m.status == "running"
            and now - m.heartbeat_ns < STALE_AFTER_FLUSHES * 1e9 * m.data.get("flush_interval_s", 2)
            for m in metas
        )
        status = "live" if live else ("finished" if all(m.status == "finished" for m in metas) else "stopped")
        started = min(m.data.get("started_ns", 0) for m in metas)
        last = max(m.heartbeat_ns for m in metas)
        runs.append(
            {
                "run": name,
                "path": path,
                "job": metas[0].data.get("job", "?"),
                "ranks": len(metas),
                "world_size": metas[0].data.get("world_size", len(metas)),
                "steps": max(m.steps for m in metas),
                "duration_s": (last - started) / 1e9,
                "last_update_ns": last,
                "status": status,
            }
        )
    return sorted(runs, key=lambda r: r["last_update_ns"], reverse=True)


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
