"""Is B's step time really different from A's, what moved it, and does it pass the gate?

One function, :func:`assess`, from the two runs' samples (``_gate_samples``), the side-by-side comparison
(``ranksight.dashboard.compare``: its findings' changes) and the gate config: the job's and each rank's
change with its interval and the part of it the phases explain beyond the host's stretch (``_gate_stats``),
the phases that moved it, the findings that explain it, and the gate's status and exit code (``judge``).
The renderers (``_gate_report``) and ``--json`` print what it returns.
"""

from __future__ import annotations

from ._gate_policy import DEFAULT_LIMIT, GateConfig, verdict
from ._gate_samples import Samples, job_series, steady
from ._gate_stats import MIN_STEPS, compare_series

EXIT_PASS, EXIT_FAIL, EXIT_INCOMPARABLE = 0, 1, 2

MAX_RANKS = 16
"""Ranks shown with their own interval (each costs a bootstrap); the job's series averages every rank."""


def _incomparable(reason: str, config: GateConfig) -> dict:
    return {"status": "incomparable", "exit_code": EXIT_INCOMPARABLE, "reason": reason,
            "confidence": config.confidence, "limits": _limits(config)}  # fmt: skip


def _limits(config: GateConfig) -> dict:
    return {"step_time": config.step_time, "phases": dict(config.phases)}


def _pct(i: dict) -> str:
    return f"{100 * i['point']:+.1f} % [{100 * i['low']:+.1f} %, {100 * i['high']:+.1f} %]"


def judge(series: dict, limit: float) -> tuple[str, str | None]:
    """The verdict on a series' change (``compare_series``) and, for "cannot tell", why.

    Judged on ``explained``, the change the phases make beyond the host's uniform stretch of the step's own
    work: between two runs a busier host moves the step by more than its within-run interval shows, but not
    the own-work phases' shares of it. The step's measured change only withholds "no change": where it reaches past the
    limit and the phases do not, the step moved with every phase alike, which a busier host and a change
    that slows most of the step alike both do."""
    step, explained = series["step"]["change"], series["step"]["explained"]
    word = verdict(explained, limit)
    if word in ("slower", "faster"):
        return word, None
    if word == "cannot tell":
        return word, (
            f"the phases' part of the change, {_pct(explained)}, reaches past ±{100 * limit:g} % only in part: "
            "longer runs would settle it"
        )
    if verdict(step, limit) == "no change":
        return word, None
    stretch = series["step"]["host_stretch"]["point"]
    return "cannot tell", (
        f"the step moved {_pct(step)} but every phase of its own work moved with it (x{stretch:.2f}), as on a "
        f"busier or quieter host; beyond that the phases explain {_pct(explained)}. A change that slows most "
        "of the step alike reads the same: rerun both to tell"
    )


def why_incomparable(a: Samples, b: Samples, warmup_steps: int) -> str | None:
    """The one-line reason two runs cannot be compared, or None."""
    if a.world_size and b.world_size and a.world_size != b.world_size:
        return f"different world sizes: A has {a.world_size} ranks, B {b.world_size}"
    both = sorted(set(a.ranks) & set(b.ranks))
    if not both:
        return f"no rank in both runs (A: {sorted(a.ranks)}, B: {sorted(b.ranks)})"
    for side, s in (("A", a), ("B", b)):
        kept = min(len(steady(s.ranks[r], warmup_steps)["step"]) for r in both)
        if kept < MIN_STEPS:
            return (
                f"too few steps to decide: {side} ({s.run}) keeps {kept} per rank after warm-up, "
                f"the gate needs {MIN_STEPS}"
            )
    return None


def _attribution(job: dict) -> list[dict]:
    """The phases ranked by how much of the change each explains beyond the host's stretch (``excess``),
    ``moved`` where that interval excludes 0; the exposed wait at collectives (no ``excess``: it holds the
    wait for peers the load slowed) last, with its measured part of the change."""
    explained = job["step"]["explained"]["point"]
    rows = []
    for phase, p in job["phases"].items():
        e = p.get("excess")
        moved = e is not None and (e["low"] > 0 or e["high"] < 0)
        explains = e["point"] / explained if e is not None and abs(explained) > 1e-12 else None
        rows.append({"phase": phase, "contribution": p["contribution"], "excess": e, "moved": moved,
                     "explains": explains})  # fmt: skip
    return sorted(rows, key=lambda r: (r["excess"] is None, -abs((r["excess"] or r["contribution"])["point"])))


def _finding_costs(findings: dict, ratio: float) -> list[dict]:
    """The findings that appeared, disappeared or changed cost, each with the part of the step-time change it
    accounts for (in A's step time: a cost in B counts ``ratio`` = B / A times), largest first."""
    rows = []
    for f in findings.get("appeared", []):
        if f.get("cost_share") is not None:
            rows.append({"rule": f["rule"], "how": "appeared", "cost_a": None, "cost_b": f["cost_share"],
                         "accounts_for": f["cost_share"] * ratio})  # fmt: skip
    for f in findings.get("disappeared", []):
        if f.get("cost_share") is not None:
            rows.append({"rule": f["rule"], "how": "disappeared", "cost_a": f["cost_share"], "cost_b": None,
                         "accounts_for": -f["cost_share"]})  # fmt: skip
    for f in findings.get("changed", []):
        if f.get("cost_share_a") is not None and f.get("cost_share_b") is not None:
            rows.append({"rule": f["rule"], "how": "changed", "cost_a": f["cost_share_a"], "cost_b": f["cost_share_b"],
                         "accounts_for": f["cost_share_b"] * ratio - f["cost_share_a"]})  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["accounts_for"]))


def assess(a: Samples, b: Samples, findings: dict, config: GateConfig, warmup_steps: int) -> dict:
    """The change of B against A with intervals, its attribution, and the gate's status and exit code."""
    reason = why_incomparable(a, b, warmup_steps)
    if reason:
        return _incomparable(reason, config)
    both = sorted(set(a.ranks) & set(b.ranks))
    ra = {r: steady(a.ranks[r], warmup_steps) for r in both}
    rb = {r: steady(b.ranks[r], warmup_steps) for r in both}
    ja, jb = job_series(ra, both), job_series(rb, both)
    if min(len(ja["step"]), len(jb["step"])) < MIN_STEPS:
        return _incomparable(f"too few steps that all ranks share (the gate needs {MIN_STEPS})", config)
    job = compare_series(ja, jb, config.confidence)
    # Each rank's own interval for the first MAX_RANKS ranks: the job's verdict rests on all of them.
    ranks = {r: compare_series(ra[r], rb[r], config.confidence) for r in both[:MAX_RANKS]}
    limit = config.step_time if config.step_time is not None else DEFAULT_LIMIT
    failed = []
    explained = job["step"]["explained"]
    if config.step_time is not None and explained["low"] > config.step_time:
        failed.append({"what": "step_time", "limit": config.step_time, "interval": explained})
    for phase, phase_limit in config.phases.items():
        p = job["phases"].get(phase, {})
        c = p.get("excess") or p.get("contribution")
        if c is not None and c["low"] > phase_limit:
            failed.append({"what": phase, "limit": phase_limit, "interval": c})
    word, why = judge(job, limit)
    ratio = job["step"]["b_s"] / job["step"]["a_s"]
    status = "fail" if failed else ("pass" if config.active else "report")
    return {
        "status": status,
        "exit_code": EXIT_FAIL if failed else EXIT_PASS,
        "reason": None,
        "confidence": config.confidence,
        "limits": _limits(config),
        "verdict": word,
        "verdict_reason": why,
        "verdict_margin": limit,
        "failed": failed,
        "job": job,
        "ranks": {str(r): {**v, "verdict": judge(v, limit)[0]} for r, v in ranks.items()},
        "attribution": _attribution(job),
        "findings": _finding_costs(findings, ratio),
    }
