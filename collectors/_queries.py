"""Plain query functions over a run's tables (spool views or the compacted store).

They take a DuckDB connection and return lists of dicts, so the CLI, the rules and the dashboard
share one definition of each figure and tests can call them without any UI.
"""

from __future__ import annotations

PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s", "gpu_ahead_s")
"""The step phases a breakdown shows; their shares of the step period add up to 1 (see ``PHASE_SQL``)."""

PERIOD_SQL = "greatest(step_s, coalesce(gpu_gap_s, 0) + coalesce(gpu_step_s, 0))"
"""What one step costs: the slower of the host's clock and the GPU stream's (idle gap before the step
plus the step itself).

The host runs ahead of a GPU-bound job until the launch queue fills, so early on (and in any short
run) its step time is shorter than the GPU's; in steady state the two are equal. On a CPU rank the
period is the step's wall time."""

_EXPOSED_WAIT = "least(coalesce(data_wait_s, 0), coalesce(gpu_gap_s, data_wait_s, 0))"
# The data wait that starved the GPU: a host wait only costs the GPU what its stream sat idle before
# the step (gpu_gap_s). With no GPU clock (a CPU rank) all of it counts.

PHASE_SQL: dict[str, str] = {
    **{p: f"coalesce({p}, 0)" for p in PHASES[:-2]},
    "data_wait_s": _EXPOSED_WAIT,
    "h2d_s": "h2d_s",  # NULL on a CPU rank, so its share stays absent rather than zero
    # On a GPU rank h2d_s is GPU time, and the host's side of the copy sits in other_s: count it once.
    "other_s": "greatest(coalesce(other_s, 0) - coalesce(h2d_s, 0), 0)",
    # GPU time the host did not account for: the GPU busy on queued work while the host waited for
    # data (the hidden part of the wait) or had already finished its step. NULL without a GPU clock.
    "gpu_ahead_s": f"CASE WHEN gpu_step_s IS NOT NULL THEN {PERIOD_SQL} - step_s + coalesce(data_wait_s, 0) "
    f"- {_EXPOSED_WAIT} END",
}
"""SQL for each phase of one step row; each phase is a share of ``PERIOD_SQL`` and they add up to it
(phases a rank cannot measure are NULL: a CPU rank has no H2D or GPU clock)."""


def step_breakdown(con, warmup_steps: int = 5) -> list[dict]:
    """Per rank: steps, median and mean step period, and each phase's share of the total period.

    The first ``warmup_steps`` steps of each rank (compilation, allocator and bucket warm-up) are left
    out unless the rank has no more than that. On a CPU rank the period is the step's wall time.
    """
    shares = ",\n".join(f"sum({PHASE_SQL[p]}) / nullif(sum(period_s), 0) AS {p[:-2]}_share" for p in PHASES)
    sql = f"""
        WITH counted AS (SELECT *, {PERIOD_SQL} AS period_s, count(*) OVER (PARTITION BY rank) AS n FROM steps),
             kept AS (SELECT * FROM counted WHERE step >= ? OR n <= ?)
        SELECT rank, any_value(node) AS node, count(*) AS steps,
               median(period_s) AS step_median_s, avg(period_s) AS step_mean_s,
               median(compute_s) AS compute_median_s,
               sum(coalesce(allreduce_s, 0)) / nullif(sum(period_s), 0) AS allreduce_share,
               sum(coalesce(data_wait_s, 0)) / nullif(sum(period_s), 0) AS data_wait_host_share,
               {shares}
        FROM kept GROUP BY rank ORDER BY rank
    """
    cur = con.execute(sql, [warmup_steps, warmup_steps])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
