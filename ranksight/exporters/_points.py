"""The scalars a tracker gets: per rank, per stretch of steps, the step time, each phase's share and the GPU's
utilization, read from the run folder (never from the training thread).

A point stands for a stretch of steps, not one step: live, the steps a poll found since the last one; after
the run, ``max_points`` stretches per rank. So a tracker receives a bounded number of rows whatever the step
rate, and the shares are the same sums as ``ranksight summary`` (each phase's time over the stretch's period).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ranksight.collectors import PHASE_SQL, PHASES, kept_steps_sql, segment_files, select_list, steps_source

METRICS = ("step_time_s",) + tuple(f"{p[:-2]}_share" for p in PHASES) + ("gpu_utilization",)
"""Scalar names per rank, logged as ``ranksight/rank<r>/<name>``; a phase a rank did not measure is left out."""

GPU_UTILIZATION_SAMPLE = "gpu_utilization_ratio"


@dataclass(frozen=True)
class Point:
    """One rank's figures over a stretch of steps; ``step`` is the last step of the stretch on any rank, so
    every rank's point of one stretch shares one x value."""

    step: int
    rank: int
    values: dict = field(default_factory=dict)


def _shares_sql() -> str:
    return ",\n".join(f"sum({PHASE_SQL[p]}) / nullif(sum(period_s), 0) AS {p[:-2]}_share" for p in PHASES)


def points_from(con, width: int) -> list[Point]:
    """Points of every step on ``con``'s ``steps`` and ``samples`` views, one per rank per ``width`` steps."""
    width = max(1, int(width))
    rows = con.execute(
        f"""WITH {kept_steps_sql(steps_source(con))}
            SELECT step // {width} AS b, rank, max(step) AS last, median(period_s) AS step_time_s, {_shares_sql()}
            FROM kept GROUP BY ALL ORDER BY b, rank""",
        [0, 0],
    ).fetchall()
    names = ["step_time_s"] + [f"{p[:-2]}_share" for p in PHASES]
    gpu = {
        (b, rank): value
        for b, rank, value in con.execute(
            f"""SELECT step // {width} AS b, rank, avg(value) FROM samples
                WHERE name = ? AND step IS NOT NULL AND value IS NOT NULL GROUP BY ALL""",
            [GPU_UTILIZATION_SAMPLE],
        ).fetchall()
    }
    last_of: dict[int, int] = {}
    for b, _rank, last, *_ in rows:
        last_of[b] = max(last_of.get(b, last), last)
    out = []
    for b, rank, _last, *figures in rows:
        values = {n: float(v) for n, v in zip(names, figures) if v is not None and math.isfinite(v)}
        if (b, rank) in gpu:
            values["gpu_utilization"] = float(gpu[(b, rank)])
        out.append(Point(step=int(last_of[b]), rank=int(rank), values=values))
    return out


def run_points(run_path: str, max_points: int = 500) -> list[Point]:
    """Every step of a run (live or finished, compacted or not) as at most ``max_points`` points per rank."""
    from ranksight.collectors import open_run

    con = open_run(run_path, follow_spool=False)
    try:
        top = con.execute("SELECT max(step) FROM steps").fetchone()[0]
        if top is None:
            return []
        return points_from(con, math.ceil((int(top) + 1) / max(1, max_points)))
    finally:
        con.close()


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
        import duckdb

        fresh = {
            kind: [p for p in segment_files(self.run_path, kind) if p not in self._seen]
            for kind in ("steps", "samples")
        }
        if not fresh["steps"]:
            return []
        con = duckdb.connect()
        try:
            for kind, files in fresh.items():
                if files:
                    source = f"read_parquet({_sql_list(files)}, union_by_name = true)"
                    con.execute(f"CREATE TEMP VIEW {kind} AS SELECT {select_list(con, source, kind)} FROM {source}")
                else:
                    con.execute(f"CREATE TEMP TABLE {kind} (rank INTEGER, step BIGINT, name VARCHAR, value DOUBLE)")
            points = points_from(con, 1 << 62)
        finally:
            con.close()
        for files in fresh.values():
            self._seen.update(files)
        return points


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
