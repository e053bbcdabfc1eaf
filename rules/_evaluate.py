"""The pure evaluator: per-rank features in, ranked findings and a checklist out. No I/O.

Each rule is evaluated on every rank's features; the ranks where it fires make one finding, whose
severity is the worst rank's and whose evidence numbers come from that rank. Findings are then put
in the order a person should act on them: a root cause before what it explains (a rank that waits
for data, or computes slower, makes the others wait in all-reduce), then by severity, priority and
confidence.
"""

from __future__ import annotations

import math
import string

from ._expr import evaluate as eval_expr
from ._load import SEVERITIES, ChecklistItem, Rule

_SAMPLE_STEPS = 20  # steps after warm-up at which a per-rank median is taken as settled


def evaluate(rules: list[Rule], features: dict[int, dict]) -> list[dict]:
    """Return the findings of ``rules`` over ``features`` (rank -> feature dict), root cause first."""
    findings = []
    for rule in rules:
        hits = [hit for rank in sorted(features) if (hit := _fire(rule, features[rank])) is not None]
        if hits:
            findings.append(_finding(rule, hits, features))
    return rank_findings(findings, {r.id: r for r in rules})


def _fire(rule: Rule, env: dict):
    """(severity, confidence, value, env) when the rule fires on this rank, else None."""
    if rule.when is not None and not eval_expr(rule.when, env):
        return None
    value = eval_expr(rule.value, env) if rule.value is not None else None
    if rule.levels:
        if value is None or isinstance(value, bool) or not math.isfinite(value):
            return None
        reached = [sev for sev, t in rule.levels if (value >= t if rule.compare == ">=" else value <= t)]
        if not reached:
            return None
        severity = reached[-1]
        margin = _margin(value, rule.levels[0][1], rule.compare)
    else:
        severity, margin = rule.severity, 1.0
    steps = env.get("steps")
    settled = 0.5 if steps is None else min(1.0, steps / _SAMPLE_STEPS)
    # At most 0.95: a threshold rule on a few dozen steps is strong evidence, never proof.
    confidence = rule.confidence * (0.5 + 0.3 * margin + 0.15 * settled)
    return severity, round(confidence, 2), value, env


def _margin(value: float, threshold: float, compare: str) -> float:
    """0 at the first threshold, 1 at twice as far past it (ratio), clamped."""
    if compare == ">=":
        ratio = value / threshold if threshold > 0 else (2.0 if value > threshold else 1.0)
    else:
        ratio = threshold / value if value > 0 else 2.0
    return max(0.0, min(1.0, ratio - 1.0))


def _finding(rule: Rule, hits: list, features: dict[int, dict]) -> dict:
    def badness(hit):
        sev, conf, value, _ = hit
        extreme = 0.0 if value is None else (value if rule.compare == ">=" else -value)
        return (SEVERITIES.index(sev), extreme, conf)

    worst = max(hits, key=badness)
    severity, confidence, value, env = worst
    ranks = [h[3]["rank"] for h in hits]
    evidence = {name: _round(env.get(name)) for name in rule.evidence}
    if value is not None and rule.value is not None and rule.value.text not in evidence:
        evidence["value"] = _round(value)
    summary = _fill(rule.summary, {**env, "value": value, "ranks": _ranks_text(ranks, len(features))})
    return {
        "axis": rule.axis,
        "rule": rule.id,
        "severity": severity,
        "confidence": max(h[1] for h in hits),
        "ranks": ranks,
        "evidence": evidence,
        "summary": summary,
        "fix": {"text": rule.fix_text, "snippet": rule.fix_snippet},
    }


def rank_findings(findings: list[dict], rules: dict[str, Rule]) -> list[dict]:
    """Order findings: severity, priority, confidence; then each root cause ahead of what it explains."""
    order = sorted(
        findings,
        key=lambda f: (-SEVERITIES.index(f["severity"]), -rules[f["rule"]].priority, -f["confidence"], f["rule"]),
    )
    fired = {f["rule"]: f for f in order}
    explained_by: dict[str, str] = {}
    for f in order:
        if f["severity"] == "info":
            continue  # "probably fine" explains nothing: it must not displace a warning or a critical
        for other in rules[f["rule"]].explains:
            if other in fired and other not in explained_by and other != f["rule"]:
                explained_by[other] = f["rule"]
    # Move each explaining finding just before the first finding it explains; bounded against cycles.
    for _ in range(len(order) * len(order) + 1):
        moved = False
        for i, f in enumerate(order):
            cause = explained_by.get(f["rule"])
            j = next((k for k, g in enumerate(order) if g["rule"] == cause), None)
            if j is not None and j > i:
                order.insert(i, order.pop(j))
                moved = True
                break
        if not moved:
            break
    for f in order:
        cause = explained_by.get(f["rule"])
        if cause:
            f["summary"] += f" (likely a consequence of {cause}: fix that first)"
    return order


def run_checklist(items: list[ChecklistItem], features: dict[int, dict]) -> list[dict]:
    """Pass / warn / fail per checklist item, judged on the worst rank; n/a when no rank can say."""
    out = []
    for item in items:
        values = []
        for rank in sorted(features):
            env = features[rank]
            if item.when is not None and not eval_expr(item.when, env):
                continue
            value = eval_expr(item.value, env)
            if value is not None and not isinstance(value, bool) and math.isfinite(value):
                values.append(value)
        unit = "ratio" if item.value.text.strip().endswith(_RATIO_SUFFIXES) else "number"
        if not values:
            out.append({"item": item.item, "group": item.group, "status": "n/a", "value": None, "unit": unit})
            continue
        worst = max(values) if item.compare == ">=" else min(values)
        status = "fail" if _beyond(worst, item.fail, item.compare) else "pass"
        if status == "pass" and _beyond(worst, item.warn, item.compare):
            status = "warn"
        out.append({"item": item.item, "group": item.group, "status": status, "value": _round(worst), "unit": unit})
    return out


# Feature names in 0-1 (schema convention: the unit is in the name), shown as percentages.
_RATIO_SUFFIXES = ("_ratio", "_share", "_spread", "_overlap")


def _beyond(value: float, threshold: float, compare: str) -> bool:
    return value >= threshold if compare == ">=" else value <= threshold


def _round(value):
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 1e6 else round(value)
    return value


def _ranks_text(ranks: list[int], total: int) -> str:
    if total > 1 and len(ranks) == total:
        return "both ranks" if total == 2 else f"all {total} ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"ranks {shown}" + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")


class _Formatter(string.Formatter):
    """str.format over plain names only (the loader rejects dotted or indexed fields); None reads n/a."""

    def format_field(self, value, format_spec):
        if value is None:
            return "n/a"
        try:
            return super().format_field(value, format_spec)
        except (ValueError, TypeError):
            return str(value)


def _fill(template: str, env: dict) -> str:
    return _Formatter().vformat(template, (), env)
