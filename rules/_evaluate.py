"""The pure evaluator: per-rank features in, ranked findings and a checklist out. No I/O.

A rule is judged on every rank at once, as columns of a ``Frame`` (``_expr``); the ranks where it fires make
one finding, reported from its worst rank (figures rounded by Python's ``round``: numpy's differs on some
halves) and worded from that rank's features alone (a one-row frame). A rule with a ``cost`` says what share
of the step time its fix gives back (``cost_share``; ``speedup`` = 1 / (1 - cost_share)). Findings are put in
the order a person should act on them, a root cause before what it explains (a rank that waits for data, or
computes slower, makes the others wait at collectives).
"""

from __future__ import annotations

import math
import string

import numpy as np

from ranksight.collectors import CONTEXT_DEFAULTS

from ._expr import OK, UNKNOWN, Frame
from ._expr import evaluate as eval_expr
from ._load import LOUD_FLOORS, SEVERITIES, ChecklistItem, Rule, format_spec_problem

_SAMPLE_STEPS = 20  # steps after warm-up at which a per-rank median is taken as settled
_MAX_COST = 0.99  # a fix cannot give back the whole step; keeps the speedup finite
_COST_UNKNOWN = -1.0  # how the worst rank's choice keys a hit without a cost: below every clamped cost
DISAGREE_CONFIDENCE = 0.6
"""A finding whose figure another measure contradicts keeps this share of its confidence."""


def evaluate(
    rules: list[Rule], features: dict[int, dict] | Frame, context: dict[int, dict] | None = None
) -> list[dict]:
    """Return the findings of ``rules`` over ``features`` (rank -> feature dict, or a ``Frame`` of them
    the checklist then reads too), root cause first.

    ``context`` (rank -> {name: string}, see ``ranksight.collectors.CONTEXT``) fits the fix text and
    snippets to the job (its framework, transport); without it the plain-PyTorch fix is given.
    """
    frame = features if isinstance(features, Frame) else Frame(features)
    fired = [(rule, *_fire(rule, frame)) for rule in rules]
    fired = [hits for hits in fired if hits[1].size]
    findings = [_finding(*hits, frame, context or {}) for hits in fired]
    explains = {rule.id: _explained_here(rule, frame, at) for rule, at, *_ in fired}
    return rank_findings(findings, {r.id: r for r in rules}, explains)


def _fire(rule: Rule, frame: Frame) -> tuple:
    """The rows where the rule fires, and each row's severity (its index in SEVERITIES) and margin."""
    fires = frame.holds(rule.when)
    if not rule.levels or not fires.any():
        return np.flatnonzero(fires), np.full(frame.n, SEVERITIES.index(rule.severity or "info")), 1.0
    value = frame.value(rule.value)
    noise = 0.0
    if rule.noise is not None:
        spread = frame.value(rule.noise)
        noise = np.where(spread.known() & (spread.val > 0), spread.val, 0.0)
    # The effect must clear each threshold by its own uncertainty (per-step spread), so noise cannot tip it.
    judged = value.val - noise if rule.compare == ">=" else value.val + noise
    severity, threshold = np.full(frame.n, -1), np.zeros(frame.n)
    for name, t in rule.levels:  # the most severe level reached
        reached = _beyond(judged, t, rule.compare)
        severity, threshold = np.where(reached, SEVERITIES.index(name), severity), np.where(reached, t, threshold)
    # How far past the band it reached (after the noise): a cost just past 10 % warns less than one at 20 %.
    margin = _margin(judged, threshold, rule.compare)
    return np.flatnonzero(fires & value.known() & (severity >= 0)), severity, margin


def _cost(rule: Rule, frame: Frame) -> np.ndarray:
    """The rule's cost per rank, clamped to [0, 0.99]; ``_COST_UNKNOWN`` where it has none or it is unknown."""
    if rule.cost is None:
        return np.full(1, _COST_UNKNOWN)
    cost = frame.value(rule.cost)
    return np.where(cost.known(), _clamp(cost.val, 0.0, _MAX_COST), _COST_UNKNOWN)


def _margin(judged: np.ndarray, threshold: np.ndarray, compare: str) -> np.ndarray:
    """0 at the first threshold, 1 at twice as far past it (ratio), clamped."""
    if compare == ">=":
        past = np.where(judged > threshold, 2.0, 1.0)
        ratio = np.where(threshold > 0, judged / np.where(threshold > 0, threshold, 1.0), past)
    else:
        ratio = np.where(judged > 0, threshold / np.where(judged > 0, judged, 1.0), 2.0)
    return _clamp(ratio - 1.0, 0.0, 1.0)


def _clamp(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """``max(low, min(high, x))`` as Python computes it: each keeps its first argument unless the other is
    strictly past it (so a NaN gives ``high``, and -0.0 gives ``low``)."""
    x = np.where(x < high, x, high)
    return np.where(x > low, x, low)


def _explained_here(rule: Rule, frame: Frame, at: np.ndarray) -> tuple:
    """The rules this one explains on this job: each unconditional one, and each conditional one whose
    condition holds on a rank where this rule fired."""
    when = rule.explains_when
    return tuple(other for other in rule.explains if other not in when or frame.holds(when[other])[at].any())


def speedup(cost: float | None) -> float | None:
    """How many times faster a step gets when ``cost`` of it goes away."""
    return None if cost is None else round(1.0 / (1.0 - cost), 2)


def _finding(rule: Rule, at: np.ndarray, severity, margin, frame: Frame, context: dict[int, dict]) -> dict:
    """The finding at the hits' worst row: the first of the greatest (severity, cost, extreme value, confidence
    rounded as reported); an unknown cost ranks below every known one, a NaN value as the least extreme."""
    value = frame.value(rule.value) if rule.value is not None else None
    steps = frame.column("steps")
    settled = steps.val / _SAMPLE_STEPS
    settled = np.where(steps.st == UNKNOWN, 0.5, np.where(settled < 1.0, settled, 1.0))  # min(1.0, x) as Python
    # At most 0.95: a threshold rule on a few dozen steps is strong evidence, never proof.
    confidence = rule.confidence * (0.5 + 0.3 * margin + 0.15 * settled)
    extreme = 0.0  # fmax: a NaN value (no levels to judge it) counts as the least extreme
    if value is not None:
        extreme = np.fmax(np.where(value.st == OK, value.val if rule.compare == ">=" else -value.val, 0.0), -np.inf)
    # Where another measure of the figure says otherwise, a level down and less sure, rank by rank.
    checks = _agree_checks(rule, frame)
    disagree = np.logical_or.reduce([false for _, false in checks], initial=False)
    severity = np.where(disagree, np.maximum(severity - 1, 0), severity)
    confidence = np.where(disagree, confidence * DISAGREE_CONFIDENCE, confidence)
    keys = (severity, _cost(rule, frame), extreme, confidence)
    severity, cost, extreme, confidence = (np.broadcast_to(key, (frame.n,))[at] for key in keys)
    tied = np.arange(at.size)
    for key in (severity, cost, extreme):
        tied = tied[key[tied] == key[tied].max()]
    rounded = [round(c, 2) for c in confidence[tied].tolist()]
    worst = tied[rounded.index(max(rounded))]
    env = frame.rows[at[worst]]
    value = value.at(at[worst]) if value is not None else None
    cost = None if cost[worst] == _COST_UNKNOWN else float(cost[worst])
    ranks = [frame.rows[i]["rank"] for i in at.tolist()]
    evidence = {name: _round(env.get(name)) for name in rule.evidence}
    if value is not None and rule.value.text not in evidence:
        evidence["value"] = _round(value)
    ctx = {**CONTEXT_DEFAULTS, **context.get(env["rank"], {})}
    fill_env = {**env, **ctx}
    fill_env.update(suggestions(rule, fill_env))
    fill_env.update(value=value, ranks=_ranks_text(ranks, frame.n), cost_share=cost, speedup=speedup(cost))
    summary = _fill(rule.summary, fill_env)
    said = [_fill(says, fill_env) for says, false in checks if false[at[worst]]]
    if said:
        summary += f" (other measures disagree: {'; '.join(said)})"
    return {
        "axis": rule.axis,
        "rule": rule.id,
        "severity": SEVERITIES[int(severity[worst])],
        "confidence": round(float(confidence.max()), 2),  # round is monotone: the max of the rounded
        "ranks": ranks,
        "cost_share": _round(cost),
        "speedup": speedup(cost),
        "cost_basis": rule.cost_basis if cost is not None else None,
        "explained_by": None,
        "evidence": evidence,
        "summary": summary,
        "fix": fit_fix(rule, fill_env, ctx.get("framework") or "plain"),
    }


def _agree_checks(rule: Rule, frame: Frame) -> list[tuple[str, np.ndarray]]:
    """Each of the rule's ``agree`` checks: its text, and the rows where it is known and false."""
    values = [(says, frame.value(check)) for check, says in rule.agree]
    return [(says, np.broadcast_to((v.st == OK) & (v.val == 0), (frame.n,))) for says, v in values]


def suggestions(rule: Rule, env: dict) -> dict:
    """The rule's ``suggest`` values over one rank's features (each may use the ones before it)."""
    out: dict = {}
    for name, expr in rule.suggest:
        value = eval_expr(expr, {**env, **out})
        out[name] = int(value) if isinstance(value, float) and value.is_integer() else value
    return out


def fit_fix(rule: Rule, env: dict, framework: str = "plain") -> dict:
    """The fix for this job: the first ``cases`` entry whose ``when`` holds, then the framework's variant;
    text and snippet filled from the features, context and suggest values in ``env``."""
    text, snippet, frameworks = rule.fix_text, rule.fix_snippet, rule.fix_frameworks
    case = next((case for case in rule.fix_cases if eval_expr(case.when, env)), None)
    if case is not None:
        text = case.text if case.text is not None else text
        if case.snippet is not None or case.frameworks:
            snippet, frameworks = case.snippet if case.snippet is not None else snippet, case.frameworks
    variant = frameworks.get(framework)
    if variant is not None:
        text = variant.text if variant.text is not None else text
        snippet = variant.snippet if variant.snippet is not None else snippet
    fitted = framework if variant is not None else "plain"
    return {"text": _fill(text, env), "snippet": _fill(snippet or "", env), "framework": fitted}


def rank_findings(findings: list[dict], rules: dict[str, Rule], explains: dict | None = None) -> list[dict]:
    """Order findings: severity, what fixing them gives back, priority, confidence; then each root cause
    ahead of what it explains. A cause is worth at least what it explains (fixing it fixes that too), so
    it takes the higher severity and cost of the two. ``explains`` (rule id -> ids) is what each rule
    explains on this job (``_explained_here``); without it, a rule's unconditional ``explains``."""
    for f in findings:
        _bound_by_cost(f, rules[f["rule"]])
    order = sorted(findings, key=lambda f: _order_key(f, rules))
    fired = {f["rule"]: f for f in order}
    explained_by: dict[str, str] = {}
    # A cause found "probably fine" (info) explains only what its rule's conditions tie to it on this job
    # (ops on the CPU whose round trips are the pageable copies): an unconditional claim from a cause that
    # small must not displace a warning or a critical. What it takes from those may make it loud enough to
    # claim the rest, so explanations and inheritance settle together, in at most len(order) passes.
    for _ in range(len(order)):
        grew = False
        for f in order:
            rule = rules[f["rule"]]
            when = rule.explains_when
            mine = (explains or {}).get(rule.id, [o for o in rule.explains if o not in when])
            if f["severity"] == "info":
                mine = [other for other in mine if other in when]
            for other in mine:
                if other in fired and other not in explained_by and other != f["rule"]:
                    explained_by[other] = f["rule"]
                    grew = True
        for _ in range(len(order)):  # chains (a explains b explains c)
            for other, cause in explained_by.items():
                _inherit(fired[cause], fired[other], with_cost=not rules[other].symptom)
        if not grew:
            break
    for f in order:  # a cause that took a symptom's severity keeps its own cost: bound it again
        _bound_by_cost(f, rules[f["rule"]])
    order.sort(key=lambda f: _order_key(f, rules))
    # Move each explaining finding just before the first finding it explains; bounded against cycles.
    for _ in range(len(order) * len(order) + 1):
        at = {g["rule"]: k for k, g in reversed(list(enumerate(order)))}  # the first of each
        move = next(((i, at[c]) for i, f in enumerate(order) if at.get(c := explained_by.get(f["rule"]), -1) > i), None)
        if move is None:
            break
        order.insert(move[0], order.pop(move[1]))
    for f in order:
        cause = explained_by.get(f["rule"])
        if cause:
            f["explained_by"] = cause
            f["summary"] += f" (likely a consequence of {cause}: fix that first)"
    return order


def _bound_by_cost(f: dict, rule: Rule) -> None:
    """The engine's invariant over every rule: a finding is no louder than its cost allows (``LOUD_FLOORS``);
    one without a cost may be loud only as a stated ``risk``, whose reason joins its summary."""
    cost = f.get("cost_share")
    if cost is None:
        if rule.risk is None:
            f["severity"] = "info"
        elif f["severity"] != "info" and rule.risk not in f["summary"]:
            f["summary"] += f" ({rule.risk})"
        return
    for severity, floor in reversed(LOUD_FLOORS):
        if SEVERITIES.index(f["severity"]) >= SEVERITIES.index(severity) and cost < floor:
            f["severity"] = SEVERITIES[SEVERITIES.index(severity) - 1]


def _order_key(f: dict, rules: dict[str, Rule]):
    cost = f.get("cost_share")
    return (
        -SEVERITIES.index(f["severity"]),
        f.get("cost_basis") == "unmeasured",  # time no phase explains: after the measured causes
        -(cost if cost is not None else -1.0),
        -rules[f["rule"]].priority,
        -f["confidence"],
        f["rule"],
    )


def _inherit(cause: dict, effect: dict, with_cost: bool = True) -> None:
    """The cause takes the effect's severity and, unless the effect is a symptom (``with_cost=False``: a whole
    class of idle, of which the cause is one part), its cost when higher."""
    if SEVERITIES.index(effect["severity"]) > SEVERITIES.index(cause["severity"]):
        cause["severity"] = effect["severity"]
    cost = effect.get("cost_share") if with_cost else None
    if cost is not None and (cause.get("cost_share") is None or cost > cause["cost_share"]):
        cause.update(cost_share=cost, speedup=speedup(cost), cost_basis=effect.get("cost_basis"))


def run_checklist(items: list[ChecklistItem], features: dict[int, dict] | Frame) -> list[dict]:
    """Pass / warn / fail per checklist item, judged on the worst rank; n/a when no rank can say."""
    frame = features if isinstance(features, Frame) else Frame(features)
    out = []
    for item in items:
        unit = "ratio" if item.value.text.strip().endswith(_RATIO_SUFFIXES) else "number"
        value = frame.value(item.value)
        where = np.flatnonzero(frame.holds(item.when) & value.known())
        status, worst = "n/a", None
        if where.size:
            values = np.broadcast_to(value.val, (frame.n,))[where]  # the first of the extremes, as max/min keep
            worst = value.at(int(where[np.argmax(values) if item.compare == ">=" else np.argmin(values)]))
            status = "fail" if _beyond(worst, item.fail, item.compare) else "pass"
            status = "warn" if status == "pass" and _beyond(worst, item.warn, item.compare) else status
        out.append({"item": item.item, "group": item.group, "status": status, "value": _round(worst), "unit": unit})
    return out


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
    run cannot fill reads n/a. A format spec the loader would refuse (a rule built in code) prints plainly."""

    def get_value(self, key, args, kwargs):
        return kwargs.get(key) if isinstance(key, str) else super().get_value(key, args, kwargs)

    def format_field(self, value, format_spec):
        if value is None or format_spec_problem(format_spec):
            return "n/a" if value is None else str(value)
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
