"""Plain query functions over a run's tables (spool views or the compacted store).

They take a DuckDB connection and return lists of dicts, so the CLI, the rules and the dashboard
share one definition of each figure and tests can call them without any UI.
"""

from __future__ import annotations

PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s")
"""The step phases a breakdown shows; their shares of the step period add up to 1 (see ``PHASE_SQL``)."""

_ON_GPU = "gpu_step_s IS NOT NULL"
_GPU_GAP = "coalesce(gpu_gap_s, data_wait_s, 0)"

PERIOD_SQL = f"CASE WHEN {_ON_GPU} THEN {_GPU_GAP} + gpu_step_s ELSE step_s END"
"""What one step costs. On a CPU rank its wall time. On a GPU rank the GPU stream's time from the
previous step's end to this one's (the idle gap before the step plus the step): the host runs ahead
of a GPU-bound job, so its own clock says when it queued work, not what the work cost; in steady
state the two agree."""

_EXPOSED_WAIT = f"least(coalesce(data_wait_s, 0), {_GPU_GAP})"
# The data wait that starved the GPU: a host wait costs the GPU only what its stream sat idle before
# the step (gpu_gap_s); the rest was hidden behind queued work.


def _phase(gpu: str, cpu: str) -> str:
    return f"CASE WHEN {_ON_GPU} THEN {gpu} ELSE {cpu} END"


_GPU_NAMED = (
    f"{_EXPOSED_WAIT} + coalesce(h2d_s, 0) + coalesce(gpu_compute_s, 0)"
    " + coalesce(gpu_comm_exposed_s, comm_exposed_s, 0) + coalesce(gpu_optimizer_s, optimizer_s, 0)"
)

PHASE_SQL: dict[str, str] = {
    "data_wait_s": _phase(_EXPOSED_WAIT, "coalesce(data_wait_s, 0)"),
    "h2d_s": "h2d_s",  # GPU time; NULL on a CPU rank, so its share stays absent rather than zero
    "compute_s": _phase("coalesce(gpu_compute_s, 0)", "coalesce(compute_s, 0)"),
    # With NCCL the host's all-reduce futures complete at enqueue: only the GPU's clock sees the wait.
    # A GPU row without the GPU figure (an older agent, or its event not resolved) keeps the host's.
    "comm_exposed_s": _phase("coalesce(gpu_comm_exposed_s, comm_exposed_s, 0)", "coalesce(comm_exposed_s, 0)"),
    "optimizer_s": _phase("coalesce(gpu_optimizer_s, optimizer_s, 0)", "coalesce(optimizer_s, 0)"),
    # GPU: the rest of the period (host work between steps, the gap after an all-reduce until the
    # optimizer). CPU: the host's own remainder.
    "other_s": _phase(f"greatest({PERIOD_SQL} - ({_GPU_NAMED}), 0)", "coalesce(other_s, 0)"),
}
"""SQL for each phase of one step row, as a share of ``PERIOD_SQL``: GPU-stream phases on a GPU rank
(CUDA events), host phases on a CPU rank. They add up to the period."""


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
