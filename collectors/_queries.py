"""Plain query functions over a run's tables (spool views or the compacted store).

They take a DuckDB connection and return lists of dicts, so the CLI, the rules and the dashboard
share one definition of each figure and tests can call them without any UI.
"""

from __future__ import annotations

PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s")


def step_breakdown(con, warmup_steps: int = 5) -> list[dict]:
    """Per rank: steps, median and mean step time, and each phase's share of total step time.

    The first ``warmup_steps`` steps of each rank (compilation, allocator and bucket warm-up) are left
    out unless the rank has no more than that.
    """
    shares = ",\n".join(f"sum(coalesce({p}, 0)) / nullif(sum(step_s), 0) AS {p[:-2]}_share" for p in PHASES)
    sql = f"""
        WITH counted AS (SELECT *, count(*) OVER (PARTITION BY rank) AS n FROM steps),
             kept AS (SELECT * FROM counted WHERE step >= ? OR n <= ?)
        SELECT rank, any_value(node) AS node, count(*) AS steps,
               median(step_s) AS step_median_s, avg(step_s) AS step_mean_s,
               median(compute_s) AS compute_median_s,
               sum(coalesce(allreduce_s, 0)) / nullif(sum(step_s), 0) AS allreduce_share,
               {shares}
        FROM kept GROUP BY rank ORDER BY rank
    """
    cur = con.execute(sql, [warmup_steps, warmup_steps])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
