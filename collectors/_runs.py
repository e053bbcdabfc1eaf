"""The runs under a folder, and whether each is live (one rule for the CLI, the dashboard and ``open_run``)."""

from __future__ import annotations

import os
import time

from ranksight.schema import RANKS_DIR

from ._rundir import RankMeta, read_rank_meta

LIVE_FLUSHES = 30
"""A rank is live -- it may still write segments -- until its metadata says ``finished`` or its
heartbeat is older than this many of its flush intervals (60 s at the default 2 s). The agent thread
rewrites the heartbeat every flush whatever the training loop does, so only a crashed, killed or
frozen process goes that long without one; the margin covers a slow shared filesystem and clock
skew between the nodes and the reader. ``list_runs`` calls a run live while any rank is;
``open_run`` stops scanning the spool of a compacted run only when no rank is."""


def rank_is_live(meta: RankMeta, now_ns: int | None = None) -> bool:
    """Whether the rank may still write segments (see ``LIVE_FLUSHES``)."""
    if meta.status == "finished":
        return False
    try:
        interval_s = float(meta.data.get("flush_interval_s", 2.0))
    except (TypeError, ValueError):
        interval_s = 2.0
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - meta.heartbeat_ns < LIVE_FLUSHES * interval_s * 1e9


def list_runs(root: str) -> list[dict]:
    """Describe every run folder under ``root``, newest first.

    Each run is a dict: ``run`` (folder name), ``path``, ``job``, ``ranks`` (ranks that wrote
    metadata), ``world_size``, ``steps`` (the most any rank did), ``duration_s``, ``last_update_ns``
    (newest heartbeat) and ``status``: ``live`` while any rank is (see ``LIVE_FLUSHES``), else
    ``finished`` when every rank said so, else ``stopped`` (crashed or killed).
    """
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
        if any(rank_is_live(m, now) for m in metas):
            status = "live"
        else:
            status = "finished" if all(m.status == "finished" for m in metas) else "stopped"
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
