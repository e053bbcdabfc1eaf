"""SQL for one step row's period and phases: the one definition every reader of step rows shares.

Why a module of its own: the collectors' queries, the dashboard's rollup and the node spool's publisher
(which writes each published file's digest, ``ranksight.format.digest``) all sum these expressions. The
publisher is part of the agent, which reads nothing of ``ranksight.collectors``; text that both import
keeps one definition of each figure.
"""

from __future__ import annotations

import math

PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s")
"""The step phases a breakdown shows; their shares of the step period add up to 1 (see ``PHASE_SQL``)."""

SAMPLED_SQL = "gpu_sampled IS DISTINCT FROM false"
"""The step rows phase figures rest on: every row but a GPU rank's steps that recorded no CUDA events
(``GpuOptions.events_every_steps``). Such a row's host phases are not the GPU's (the host runs ahead of a
GPU-bound job), so mixing them in would blur the shares; a share from the sampled steps estimates the
every-step share (within 0.78 pp at 1 step in 16 on an H200). Rows of older agents lack the column: NULL, kept."""

# Each figure below is an expression over one step row's columns (``Expr``), written once and read two ways:
# as DuckDB SQL by the readers (``.sql``) and as Python over a row dict by the agent's live metrics
# (``.value``), with SQL's NULL rules in both (a NULL operand makes a sum NULL; least/greatest/coalesce skip
# NULLs).


class Expr:
    """A step-row expression: ``sql`` for DuckDB, ``value(row)`` for a row dict (None for NULL)."""

    def sql(self) -> str:
        raise NotImplementedError

    def value(self, row: dict):
        raise NotImplementedError

    def __add__(self, other: Expr) -> Expr:
        return _Arith("+", self, other)

    def __sub__(self, other: Expr) -> Expr:
        return _Arith("-", self, other)


class _Col(Expr):
    def __init__(self, name: str) -> None:
        self.name = name

    def sql(self) -> str:
        return self.name

    def value(self, row: dict):
        v = row.get(self.name)
        # A non-finite float from a broken clock reads as not measured, as a NULL would.
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


class _Num(Expr):
    def __init__(self, number: float) -> None:
        self.number = number

    def sql(self) -> str:
        return repr(self.number) if self.number else "0"

    def value(self, row: dict):
        return self.number


class _Arith(Expr):
    def __init__(self, op: str, a: Expr, b: Expr) -> None:
        self.op, self.a, self.b = op, a, b

    def sql(self) -> str:
        b = self.b.sql()
        return f"{self.a.sql()} {self.op} {f'({b})' if self.op == '-' and isinstance(self.b, _Arith) else b}"

    def value(self, row: dict):
        a, b = self.a.value(row), self.b.value(row)
        if a is None or b is None:
            return None
        return a + b if self.op == "+" else a - b


class _Call(Expr):
    def __init__(self, name: str, *args: Expr) -> None:
        self.name, self.args = name, args

    def sql(self) -> str:
        return f"{self.name}({', '.join(a.sql() for a in self.args)})"

    def value(self, row: dict):
        if self.name == "coalesce":
            for a in self.args:
                v = a.value(row)
                if v is not None:
                    return v
            return None
        found = [v for a in self.args if (v := a.value(row)) is not None]
        if not found:
            return None
        return min(found) if self.name == "least" else max(found)


class _Null:
    """A test on a row: some column is NULL (``any_null``), or not (``~``)."""

    def __init__(self, names: tuple[str, ...], negate: bool = False) -> None:
        self.names, self.negate = names, negate

    def __invert__(self) -> _Null:
        return _Null(self.names, not self.negate)

    def sql(self) -> str:
        return " OR ".join(f"{n} IS {'NOT ' if self.negate else ''}NULL" for n in self.names)

    def holds(self, row: dict) -> bool:
        missing = [_Col(n).value(row) is None for n in self.names]
        return not any(missing) if self.negate else any(missing)


class _Case(Expr):
    def __init__(self, *branches: tuple[_Null, Expr], otherwise: Expr | None) -> None:
        self.branches, self.otherwise = branches, otherwise

    def sql(self) -> str:
        whens = " ".join(f"WHEN {test.sql()} THEN {then.sql()}" for test, then in self.branches)
        return f"CASE {whens}{f' ELSE {self.otherwise.sql()}' if self.otherwise is not None else ''} END"

    def value(self, row: dict):
        for test, then in self.branches:
            if test.holds(row):
                return then.value(row)
        return self.otherwise.value(row) if self.otherwise is not None else None


class _Nothing(Expr):
    """SQL's NULL."""

    def sql(self) -> str:
        return "NULL"

    def value(self, row: dict):
        return None


def col(name: str) -> Expr:
    return _Col(name)


def coalesce(*args: Expr) -> Expr:
    return _Call("coalesce", *args)


def least(*args: Expr) -> Expr:
    return _Call("least", *args)


def greatest(*args: Expr) -> Expr:
    return _Call("greatest", *args)


ZERO = _Num(0)
_ON_GPU = ~_Null(("gpu_step_s",))


def on_gpu(gpu: Expr, cpu: Expr) -> Expr:
    """``gpu`` on a GPU rank's row (it has the GPU's step time), ``cpu`` on a CPU rank's."""
    return _Case((_ON_GPU, gpu), otherwise=cpu)


_GPU_GAP = coalesce(col("gpu_gap_s"), col("data_wait_s"), ZERO)

PERIOD = on_gpu(_GPU_GAP + col("gpu_step_s"), col("step_s"))
"""What one step costs. On a CPU rank its wall time. On a GPU rank the GPU stream's time from the
previous step's end to this one's (the idle gap before the step plus the step): the host runs ahead
of a GPU-bound job, so its own clock says when it queued work, not what the work cost; in steady
state the two agree."""

# The data wait that starved the GPU: a host wait costs the GPU only what its stream sat idle for it,
# the wait before the step at most the idle gap before it (gpu_gap_s), the wait inside it at most what
# its mon.data() blocks cost the stream (gpu_data_idle_s, a prefetch between forward and backward,
# already taken out of the GPU phase it fell in); the rest was hidden behind queued work. A gap before
# the step caused by something else (logging) never counts an in-step wait as exposed. Rows without
# the in-step columns (older agents, no in-step blocks) judge the whole wait against the gap. NULL
# data_wait_s means "not measured" (no wrapped loader, no mon.data() marks), and stays NULL: a share of
# 0 would claim the input is fine.
_EXPOSED_WAIT = _Case(
    (_Null(("data_wait_s",)), _Nothing()),
    (_Null(("gpu_data_idle_s", "data_wait_in_step_s")), least(col("data_wait_s"), _GPU_GAP)),
    otherwise=least(greatest(col("data_wait_s") - col("data_wait_in_step_s"), ZERO), _GPU_GAP)
    + least(col("data_wait_in_step_s"), col("gpu_data_idle_s")),
)

GRAD_COMM = on_gpu(
    coalesce(col("gpu_comm_exposed_s"), col("comm_exposed_s"), ZERO), coalesce(col("comm_exposed_s"), ZERO)
)
"""DDP's exposed gradient all-reduce of one step row. With NCCL the host's all-reduce futures complete
at enqueue: only the GPU's clock sees the wait. A GPU row without the GPU figure (an older agent, or
its event not resolved) keeps the host's."""

BLOCKED = on_gpu(
    coalesce(col("gpu_comm_blocked_s"), col("comm_blocked_s"), ZERO), coalesce(col("comm_blocked_s"), ZERO)
)
"""Time blocked in collectives outside DDP's gradient buckets (metric all-reduce, barriers, object
collectives, FSDP2 waits) of one step row; GPU stream time where the agent measured it."""

_GPU_OPTIMIZER = coalesce(col("gpu_optimizer_s"), col("optimizer_s"), ZERO)
_GPU_COMPUTE = coalesce(col("gpu_compute_s"), ZERO)
_GPU_BLOCKED = coalesce(col("gpu_comm_blocked_s"), col("comm_blocked_s"), ZERO)
_GPU_GRAD = coalesce(col("gpu_comm_exposed_s"), col("comm_exposed_s"), ZERO)
_GPU_NAMED = coalesce(_EXPOSED_WAIT, ZERO) + coalesce(col("h2d_s"), ZERO) + _GPU_COMPUTE + _GPU_GRAD + _GPU_OPTIMIZER
# GPU phases as the CUDA events bound them, before the blocking collectives are carved out of them.
_GPU_OTHER = greatest(PERIOD - _GPU_NAMED, ZERO)
# The host's phases already leave the blocked time out (the agent takes it out of compute and other).
# The GPU's events do not: a metric all-reduce after optimizer.step() lies inside gpu_optimizer_s (its
# start to the step's end), an FSDP2 all-gather inside gpu_compute_s, anything else in the remainder.
# So on a GPU rank it is carved out of the remainder, then the optimizer span, then compute: nothing
# is counted twice and the phases still add up to the period.
_LEFT_AFTER_OTHER = greatest(_GPU_BLOCKED - _GPU_OTHER, ZERO)
_LEFT_AFTER_OPTIMIZER = greatest(_LEFT_AFTER_OTHER - _GPU_OPTIMIZER, ZERO)

PHASE: dict[str, Expr] = {
    "data_wait_s": on_gpu(_EXPOSED_WAIT, col("data_wait_s")),
    "h2d_s": col("h2d_s"),  # GPU time; NULL on a CPU rank, so its share stays absent rather than zero
    "compute_s": on_gpu(greatest(_GPU_COMPUTE - _LEFT_AFTER_OPTIMIZER, ZERO), coalesce(col("compute_s"), ZERO)),
    # Waiting at collectives: DDP's exposed gradient all-reduce plus the blocking collectives.
    "comm_exposed_s": on_gpu(
        _GPU_GRAD + least(_GPU_BLOCKED, _GPU_OTHER + _GPU_OPTIMIZER + _GPU_COMPUTE),
        coalesce(col("comm_exposed_s"), ZERO) + coalesce(col("comm_blocked_s"), ZERO),
    ),
    "optimizer_s": on_gpu(greatest(_GPU_OPTIMIZER - _LEFT_AFTER_OTHER, ZERO), coalesce(col("optimizer_s"), ZERO)),
    # GPU: the rest of the period (host work between steps, the gap after an all-reduce until the
    # optimizer), less blocked collectives. CPU: the host's own remainder.
    "other_s": on_gpu(greatest(_GPU_OTHER - _GPU_BLOCKED, ZERO), coalesce(col("other_s"), ZERO)),
}
"""Each phase of one step row, as a share of ``PERIOD``: GPU-stream phases on a GPU rank (CUDA events), host
phases on a CPU rank. They add up to the period (a NULL data wait counts as 0)."""

PERIOD_SQL = PERIOD.sql()
PHASE_SQL: dict[str, str] = {p: e.sql() for p, e in PHASE.items()}
GRAD_COMM_SQL = GRAD_COMM.sql()
BLOCKED_SQL = BLOCKED.sql()

HOST_NAMED = ("data_wait_s", "compute_s", "comm_exposed_s", "comm_blocked_s", "optimizer_s")
"""The host phases the agent (``agent/_assemble.py``) and the trace importer measure; ``other_s`` is the rest."""


def host_other(step, *named):
    """A host step row's ``other_s``: the step less its measured phases (``HOST_NAMED``, in that order; None
    for one not measured), never below 0; in the unit of its arguments."""
    rest = step - sum(x for x in named if x)
    return rest if rest > 0 else type(step)(0)


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
