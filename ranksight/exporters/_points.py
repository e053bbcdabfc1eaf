"""The scalars a tracker gets: per rank, per stretch of steps, the step time, each phase's share and the GPU's
utilization, read from the run folder (never from the training thread).

A point stands for a stretch of steps, not one step: live, the steps a poll found since the last one; after
the run, ``max_points`` stretches per rank. So a tracker receives a bounded number of rows whatever the step
rate, and the shares are the same sums as ``ranksight summary`` (each phase's time over the stretch's period).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ranksight.collectors import PHASES, Run, open_run, open_segments, segment_files

METRICS = ("step_time_s",) + tuple(f"{p[:-2]}_share" for p in PHASES) + ("gpu_utilization",)
"""Scalar names per rank, logged as ``ranksight/rank<r>/<name>``; a phase a rank did not measure is left out."""


@dataclass(frozen=True)
class Point:
    """One rank's figures over a stretch of steps; ``step`` is the last step of the stretch on any rank, so
    every rank's point of one stretch shares one x value."""

    step: int
    rank: int
    values: dict = field(default_factory=dict)


def points_from(run: Run, width: int) -> list[Point]:
    """Points of every step of ``run``, one per rank per ``width`` steps (``Run.stretches``)."""
    rows = run.stretches(width)
    last_of: dict[int, int] = {}
    for r in rows:
        last_of[r["stretch"]] = max(last_of.get(r["stretch"], r["last_step"]), r["last_step"])
    out = []
    for r in rows:
        values = {n: float(r[n]) for n in METRICS[:-1] if r[n] is not None and math.isfinite(r[n])}
        if r["gpu_utilization"] is not None:
            values["gpu_utilization"] = float(r["gpu_utilization"])
        out.append(Point(step=int(last_of[r["stretch"]]), rank=int(r["rank"]), values=values))
    return out


def run_points(run_path: str, max_points: int = 500) -> list[Point]:
    """Every step of a run (live or finished, compacted or not) as at most ``max_points`` points per rank."""
    run = open_run(run_path, follow_spool=False)
    try:
        top = run.last_step
        if top is None:
            return []
        return points_from(run, math.ceil((top + 1) / max(1, max_points)))
    finally:
        run.close()


class SpoolCursor:
    """The run's step and sample segments not read before: what a live follower turns into one point per rank.

    Segments appear whole, by rename, and never change, so a segment is read once; one the agent had not
    published at the last poll is read at the next.
    """

    def __init__(self, run_path: str) -> None:
        self.run_path = run_path
        self._seen: set[str] = set()

    def new_points(self) -> list[Point]:
        """One point per rank over the steps in the segments that appeared since the last call."""
        fresh = {
            kind: [p for p in segment_files(self.run_path, kind) if p not in self._seen]
            for kind in ("steps", "samples")
        }
        if not fresh["steps"]:
            return []
        run = open_segments(self.run_path, fresh)
        try:
            points = points_from(run, 1 << 62)
        finally:
            run.close()
        for files in fresh.values():
            self._seen.update(files)
        return points
