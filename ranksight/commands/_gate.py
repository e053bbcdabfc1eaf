"""Is B's step time really different from A's, what moved it, and does it pass the gate?

One function, :func:`assess`, from the two runs' samples (``_gate_samples``), the side-by-side comparison
(``ranksight.dashboard.compare``: its findings' changes) and the gate config: the job's and each rank's
change with its interval (``_gate_stats``), the phases that moved it, the findings that explain it, and the
gate's status and exit code. The renderers (``_gate_report``) and ``--json`` print what it returns.
"""

from __future__ import annotations

import numpy as np

from ._gate_policy import DEFAULT_LIMIT, GateConfig, verdict
from ._gate_samples import Samples, job_series, steady
from ._gate_stats import MIN_STEPS, compare_series

EXIT_PASS, EXIT_FAIL, EXIT_INCOMPARABLE = 0, 1, 2

STRETCHED = ("compute_s", "optimizer_s", "other_s", "comm_exposed_s")
"""The phases a busier host stretches in a CPU job: the step's own work, and the wait at collectives for
peers on the same host whose work it stretched too."""

MAX_RANKS = 16
"""Ranks shown with their own interval (each costs a bootstrap); the job's series averages every rank."""

CONTENTION_MARGIN = 0.10
"""How much longer (or shorter) a CPU second of the step's own work may take in B than in A before the two
runs are taken to have run on differently busy hosts (``contention``)."""

CONTENTION_LIMIT = 1.5
"""Beyond this factor between the two hosts' stretch the runs cannot be compared: every phase (the waits
for a descheduled peer, a sleeper's late wake-up) stretches with the load, and scaling back the step's own
work alone no longer says what the code did."""


def _stretch(series: dict) -> float | None:
    """Wall seconds of the step's own work (compute, optimizer, the rest: not the data or collective waits)
    per CPU second of the training thread, median over steps; None on a GPU rank or without CPU times."""
    cpu = series.get("cpu_s")
    if cpu is None or series.get("on_gpu") is None or np.nansum(series["on_gpu"]) > 0:
        return None
    work = series["compute_s"] + series["optimizer_s"] + np.nan_to_num(series["other_s"])
    ok = np.isfinite(cpu) & (cpu > 0)
    return float(np.median(work[ok] / cpu[ok])) if ok.sum() >= 10 else None


def contention(ja: dict, jb: dict) -> dict | None:
    """Whether the host was busier in one run than the other (CPU jobs): on an idle core a CPU-bound step's
    own work takes one wall second per CPU second; when other processes share the cores it takes more.
    A code change that adds work adds CPU seconds too and leaves the ratio alone; a busier neighbour, or a
    quieter one, moves it. ``ratio`` is B's over A's; beyond ``CONTENTION_MARGIN`` the verdict is judged on
    the change with that taken out (``_adjust``)."""
    sa, sb = _stretch(ja), _stretch(jb)
    if sa is None or sb is None:
        return None
    return {"a": sa, "b": sb, "ratio": sb / sa, "differs": abs(sb / sa - 1) > CONTENTION_MARGIN}


def _incomparable(reason: str, config: GateConfig) -> dict:
    return {"status": "incomparable", "exit_code": EXIT_INCOMPARABLE, "reason": reason,
            "confidence": config.confidence, "limits": _limits(config)}  # fmt: skip


def _limits(config: GateConfig) -> dict:
    return {"step_time": config.step_time, "phases": dict(config.phases)}


def _adjust(series: dict, ratio: float) -> None:
    """Add ``adjusted_change``: the change with B's ``STRETCHED`` phases scaled back by the
    host's ``ratio``, as if B had run on a host as busy as A's. The data wait stays as it was: a slower input
    pipeline is the job's, whatever the host's load."""
    own = sum(series["phases"].get(p, {}).get("b_s", 0.0) for p in STRETCHED)
    shift = own * (1 - 1 / ratio) / series["step"]["a_s"]
    c = series["step"]["change"]
    series["step"]["adjusted_change"] = {k: c[k] - shift for k in ("point", "low", "high")}
    # Judged on the span of both intervals: the scaling is a model of the load, so it may turn a verdict into
    # "cannot tell" but never make a failure (or a "faster") that the measured change alone does not show.
    series["step"]["judged_change"] = {
        "point": c["point"] - shift,
        "low": min(c["low"], c["low"] - shift),
        "high": max(c["high"], c["high"] - shift),
    }


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
    """The phases ranked by how much of the change each explains; ``moved`` where its interval excludes 0."""
    change = job["step"]["change"]["point"]
    rows = []
    for phase, p in job["phases"].items():
        c = p["contribution"]
        moved = c["low"] > 0 or c["high"] < 0
        rows.append({"phase": phase, "contribution": c, "moved": moved,
                     "explains": c["point"] / change if abs(change) > 1e-12 else None})  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["contribution"]["point"]))


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
    for phase, phase_limit in config.phases.items():
        c = job["phases"].get(phase, {}).get("contribution")
        if c is not None and c["low"] > phase_limit:
            failed.append({"what": phase, "limit": phase_limit, "interval": c})
    host = contention(ja, jb)
    if host and max(host["ratio"], 1 / host["ratio"]) > CONTENTION_LIMIT:
        busier, factor = ("B", host["ratio"]) if host["ratio"] > 1 else ("A", 1 / host["ratio"])
        out = _incomparable(
            f"the host was {factor:.1f}x as busy in {busier} (wall seconds per CPU second of the step's own work: "
            f"A {host['a']:.2f}, B {host['b']:.2f}): the step times measure the neighbours; rerun on a quieter host",
            config,
        )
        return {**out, "contention": host}
    if host and host["differs"]:
        # Take out what the busier (or quieter) host did to B's own work, so the verdict is about the code.
        _adjust(job, host["ratio"])
        for r in ranks.values():
            _adjust(r, host["ratio"])
    judged = job["step"].get("judged_change", job["step"]["change"])
    if config.step_time is not None and judged["low"] > config.step_time:
        failed.insert(0, {"what": "step_time", "limit": config.step_time, "interval": judged})
    word = verdict(judged, limit)
    ratio = job["step"]["b_s"] / job["step"]["a_s"]
    status = "fail" if failed else ("pass" if config.active else "report")
    return {
        "status": status,
        "exit_code": EXIT_FAIL if failed else EXIT_PASS,
        "reason": None,
        "confidence": config.confidence,
        "limits": _limits(config),
        "verdict": word,
        "verdict_margin": limit,
        "contention": host,
        "failed": failed,
        "job": job,
        "ranks": {
            str(r): {**v, "verdict": verdict(v["step"].get("judged_change", v["step"]["change"]), limit)}
            for r, v in ranks.items()
        },
        "attribution": _attribution(job),
        "findings": _finding_costs(findings, ratio),
    }
