"""The runs under a folder, and whether each is live (one rule for the CLI, the dashboard and ``open_run``)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter

from ranksight.format.schema import RANKS_DIR

from ._rank_files import UNKNOWN_STATUS, RankMeta, read_rank_files

LIVE_FLUSHES = 30
"""A rank is live -- it may still write segments -- until its metadata says it ended (a final status)
or its heartbeat is older than this many of its flush intervals (60 s at the default 2 s). The agent
thread rewrites the heartbeat every flush whatever the training loop does, so only a crashed, killed
or frozen process goes that long without one; the margin covers a slow shared filesystem and clock
skew between the nodes and the reader. ``list_runs`` calls a run live while any rank is;
``open_run`` stops scanning the spool of a compacted run only when no rank is."""

FINAL_STATUSES = ("finished", "crashed", "terminated")
"""Statuses the agent writes as its last word: the rank writes nothing after them."""
LOST_STATUS = "lost"
"""A rank that said neither of the final statuses and whose heartbeat stopped (see ``LIVE_FLUSHES``):
killed (SIGKILL, out of memory), its node gone, or frozen."""
_DEFAULT_FLUSH_S = 2.0


def _flush_interval_s(meta: RankMeta) -> float:
    value = meta.data.get("flush_interval_s", _DEFAULT_FLUSH_S)
    return float(value) if isinstance(value, (int, float)) and value > 0 else _DEFAULT_FLUSH_S


def rank_is_live(meta: RankMeta, now_ns: int | None = None) -> bool:
    """Whether the rank may still write segments (see ``LIVE_FLUSHES``)."""
    if meta.status in FINAL_STATUSES or meta.status == LOST_STATUS:
        return False
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - meta.heartbeat_ns < LIVE_FLUSHES * _flush_interval_s(meta) * 1e9


def with_liveness(meta: RankMeta, now_ns: int) -> RankMeta:
    """The rank as readers show it: ``lost`` when it is still ``running`` by its file but its heartbeat
    stopped; every other status as written (``unknown`` stays unknown: its file cannot be trusted)."""
    if meta.status in FINAL_STATUSES or meta.status == UNKNOWN_STATUS or rank_is_live(meta, now_ns):
        return meta
    return dataclasses.replace(meta, status=LOST_STATUS)


def read_rank_meta(run_path: str) -> list[RankMeta]:
    """Every rank's metadata, in rank-file order, with ``lost`` derived (see ``RankMeta``).

    Never raises on a damaged file: it reads as status ``unknown`` with one warning line; a file being
    renamed into place at that moment is left out this time.
    """
    now = time.time_ns()
    return [with_liveness(m, now) for m in read_rank_files(run_path)]


def list_runs(root: str) -> list[dict]:
    """Describe every run folder under ``root``, newest first.

    Each run is a dict: ``run`` (folder name), ``path``, ``job``, ``ranks`` (ranks that wrote
    metadata), ``world_size``, ``steps`` (the most any rank did), ``duration_s``, ``last_update_ns``
    (newest heartbeat), ``rank_statuses`` (status -> ranks, e.g. ``{"finished": 7, "lost": 1}``) and
    ``status``: ``live`` while any rank is (see ``LIVE_FLUSHES``), else ``finished`` when every rank said
    so, else ``stopped`` (crashed, terminated, lost or unknown ranks).
    """
    try:
        names = os.listdir(root)
    except OSError:
        return []
    runs = [run for run in (_describe(root, name) for name in names) if run is not None]
    return sorted(runs, key=lambda r: r["last_update_ns"], reverse=True)


def _describe(root: str, name: str) -> dict | None:
    path = os.path.join(root, name)
    if not os.path.isdir(os.path.join(path, RANKS_DIR)):
        return None
    metas = read_rank_meta(path)
    if not metas:
        return None
    now = time.time_ns()
    if any(rank_is_live(m, now) for m in metas):
        status = "live"
    else:
        status = "finished" if all(m.status == "finished" for m in metas) else "stopped"
    last = max(m.heartbeat_ns for m in metas)
    started = min((m.data["started_ns"] for m in metas if "started_ns" in m.data), default=last)
    statuses = dict(Counter(m.status for m in metas))
    first = metas[0].data
    return {
        "run": name,
        "path": path,
        "job": first.get("job", "?"),
        "ranks": len(metas),
        "world_size": first.get("world_size", len(metas)),
        "steps": max(m.steps for m in metas),
        "duration_s": max(0, last - started) / 1e9,
        "last_update_ns": last,
        "rank_statuses": statuses,
        "status": status,
    }
