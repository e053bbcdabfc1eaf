"""``diagnose(run_path)``: read a run, compute its features, apply the rules (the one place that does I/O)."""

from __future__ import annotations

import os
import statistics
import time

from ranksight.collectors import Run, RunDirError, open_run
from ranksight.format.warmup import WARMUP_STEPS

from ._evaluate import evaluate, run_checklist
from ._expr import Frame
from ._load import RuleSet, load_rules


def diagnose(
    run_path: str | Run, rules_dir: str | None = None, *, warmup_steps: int = WARMUP_STEPS, since_s: float | None = None
) -> dict:
    """Diagnose a run directory (live, finished or crashed); the object ``ranksight diagnose --json`` prints.

    ``run_path``: the folder, or a ``Run`` a caller already holds (``collectors.open_run``), whose kept figures
    the verdict then shares. A folder is opened with ``follow_spool=False``: one reading, which a concurrent
    prune cannot fail.

    With ``since_s`` the verdict is the recent window's (steps that ended in the last ``since_s`` seconds
    of the run's data), and ``change`` says whether and since when it differs from the whole run's.
    Raises RunDirError for a path that is not a run (or has nothing recorded yet) and RuleError for bad
    rule files.
    """
    rules = load_rules(rules_dir)  # bad rules are reported before any data is read
    run = run_path if isinstance(run_path, Run) else open_run(run_path, follow_spool=False)
    run_path = run.path
    metas = run.ranks
    whole = _judge(run, rules, warmup_steps, None)
    if not metas and not whole["breakdown"]["ranks"]:
        raise RunDirError(f"{run_path}: no rank has recorded anything yet")
    run_ids = sorted({m.data.get("run") for m in metas if m.data.get("run")})
    name = run_ids[0] if len(run_ids) == 1 else os.path.basename(os.path.normpath(run_path))
    if since_s is None:
        return {"run": name, **whole}
    end_ns, since_ns = run.end_ns, run.since_ns(since_s)
    if end_ns is None:
        return {"run": name, **whole, "window": None, "change": None}
    recent = _judge(run, rules, warmup_steps, since_s)
    window = {
        "since_s": since_s,
        "start_ns": since_ns,
        "end_ns": end_ns,
        "steps": max((r["steps"] for r in recent["breakdown"]["ranks"]), default=0),
    }
    change = verdict_change(whole["findings"], recent["findings"], run.step_series(warmup_steps=warmup_steps), since_ns)
    return {"run": name, **recent, "window": window, "change": change, "whole_run": {"findings": whole["findings"]}}


def _judge(run: Run, rules: RuleSet, warmup_steps: int, window: float | None) -> dict:
    # The features first: their first read of the digests takes every part they need, the breakdown's too.
    features = run.features(warmup_steps=warmup_steps, window=window)
    breakdown = run.breakdown(warmup_steps=warmup_steps, window=window)
    context = run.context(warmup_steps=warmup_steps, window=window)
    frame = Frame(features)  # the features as columns, built as the rules read them, for both
    return {
        "findings": evaluate(rules.rules, frame, context),
        "breakdown": {"ranks": breakdown},
        "checklist": run_checklist(rules.checklist, frame),
        "other_time": _other_time(breakdown, run.ranks),
    }


OTHER_SHOWN_FROM = 0.05
"""An "other" share from which the report says what the sampled stack window saw there."""


def _other_time(breakdown: list[dict], metas: list) -> list[dict]:
    """Per rank with a sizeable "other" share: where the agent's sampled stack window found the training
    thread during that time (``host_other_top`` in the rank file)."""
    tops = {m.rank: m.data.get("host_other_top") for m in metas}
    rows = [(row, row.get("other_share"), tops.get(row["rank"])) for row in breakdown]
    return [
        {"rank": row["rank"], "other_share": share, "top": top["top"], "samples": top.get("other_samples")}
        for row, share, top in rows
        if isinstance(share, (int, float)) and share >= OTHER_SHOWN_FROM and isinstance(top, dict) and top.get("top")
    ]


def verdict_change(whole: list[dict], recent: list[dict], series: list[tuple[int, float]], since_ns: int) -> dict:
    """Whether the recent window's verdict (first warning or critical finding) differs from the whole run's,
    and since when the step time has been what it is now: where the step period crossed to the recent level,
    walking back from the window's start while a 5-step running median stays nearer the recent median."""
    before, now = (next((f for f in findings if f["severity"] != "info"), None) for findings in (whole, recent))
    key = lambda f: None if f is None else (f["rule"], tuple(f["ranks"]))  # noqa: E731
    earlier = [p for t, p in series if t <= since_ns]
    later = [p for t, p in series if t > since_ns]
    step_before = statistics.median(earlier) if earlier else None
    step_now = statistics.median(later) if later else None
    onset = _onset(series, since_ns, step_before, step_now)
    out = {
        "changed": key(before) != key(now),
        "before": None if before is None else {"rule": before["rule"], "severity": before["severity"]},
        "now": None if now is None else {"rule": now["rule"], "severity": now["severity"]},
        "since_ns": onset,
        "since": time.strftime("%H:%M:%S", time.localtime(onset / 1e9)) if onset else None,
        "step_before_s": step_before,
        "step_now_s": step_now,
    }
    out["text"] = _change_text(out)
    return out


def _onset(series: list[tuple[int, float]], since_ns: int, before: float | None, now: float | None) -> int | None:
    start = next((i for i, (t, _) in enumerate(series) if t > since_ns), None)
    if start is None:
        return None
    if before is None or now is None or abs(now - before) <= 0.1 * max(before, now):
        return series[start][0]  # the step time did not move: the window's start is all we can say

    def smooth(i: int) -> float:
        return statistics.median(p for _, p in series[max(0, i - 2) : i + 3])

    i = start
    while i > 0 and abs(smooth(i - 1) - now) < abs(smooth(i - 1) - before):
        i -= 1
    return series[i][0]


def _change_text(c: dict) -> str:
    now, before = c["now"], c["before"]
    steps = ""
    if c["step_before_s"] is not None and c["step_now_s"] is not None:
        steps = f", step time {_ms(c['step_before_s'])} → {_ms(c['step_now_s'])} ms"
    if not c["changed"]:
        what = now["rule"] if now else "no warning or critical finding"
        return f"unchanged: the whole run says the same ({what}){steps}"
    if now is None:
        return f"recovered since {c['since']}: no warning or critical finding now (whole run: {before['rule']}){steps}"
    was = before["rule"] if before else "no warning or critical finding"
    return f"{now['rule']} since {c['since']}{steps} (whole run: {was})"


def _ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def diagnose_features(
    run_path: str | Run, *, warmup_steps: int = WARMUP_STEPS, since_s: float | None = None
) -> dict[int, dict]:
    """The per-rank features ``diagnose`` judges (``ranksight diagnose --features``), of a folder or a ``Run``."""
    run = run_path if isinstance(run_path, Run) else open_run(run_path, follow_spool=False)
    return run.features(warmup_steps=warmup_steps, window=since_s)
