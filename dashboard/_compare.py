"""Compare two runs (before / after a change) from their diagnoses: one pure function for the CLI and the page.

``ranksight compare A B`` and the dashboard's Compare page both call :func:`compare` on the two
``ranksight.rules.diagnose`` results, so they always agree. It reads nothing: the per-rank breakdown
inside each diagnosis gives step time and phase shares (warm-up left out), and the findings give what
each rule says a fix is worth (``cost_share``, ``speedup``).
"""

from __future__ import annotations

from statistics import median

from ranksight.collectors import PHASES
from ranksight.format.phases import breakdown_total

from ._queries import PHASE_LABELS

CHANGED_COST = 0.02
"""A finding present in both runs counts as changed when its cost moved by this share of step time or more
(or its severity changed): smaller moves are within a short run's noise."""


def _figures(diag: dict) -> dict:
    """Step time, throughput and phase shares over all ranks of one diagnosed run."""
    rows = diag.get("breakdown", {}).get("ranks", [])
    total = breakdown_total(rows)
    mean = total.get("step_mean_s") or None
    out = {
        "ranks": len(rows),
        "steps": total["rows"],  # over all ranks, after warm-up
        "steps_per_rank": max((r["steps"] for r in rows), default=0),
        "step_mean_s": mean,
        "step_median_s": median(r["step_median_s"] for r in rows) if rows else None,
        "slowest_rank_step_mean_s": max((r["step_mean_s"] for r in rows), default=None),
        # Ranks step in lock-step under DDP: the job's step rate is one over the mean step time.
        "throughput_steps_s": 1.0 / mean if mean else None,
    }
    for p in PHASES:
        out[f"{p[:-2]}_share"] = total.get(f"{p[:-2]}_share")
    return out


METRICS: tuple[tuple[str, str, str], ...] = (
    ("step_mean_s", "mean step time", "s"),
    ("step_median_s", "median step time", "s"),
    ("slowest_rank_step_mean_s", "slowest rank's mean step time", "s"),
    ("throughput_steps_s", "throughput", "steps/s"),
) + tuple((f"{p[:-2]}_share", f"{PHASE_LABELS[p]} share", "ratio") for p in PHASES)
"""(key, label, unit) of each row of the side-by-side table, in order."""


def _finding(f: dict) -> dict:
    return {k: f.get(k) for k in ("rule", "severity", "axis", "ranks", "cost_share", "speedup", "summary")}


def _findings_delta(a: list[dict], b: list[dict]) -> dict:
    by_a = {f["rule"]: f for f in reversed(a)}  # the first finding of a rule wins
    by_b = {f["rule"]: f for f in reversed(b)}
    appeared = [_finding(f) for f in b if f["rule"] not in by_a and by_b[f["rule"]] is f]
    disappeared = [_finding(f) for f in a if f["rule"] not in by_b and by_a[f["rule"]] is f]
    changed, unchanged = [], []
    for f in a:
        if f["rule"] not in by_b or by_a[f["rule"]] is not f:
            continue
        g = by_b[f["rule"]]
        cost_a, cost_b = f.get("cost_share"), g.get("cost_share")
        delta = None if cost_a is None or cost_b is None else cost_b - cost_a
        row = {
            "rule": f["rule"],
            "severity_a": f.get("severity"),
            "severity_b": g.get("severity"),
            "cost_share_a": cost_a,
            "cost_share_b": cost_b,
            "cost_delta": delta,
            "speedup_a": f.get("speedup"),
            "speedup_b": g.get("speedup"),
            "summary": g.get("summary"),
        }
        moved = (delta is not None and abs(delta) >= CHANGED_COST) or (cost_a is None) != (cost_b is None)
        (changed if moved or row["severity_a"] != row["severity_b"] else unchanged).append(row)
    return {"appeared": appeared, "disappeared": disappeared, "changed": changed, "unchanged": unchanged}


def compare(diag_a: dict, diag_b: dict) -> dict:
    """Run B against run A (both ``diagnose`` results): the figures side by side with B - A and B / A - 1,
    the step-time speedup of B over A (A's mean step time / B's: above 1 when B is faster), and the
    findings that appeared in B, disappeared from A, changed cost or stayed."""
    fig_a, fig_b = _figures(diag_a), _figures(diag_b)
    metrics = []
    for key, label, unit in METRICS:
        va, vb = fig_a.get(key), fig_b.get(key)
        delta = None if va is None or vb is None else vb - va
        # A share's change is its difference in points: relative to a near-zero share it reads as thousands of %.
        relative = None if delta is None or not va or unit == "ratio" else delta / va
        row = {"key": key, "metric": label, "unit": unit, "a": va, "b": vb}
        metrics.append({**row, "delta": delta, "relative": relative})
    mean_a, mean_b = fig_a["step_mean_s"], fig_b["step_mean_s"]
    return {
        "a": {"run": diag_a.get("run"), **fig_a},
        "b": {"run": diag_b.get("run"), **fig_b},
        "metrics": metrics,
        "speedup": mean_a / mean_b if mean_a and mean_b else None,
        "findings": _findings_delta(diag_a.get("findings", []), diag_b.get("findings", [])),
    }


def speedup_sentence(result: dict) -> str:
    """'B's steps are 1.46× faster than A's (mean 253.1 ms -> 173.4 ms)', or slower, or unknown."""
    s, a, b = result["speedup"], result["a"]["step_mean_s"], result["b"]["step_mean_s"]
    if s is None:
        return "step-time speedup: unknown (a run has no steps after warm-up)"
    means = f"(mean step {1000 * a:.1f} ms -> {1000 * b:.1f} ms)"
    if s >= 1:
        return f"B's steps are {s:.2f}× faster than A's {means}"
    return f"B's steps are {1 / s:.2f}× slower than A's {means}"
