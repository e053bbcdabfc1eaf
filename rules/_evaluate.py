"""The pure evaluator: per-rank features in, ranked findings and a checklist out. No I/O.

Each rule is evaluated on every rank's features; the ranks where it fires make one finding, whose
severity is the worst rank's and whose evidence numbers come from that rank. A rule with a ``cost``
says what share of the step time its fix would give back (``cost_share``, and ``speedup`` =
1 / (1 - cost_share)). Findings are then put in the order a person should act on them: by severity,
then by what fixing them gives back, then confidence; and a root cause before what it explains (a
rank that waits for data, or computes slower, makes the others wait at collectives).

The ranks a rule can fire on are found over all ranks at once (``_vector``: its ``when``, and for a rule
with levels its value past the lowest level, as numpy arrays over the features' columns); the per-rank
code below then judges those ranks alone, so at 10,000 ranks it runs for the few ranks and rules that
fire, not for every pair. ``per_rank=True`` judges every rank, as this evaluator did before; a rule whose
expressions the columns cannot evaluate exactly is judged that way too (``Frame.fallbacks`` names it).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np

from ranksight.collectors import CONTEXT_DEFAULTS

from . import _vector
from ._expr import evaluate as eval_expr
from ._load import SEVERITIES, ChecklistItem, Rule, format_spec_problem
from ._vector import Frame, NotVectorised

_SAMPLE_STEPS = 20  # steps after warm-up at which a per-rank median is taken as settled
_MAX_COST = 0.99  # a fix cannot give back the whole step; keeps the speedup finite


@dataclass(frozen=True)
class _Hit:
    """A rule firing on one rank."""

    severity: str
    confidence: float
    value: float | None
    cost: float | None
    env: dict


def evaluate(
    rules: list[Rule],
    features: dict[int, dict] | Frame,
    context: dict[int, dict] | None = None,
    *,
    per_rank: bool = False,
) -> list[dict]:
    """Return the findings of ``rules`` over ``features`` (rank -> feature dict, or a ``Frame`` of them
    the checklist then reads too), root cause first.

    ``context`` (rank -> {name: string}, see ``ranksight.collectors.CONTEXT``) fits the fix text and
    snippets to the job (its framework, transport); without it the plain-PyTorch fix is given.
    ``per_rank`` judges every rule on every rank (the specification the columns are tested against).
    """
    context = context or {}
    frame = features if isinstance(features, Frame) else Frame(features)
    findings, explains = [], {}
    for rule in rules:
        ranks = frame.ranks if per_rank else candidates(rule, frame)
        hits = [hit for rank in ranks if (hit := _fire(rule, frame.features[rank])) is not None]
        if hits:
            findings.append(_finding(rule, hits, frame.n, context))
            explains[rule.id] = explained_here(rule, [h.env for h in hits])
    return rank_findings(findings, {r.id: r for r in rules}, explains)


def candidates(rule: Rule, frame: Frame) -> list[int]:
    """The ranks (ascending) on which ``rule`` may fire: its ``when`` holds and, with levels, its value is
    known and reaches the lowest level after the noise; every rank where the columns cannot say exactly."""
    try:
        mask = _vector.when_mask(rule.when, frame)
        if rule.levels and mask.any():
            mask = mask & _levels_reached(rule, frame)
    except NotVectorised:
        frame.fallbacks.append(rule.id)
        return frame.ranks
    return [frame.ranks[i] for i in np.flatnonzero(mask)]


def _levels_reached(rule: Rule, frame: Frame) -> np.ndarray:
    """Where ``_fire``'s level test can pass: the value a finite number past some level after the noise."""
    everywhere = np.ones(frame.n, dtype=bool)
    if rule.value is None:
        return ~everywhere  # no value is never known
    value = _vector.evaluate(rule.value, frame)
    if value.bools:
        return everywhere  # a bool is not a number to _known: left to _fire
    noise = 0.0
    if rule.noise is not None:
        spread = _vector.evaluate(rule.noise, frame)
        if spread.bools:
            return everywhere
        noise = np.where(_vector.known(spread) & (spread.val > 0), spread.val, 0.0)
    with np.errstate(all="ignore"):
        judged = value.val - noise if rule.compare == ">=" else value.val + noise
    reached = np.zeros(1, dtype=bool)
    for _, threshold in rule.levels:
        reached = reached | (judged >= threshold if rule.compare == ">=" else judged <= threshold)
    return np.broadcast_to(_vector.known(value) & reached, (frame.n,))


def explained_here(rule: Rule, envs: list[dict]) -> tuple:
    """The rules this one explains on this job: each unconditional one, and each conditional one whose
    condition holds on a rank where this rule fired."""
    return tuple(
        other
        for other in rule.explains
        if other not in rule.explains_when or any(eval_expr(rule.explains_when[other], env) for env in envs)
    )


def _known(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def cost_share(rule: Rule, env: dict) -> float | None:
    """The rule's cost on one rank's features, clamped to [0, 0.99]; None when it has none or it is unknown."""
    if rule.cost is None:
        return None
    value = eval_expr(rule.cost, env)
    return max(0.0, min(_MAX_COST, float(value))) if _known(value) else None


def speedup(cost: float | None) -> float | None:
    """How many times faster a step gets when ``cost`` of it goes away."""
    return None if cost is None else round(1.0 / (1.0 - cost), 2)


def _fire(rule: Rule, env: dict) -> _Hit | None:
    """The hit when the rule fires on this rank, else None."""
    if rule.when is not None and not eval_expr(rule.when, env):
        return None
    value = eval_expr(rule.value, env) if rule.value is not None else None
    cost = cost_share(rule, env)
    if rule.levels:
        if not _known(value):
            return None
        # The effect must clear each threshold by its own uncertainty (per-step spread), so noise cannot tip it.
        noise = eval_expr(rule.noise, env) if rule.noise is not None else None
        noise = noise if _known(noise) and noise > 0 else 0.0
        judged = value - noise if rule.compare == ">=" else value + noise
        reached = [sev for sev, t in rule.levels if _beyond(judged, t, rule.compare)]
        if not reached:
            return None
        severity = reached[-1]
        # How far past the band it reached (after the noise): a cost just past 10 % is a weaker warning
        # than one at 20 %.
        margin = _margin(judged, dict(rule.levels)[severity], rule.compare)
    else:
        severity, margin = rule.severity, 1.0
    steps = env.get("steps")
    settled = 0.5 if steps is None else min(1.0, steps / _SAMPLE_STEPS)
    # At most 0.95: a threshold rule on a few dozen steps is strong evidence, never proof.
    confidence = rule.confidence * (0.5 + 0.3 * margin + 0.15 * settled)
    return _Hit(severity, round(confidence, 2), value, cost, env)


def _margin(value: float, threshold: float, compare: str) -> float:
    """0 at the first threshold, 1 at twice as far past it (ratio), clamped."""
    if compare == ">=":
        ratio = value / threshold if threshold > 0 else (2.0 if value > threshold else 1.0)
    else:
        ratio = threshold / value if value > 0 else 2.0
    return max(0.0, min(1.0, ratio - 1.0))


def _finding(rule: Rule, hits: list[_Hit], total: int, context: dict[int, dict]) -> dict:
    def badness(hit: _Hit):
        extreme = 0.0 if hit.value is None else (hit.value if rule.compare == ">=" else -hit.value)
        return (SEVERITIES.index(hit.severity), -1.0 if hit.cost is None else hit.cost, extreme, hit.confidence)

    worst = max(hits, key=badness)
    env = worst.env
    ranks = [h.env["rank"] for h in hits]
    evidence = {name: _round(env.get(name)) for name in rule.evidence}
    if worst.value is not None and rule.value is not None and rule.value.text not in evidence:
        evidence["value"] = _round(worst.value)
    ctx = {**CONTEXT_DEFAULTS, **context.get(env["rank"], {})}
    fill_env = {**env, **ctx}
    fill_env.update(suggestions(rule, fill_env))
    fill_env.update(
        value=worst.value,
        ranks=_ranks_text(ranks, total),
        cost_share=worst.cost,
        speedup=speedup(worst.cost),
    )
    return {
        "axis": rule.axis,
        "rule": rule.id,
        "severity": worst.severity,
        "confidence": max(h.confidence for h in hits),
        "ranks": ranks,
        "cost_share": _round(worst.cost),
        "speedup": speedup(worst.cost),
        "cost_basis": rule.cost_basis if worst.cost is not None else None,
        "explained_by": None,
        "evidence": evidence,
        "summary": _fill(rule.summary, fill_env),
        "fix": fit_fix(rule, fill_env, ctx.get("framework") or "plain"),
    }


def suggestions(rule: Rule, env: dict) -> dict:
    """The rule's ``suggest`` values over one rank's features (each may use the ones before it)."""
    out: dict = {}
    for name, expr in rule.suggest:
        value = eval_expr(expr, {**env, **out})
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        out[name] = value
    return out


def fit_fix(rule: Rule, env: dict, framework: str = "plain") -> dict:
    """The fix for this job: the first ``cases`` entry whose ``when`` holds, then the framework's variant;
    text and snippet filled from the features, context and suggest values in ``env``."""
    text, snippet, frameworks = rule.fix_text, rule.fix_snippet, rule.fix_frameworks
    for case in rule.fix_cases:
        if eval_expr(case.when, env):
            text = case.text if case.text is not None else text
            if case.snippet is not None or case.frameworks:
                snippet = case.snippet if case.snippet is not None else snippet
                frameworks = case.frameworks
            break
    fitted = "plain"
    variant = frameworks.get(framework)
    if variant is not None:
        text = variant.text if variant.text is not None else text
        snippet = variant.snippet if variant.snippet is not None else snippet
        fitted = framework
    return {"text": _fill(text, env), "snippet": _fill(snippet or "", env), "framework": fitted}


def rank_findings(findings: list[dict], rules: dict[str, Rule], explains: dict | None = None) -> list[dict]:
    """Order findings: severity, what fixing them gives back, priority, confidence; then each root cause
    ahead of what it explains. A cause is worth at least what it explains (fixing it fixes that too), so
    it takes the higher severity and cost of the two. ``explains`` (rule id -> ids) is what each rule
    explains on this job (``explained_here``); without it, a rule's unconditional ``explains``."""
    order = sorted(findings, key=lambda f: _order_key(f, rules))
    fired = {f["rule"]: f for f in order}
    explained_by: dict[str, str] = {}
    for f in order:
        if f["severity"] == "info":
            continue  # "probably fine" explains nothing: it must not displace a warning or a critical
        rule = rules[f["rule"]]
        mine = explains[rule.id] if explains and rule.id in explains else _unconditional(rule)
        for other in mine:
            if other in fired and other not in explained_by and other != f["rule"]:
                explained_by[other] = f["rule"]
    for _ in range(len(order)):  # chains (a explains b explains c): settle in at most len(order) passes
        for other, cause in explained_by.items():
            _inherit(fired[cause], fired[other], with_cost=not getattr(rules.get(other), "symptom", False))
    order.sort(key=lambda f: _order_key(f, rules))
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
            f["explained_by"] = cause
            f["summary"] += f" (likely a consequence of {cause}: fix that first)"
    return order


def _unconditional(rule: Rule) -> tuple:
    return tuple(other for other in rule.explains if other not in rule.explains_when)


def _order_key(f: dict, rules: dict[str, Rule]):
    cost = f.get("cost_share")
    rule = rules.get(f["rule"])
    return (
        -SEVERITIES.index(f["severity"]),
        -(cost if cost is not None else -1.0),
        -(rule.priority if rule else 0),
        -f["confidence"],
        f["rule"],
    )


def _inherit(cause: dict, effect: dict, with_cost: bool = True) -> None:
    """The cause takes the effect's severity and, unless the effect is a symptom (``with_cost=False``: a whole
    class of idle, of which the cause is one part), its cost when higher."""
    if SEVERITIES.index(effect["severity"]) > SEVERITIES.index(cause["severity"]):
        cause["severity"] = effect["severity"]
    if not with_cost:
        return
    cost = effect.get("cost_share")
    if cost is not None and (cause.get("cost_share") is None or cost > cause["cost_share"]):
        cause["cost_share"], cause["speedup"] = cost, speedup(cost)
        cause["cost_basis"] = effect.get("cost_basis")


def run_checklist(
    items: list[ChecklistItem], features: dict[int, dict] | Frame, *, per_rank: bool = False
) -> list[dict]:
    """Pass / warn / fail per checklist item, judged on the worst rank; n/a when no rank can say."""
    frame = features if isinstance(features, Frame) else Frame(features)
    out = []
    for item in items:
        worst = NotVectorised if per_rank else _worst_by_columns(item, frame)
        if worst is NotVectorised:
            worst = _worst_by_rank(item, frame)
        unit = "ratio" if item.value.text.strip().endswith(_RATIO_SUFFIXES) else "number"
        if worst is None:
            out.append({"item": item.item, "group": item.group, "status": "n/a", "value": None, "unit": unit})
            continue
        status = "fail" if _beyond(worst, item.fail, item.compare) else "pass"
        if status == "pass" and _beyond(worst, item.warn, item.compare):
            status = "warn"
        out.append({"item": item.item, "group": item.group, "status": status, "value": _round(worst), "unit": unit})
    return out


def _worst_by_rank(item: ChecklistItem, frame: Frame):
    """The item's worst known value over the ranks, judged one by one; None when no rank can say."""
    values = []
    for env in frame.rows:
        if item.when is not None and not eval_expr(item.when, env):
            continue
        value = eval_expr(item.value, env)
        if value is not None and not isinstance(value, bool) and math.isfinite(value):
            values.append(value)
    if not values:
        return None
    return max(values) if item.compare == ">=" else min(values)


def _worst_by_columns(item: ChecklistItem, frame: Frame):
    """``_worst_by_rank`` over the columns: the first rank holding the extreme (as ``max``/``min`` keep the
    first), its value read from its own features; ``NotVectorised`` (the class) where the columns cannot say."""
    try:
        mask = _vector.when_mask(item.when, frame)
        value = _vector.evaluate(item.value, frame)
    except NotVectorised:
        value = None
    if value is None or value.bools:
        frame.fallbacks.append(f"checklist: {item.item}")
        return NotVectorised
    where = np.flatnonzero(mask & np.broadcast_to(_vector.known(value), (frame.n,)))
    if not where.size:
        return None
    values = np.broadcast_to(value.val, (frame.n,))[where]
    at = where[int(np.argmax(values) if item.compare == ">=" else np.argmin(values))]
    return eval_expr(item.value, frame.rows[at])


# Feature names in 0-1 (schema convention: the unit is in the name), shown as percentages.
_RATIO_SUFFIXES = ("_ratio", "_share", "_spread", "_overlap")


def _beyond(value: float, threshold: float, compare: str) -> bool:
    return value >= threshold if compare == ">=" else value <= threshold


def _round(value):
    """Evidence as the report shows it; a non-finite value (a ratio over an empty span) reads as unknown
    (None) rather than stopping the diagnosis (``round(inf)`` raises) or writing JSON no parser takes."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
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
    """str.format over plain names only (the loader rejects dotted or indexed fields); None or a name the
    run cannot fill reads n/a.

    The loader refuses format specs wider than ``MAX_FORMAT_NUMBER``; a template that reaches here some
    other way (a rule built in code) is held to the same bound, its value printed plainly instead."""

    def get_value(self, key, args, kwargs):
        return kwargs.get(key) if isinstance(key, str) else super().get_value(key, args, kwargs)

    def format_field(self, value, format_spec):
        if value is None:
            return "n/a"
        if format_spec_problem(format_spec):
            return str(value)
        try:
            return super().format_field(value, format_spec)
        except (ValueError, TypeError, OverflowError):
            return str(value)


def _fill(template: str, env: dict) -> str:
    """The template filled from ``env``; a template that does not parse is shown as written, never raised."""
    try:
        return _Formatter().vformat(template, (), env)
    except (ValueError, IndexError, KeyError, AttributeError):
        return template
