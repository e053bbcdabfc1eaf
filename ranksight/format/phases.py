"""SQL for one step row's period and phases: the one definition every reader of step rows shares.

Why a module of its own: the collectors' queries, the dashboard's rollup and the node spool's publisher
(which writes each published file's digest, ``ranksight.format.digest``) all sum these expressions. The
publisher is part of the agent, which reads nothing of ``ranksight.collectors``; text that both import
keeps one definition of each figure.
"""

from __future__ import annotations

PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s")
"""The step phases a breakdown shows; their shares of the step period add up to 1 (see ``PHASE_SQL``)."""

SAMPLED_SQL = "gpu_sampled IS DISTINCT FROM false"
"""The step rows phase figures rest on: every row but a GPU rank's steps that recorded no CUDA events
(``GpuOptions.events_every_steps``). Such a row's host phases are not the GPU's (the host runs ahead of a
GPU-bound job), so mixing them in would blur the shares; a share from the sampled steps estimates the
every-step share (docs/agent.md, "Sampled GPU phases"). Rows of older agents lack the column: NULL, kept."""

_ON_GPU = "gpu_step_s IS NOT NULL"
_GPU_GAP = "coalesce(gpu_gap_s, data_wait_s, 0)"

PERIOD_SQL = f"CASE WHEN {_ON_GPU} THEN {_GPU_GAP} + gpu_step_s ELSE step_s END"
"""What one step costs. On a CPU rank its wall time. On a GPU rank the GPU stream's time from the
previous step's end to this one's (the idle gap before the step plus the step): the host runs ahead
of a GPU-bound job, so its own clock says when it queued work, not what the work cost; in steady
state the two agree."""


def _phase(gpu: str, cpu: str) -> str:
    return f"CASE WHEN {_ON_GPU} THEN {gpu} ELSE {cpu} END"


# The data wait that starved the GPU: a host wait costs the GPU only what its stream sat idle for it,
# the wait before the step at most the idle gap before it (gpu_gap_s), the wait inside it at most what
# its mon.data() blocks cost the stream (gpu_data_idle_s, a prefetch between forward and backward,
# already taken out of the GPU phase it fell in); the rest was hidden behind queued work. A gap before
# the step caused by something else (logging) never counts an in-step wait as exposed. Rows without
# the in-step columns (older agents, no in-step blocks) judge the whole wait against the gap. NULL
# data_wait_s means "not measured" (no wrapped loader, no mon.data() marks), and stays NULL: a share of
# 0 would claim the input is fine.
_EXPOSED_WAIT = (
    "CASE WHEN data_wait_s IS NULL THEN NULL"
    f" WHEN gpu_data_idle_s IS NULL OR data_wait_in_step_s IS NULL THEN least(data_wait_s, {_GPU_GAP})"
    f" ELSE least(greatest(data_wait_s - data_wait_in_step_s, 0), {_GPU_GAP})"
    " + least(data_wait_in_step_s, gpu_data_idle_s) END"
)

GRAD_COMM_SQL = _phase("coalesce(gpu_comm_exposed_s, comm_exposed_s, 0)", "coalesce(comm_exposed_s, 0)")
"""DDP's exposed gradient all-reduce of one step row. With NCCL the host's all-reduce futures complete
at enqueue: only the GPU's clock sees the wait. A GPU row without the GPU figure (an older agent, or
its event not resolved) keeps the host's."""

BLOCKED_SQL = _phase("coalesce(gpu_comm_blocked_s, comm_blocked_s, 0)", "coalesce(comm_blocked_s, 0)")
"""Time blocked in collectives outside DDP's gradient buckets (metric all-reduce, barriers, object
collectives, FSDP2 waits) of one step row; GPU stream time where the agent measured it."""

_GPU_NAMED = (
    f"coalesce({_EXPOSED_WAIT}, 0) + coalesce(h2d_s, 0) + coalesce(gpu_compute_s, 0)"
    " + coalesce(gpu_comm_exposed_s, comm_exposed_s, 0) + coalesce(gpu_optimizer_s, optimizer_s, 0)"
)
# GPU phases as the CUDA events bound them, before the blocking collectives are carved out of them.
_GPU_OTHER = f"greatest({PERIOD_SQL} - ({_GPU_NAMED}), 0)"
_GPU_OPTIMIZER = "coalesce(gpu_optimizer_s, optimizer_s, 0)"
_GPU_COMPUTE = "coalesce(gpu_compute_s, 0)"
_GPU_BLOCKED = "coalesce(gpu_comm_blocked_s, comm_blocked_s, 0)"
# The host's phases already leave the blocked time out (the agent takes it out of compute and other).
# The GPU's events do not: a metric all-reduce after optimizer.step() lies inside gpu_optimizer_s (its
# start to the step's end), an FSDP2 all-gather inside gpu_compute_s, anything else in the remainder.
# So on a GPU rank it is carved out of the remainder, then the optimizer span, then compute: nothing
# is counted twice and the phases still add up to the period.
_LEFT_AFTER_OTHER = f"greatest({_GPU_BLOCKED} - {_GPU_OTHER}, 0)"
_LEFT_AFTER_OPTIMIZER = f"greatest({_LEFT_AFTER_OTHER} - {_GPU_OPTIMIZER}, 0)"

PHASE_SQL: dict[str, str] = {
    "data_wait_s": _phase(_EXPOSED_WAIT, "data_wait_s"),
    "h2d_s": "h2d_s",  # GPU time; NULL on a CPU rank, so its share stays absent rather than zero
    "compute_s": _phase(f"greatest({_GPU_COMPUTE} - {_LEFT_AFTER_OPTIMIZER}, 0)", "coalesce(compute_s, 0)"),
    # Waiting at collectives: DDP's exposed gradient all-reduce plus the blocking collectives.
    "comm_exposed_s": _phase(
        f"coalesce(gpu_comm_exposed_s, comm_exposed_s, 0)"
        f" + least({_GPU_BLOCKED}, {_GPU_OTHER} + {_GPU_OPTIMIZER} + {_GPU_COMPUTE})",
        "coalesce(comm_exposed_s, 0) + coalesce(comm_blocked_s, 0)",
    ),
    "optimizer_s": _phase(f"greatest({_GPU_OPTIMIZER} - {_LEFT_AFTER_OTHER}, 0)", "coalesce(optimizer_s, 0)"),
    # GPU: the rest of the period (host work between steps, the gap after an all-reduce until the
    # optimizer), less blocked collectives. CPU: the host's own remainder.
    "other_s": _phase(f"greatest({_GPU_OTHER} - {_GPU_BLOCKED}, 0)", "coalesce(other_s, 0)"),
}
"""SQL for each phase of one step row, as a share of ``PERIOD_SQL``: GPU-stream phases on a GPU rank
(CUDA events), host phases on a CPU rank. They add up to the period (a NULL data wait counts as 0)."""


def breakdown_total(rows: list[dict]) -> dict:
    """All ranks in one row, from per-rank breakdown rows (``Run.breakdown``'s, or the dashboard rollup's):
    the one definition of the run's totals, so the CLI, the Verdict, Breakdown and Compare pages agree.

    Each phase's share is the ranks' shares weighted by their period sums (``steps`` x ``step_mean_s``), which
    is the share of the summed periods; a phase no rank measured (H2D on a CPU job) stays None, not 0.
    Returns ``rows`` (kept steps over all ranks), ``step_mean_s``, ``step_max_s`` (where the rows carry it),
    each ``<phase>_share`` and ``h2d_measured``.
    """
    steps = sum(r["steps"] or 0 for r in rows)
    weights = [(r["step_mean_s"] or 0) * (r["steps"] or 0) for r in rows]
    total_s = sum(weights)
    worst = [r["step_max_s"] for r in rows if r.get("step_max_s") is not None]
    out: dict = {
        "rows": steps,
        "step_mean_s": total_s / steps if steps else None,
        "step_max_s": max(worst) if worst else None,
    }
    for p in PHASES:
        key = f"{p[:-2]}_share"
        measured = [(r[key], w) for r, w in zip(rows, weights) if r.get(key) is not None]
        out[key] = sum(v * w for v, w in measured) / total_s if total_s and measured else None
    out["h2d_measured"] = out["h2d_share"] is not None or any(r.get("h2d_measured") for r in rows)
    return out
