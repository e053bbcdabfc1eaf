"""The pure evaluator: per-rank features in, ranked findings and a checklist out. No I/O.

Each rule is evaluated on every rank's features; the ranks where it fires make one finding, whose
severity is the worst rank's and whose evidence numbers come from that rank. A rule with a ``cost``
says what share of the step time its fix would give back (``cost_share``, and ``speedup`` =
1 / (1 - cost_share)). Findings are then put in the order a person should act on them: by severity,
then by what fixing them gives back, then confidence; and a root cause before what it explains (a
rank that waits for data, or computes slower, makes the others wait at collectives).

The ranks a rule can fire on are found over all ranks at once (``_vector``: its ``when``, and for a rule
with levels its value past the lowest level, as numpy arrays over the features' columns), and so are the
figures of those ranks that choose the finding's worst rank: value, noise, severity, margin, cost and
confidence, with the same float operations as ``_fire`` so they are the same bits. What stays per rank is
what a finding reports: the worst rank is judged again by ``_fire``, whose value keeps its Python type (an
int stays an int in the evidence) and whose key must be the one the columns chose (else the rule is judged
rank by rank), and each reported figure is rounded by Python's ``round``, never numpy's (they differ on
some halves). At 10,000 ranks a rule that fires everywhere costs a few array passes, not 10,000 walks of
its expressions. ``per_rank=True`` judges every rank, as this evaluator did before; a rule whose
expressions the columns cannot evaluate exactly -- a string or an integer beyond 2**53 in a column, a bool
where ``_fire`` wants a number, a NaN value (Python's tuples compare it by identity) -- is judged that way
too (``Frame.fallbacks`` names it).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np

from ranksight.collectors import CONTEXT_DEFAULTS

from . import _vector
from ._expr import Expr
from ._expr import evaluate as eval_expr
from ._load import LOUD_FLOORS, SEVERITIES, ChecklistItem, Rule, format_spec_problem
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


@dataclass(frozen=True)
class _Fired:
    """What a rule's finding reads from its hits: their ranks (ascending), the highest (rounded) confidence,
    the worst hit (``max`` by ``_badness``) and the rules this one explains on them (``explained_here``)."""

    ranks: list[int]
    confidence: float
    worst: _Hit
    explains: tuple


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
        fired = _fired_by_rank(rule, frame, frame.ranks) if per_rank else _fired(rule, frame)
        if fired is not None:
            findings.append(_finding(rule, fired, frame.n, context))
            explains[rule.id] = fired.explains
    return rank_findings(findings, {r.id: r for r in rules}, explains)


def _fired(rule: Rule, frame: Frame) -> _Fired | None:
    """The rule's hits judged over the columns; rank by rank (named in ``frame.fallbacks``) where the
    columns cannot say exactly, on the candidate ranks when those were found."""
    try:
        at = _candidate_positions(rule, frame)
    except NotVectorised:
        frame.fallbacks.append(rule.id)
        return _fired_by_rank(rule, frame, frame.ranks)
    if not at.size:
        return None
    try:
        return _fired_by_columns(rule, frame, at)
    except NotVectorised:
        frame.fallbacks.append(rule.id)
        return _fired_by_rank(rule, frame, [frame.ranks[i] for i in at.tolist()])


def _fired_by_rank(rule: Rule, frame: Frame, ranks: list[int]) -> _Fired | None:
    """The specification: ``_fire`` on each of ``ranks``, the worst hit by Python's ``max`` (the first of equals)."""
    hits = [hit for rank in ranks if (hit := _fire(rule, frame.features[rank])) is not None]
    if not hits:
        return None
    worst = max(hits, key=lambda hit: _badness(rule, hit))
    confidence = max(h.confidence for h in hits)
    return _Fired([h.env["rank"] for h in hits], confidence, worst, explained_here(rule, [h.env for h in hits]))


def candidates(rule: Rule, frame: Frame) -> list[int]:
    """The ranks (ascending) on which ``rule`` may fire: its ``when`` holds and, with levels, its value is
    known and reaches the lowest level after the noise; every rank where the columns cannot say exactly."""
    try:
        at = _candidate_positions(rule, frame)
    except NotVectorised:
        frame.fallbacks.append(rule.id)
        return frame.ranks
    return [frame.ranks[i] for i in at.tolist()]


def _candidate_positions(rule: Rule, frame: Frame) -> np.ndarray:
    """``candidates`` as positions in ``frame.ranks``; raises NotVectorised where the columns cannot say."""
    mask = _vector.when_mask(rule.when, frame)
    if rule.levels and mask.any():
        mask = mask & _levels_reached(rule, frame)
    return np.flatnonzero(mask)


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


def _fired_by_columns(rule: Rule, frame: Frame, at: np.ndarray) -> _Fired:
    """``_fired_by_rank`` over the candidate positions ``at``, every hit's figures as arrays. The worst hit is
    judged again by ``_fire`` (its value keeps its Python type); raises NotVectorised where the columns
    cannot say exactly, or where that hit's key is not the one the columns chose."""
    figures = _Figures(rule, frame, at)
    if not figures.at.size:
        raise NotVectorised(f"{rule.id}: the columns reach no level on the ranks they found")
    worst = _worst(figures)
    hit = _fire(rule, frame.rows[figures.at[worst]])
    if hit is None or _badness(rule, hit) != figures.key(worst):
        raise NotVectorised(f"{rule.id}: the columns chose a hit _fire does not give")
    ranks = [frame.rows[i]["rank"] for i in figures.at.tolist()]
    confidence = round(float(figures.confidence.max()), 2)  # round is monotone: the max of the rounded
    return _Fired(ranks, confidence, hit, _explained_by_columns(rule, frame, figures.at))


class _Figures:
    """What ``_fire`` computes on each hit, as arrays over the hits' positions ``at`` (the candidates that
    reach a level): severity (index in SEVERITIES), cost (``_COST_UNKNOWN`` where None, as ``_badness`` keys
    it), extreme value (``_badness``'s) and unrounded confidence, each with ``_fire``'s float operations."""

    def __init__(self, rule: Rule, frame: Frame, at: np.ndarray):
        value, value_ok, ints = _numbers(rule.value, frame, at)
        if rule.levels:
            judged, known = _judged(rule, frame, at, value, value_ok, ints)
            severity, threshold = _levels_of(rule, judged)
            keep = known & (severity >= 0)
            at, value, severity = at[keep], value[keep], severity[keep]
            margin = _margins(judged[keep], threshold[keep], rule.compare)
            extreme = value if rule.compare == ">=" else -value
        else:
            if np.isnan(value[value_ok]).any():
                raise NotVectorised("a NaN value: Python's tuples compare it by identity, not as a number")
            severity = np.full(at.size, SEVERITIES.index(rule.severity))
            margin = 1.0
            extreme = np.where(value_ok, value if rule.compare == ">=" else -value, 0.0)
        cost, cost_known, _ = _numbers(rule.cost, frame, at)
        self.at, self.severity, self.extreme = at, severity, extreme
        self.cost = np.where(cost_known, _clamp(cost, 0.0, _MAX_COST), _COST_UNKNOWN)
        # _fire's expression, in its order: the same IEEE operations give the same bits.
        self.confidence = rule.confidence * (0.5 + 0.3 * margin + 0.15 * _settled(frame, at))

    def key(self, i: int) -> tuple:
        """``_badness`` of hit ``i``, its confidence rounded by Python (numpy's rounding may differ)."""
        return (int(self.severity[i]), float(self.cost[i]), float(self.extreme[i]), round(float(self.confidence[i]), 2))


_COST_UNKNOWN = -1.0  # how _badness keys a hit without a cost: below every clamped cost


def _worst(figures: _Figures) -> int:
    """The hit ``max(hits, key=_badness)`` picks: the first (in rank order) of the greatest keys. The first
    three keys are compared over arrays; Python rounds the confidences of the hits tied on them, in order,
    until one reaches the greatest (``round`` is monotone, so that is the max's rounding)."""
    tied = np.arange(figures.at.size)
    for column in (figures.severity, figures.cost, figures.extreme):
        values = column[tied]
        tied = tied[values == values.max()]
    confidences = figures.confidence[tied].tolist()
    top = round(max(confidences), 2)
    return next(int(i) for i, c in zip(tied.tolist(), confidences) if round(c, 2) == top)


def _numbers(expr: Expr | None, frame: Frame, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """The expression's values at positions ``at`` (NaN where it has none), where its evaluation ended OK,
    and whether they may be Python ints; raises NotVectorised for a bool (a number to numpy, not to
    ``_known``)."""
    if expr is None:
        return np.full(at.size, np.nan), np.zeros(at.size, dtype=bool), False
    v = _vector.evaluate(expr, frame)
    if v.bools:
        raise NotVectorised(f"{expr.text}: may be a bool")
    ok = np.ones(1, dtype=bool) if v.st is None else v.st == _vector.OK
    return _take(v.val, at, frame.n), _take(ok, at, frame.n), v.ints


def _take(column: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    return np.broadcast_to(column, (n,))[at]


def _judged(rule: Rule, frame: Frame, at: np.ndarray, value: np.ndarray, ok: np.ndarray, ints: bool):
    """``_fire``'s value after the noise at ``at``, and where the value is known (a finite number)."""
    noise, noise_ok, noise_ints = _numbers(rule.noise, frame, at)
    with np.errstate(all="ignore"):
        noise = np.where(noise_ok & np.isfinite(noise) & (noise > 0), noise, 0.0)
        judged = value - noise if rule.compare == ">=" else value + noise
        beyond = np.abs(judged) > _vector._EXACT_INT
    if ints and noise_ints and beyond.any():
        raise NotVectorised("int minus int beyond 2**53: exact in Python, rounded in float64")
    return judged, ok & np.isfinite(value)


def _levels_of(rule: Rule, judged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per hit, the last level ``_fire`` finds reached (its index in SEVERITIES; -1 for none) and that
    severity's threshold as ``_fire`` reads it (``dict(rule.levels)``)."""
    thresholds = dict(rule.levels)
    severity, threshold = np.full(judged.size, -1), np.zeros(judged.size)
    for name, t in rule.levels:
        if isinstance(thresholds[name], int) and abs(thresholds[name]) > _vector._EXACT_INT:
            raise NotVectorised("a threshold beyond 2**53")
        reached = _beyond(judged, t, rule.compare)
        severity = np.where(reached, SEVERITIES.index(name), severity)
        threshold = np.where(reached, float(thresholds[name]), threshold)
    return severity, threshold


def _margins(judged: np.ndarray, threshold: np.ndarray, compare: str) -> np.ndarray:
    """``_margin`` over arrays, each branch's operations as there."""
    with np.errstate(all="ignore"):
        if compare == ">=":
            positive = threshold > 0
            at_most = np.where(judged > threshold, 2.0, 1.0)
            ratio = np.where(positive, judged / np.where(positive, threshold, 1.0), at_most)
        else:
            positive = judged > 0
            ratio = np.where(positive, threshold / np.where(positive, judged, 1.0), 2.0)
    return _clamp(ratio - 1.0, 0.0, 1.0)


def _clamp(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """``max(low, min(high, x))`` as Python computes it: each keeps its first argument unless the other is
    strictly past it (so a NaN gives ``high``, and -0.0 gives ``low``)."""
    x = np.where(x < high, x, high)
    return np.where(x > low, x, low)


def _settled(frame: Frame, at: np.ndarray) -> np.ndarray:
    """``_fire``'s settled figure at ``at``: 0.5 where steps is None, else ``min(1, steps / _SAMPLE_STEPS)``."""
    steps = frame.column("steps")
    with np.errstate(all="ignore"):
        settled = _take(steps.val, at, frame.n) / _SAMPLE_STEPS
    settled = np.where(settled < 1.0, settled, 1.0)  # min(1.0, x): a NaN gives 1.0
    if steps.st is None:
        return settled
    return np.where(_take(steps.st, at, frame.n) == _vector.UNKNOWN, 0.5, settled)


def _explained_by_columns(rule: Rule, frame: Frame, at: np.ndarray) -> tuple:
    """``explained_here`` on the hits at ``at``: each condition over the columns, rank by rank where they
    cannot say exactly (named in ``frame.fallbacks``)."""
    out = []
    for other in rule.explains:
        condition = rule.explains_when.get(other)
        if condition is not None:
            try:
                holds = bool(_vector.when_mask(condition, frame)[at].any())
            except NotVectorised:
                frame.fallbacks.append(f"{rule.id}: explains {other}")
                holds = any(eval_expr(condition, frame.rows[i]) for i in at.tolist())
            if not holds:
                continue
        out.append(other)
    return tuple(out)


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


def _badness(rule: Rule, hit: _Hit) -> tuple:
    """How bad a hit is, for the finding's worst rank: severity, cost, extreme value, confidence."""
    extreme = 0.0 if hit.value is None else (hit.value if rule.compare == ">=" else -hit.value)
    return (SEVERITIES.index(hit.severity), _COST_UNKNOWN if hit.cost is None else hit.cost, extreme, hit.confidence)


def _finding(rule: Rule, fired: _Fired, total: int, context: dict[int, dict]) -> dict:
    worst, ranks = fired.worst, fired.ranks
    env = worst.env
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
        "confidence": fired.confidence,
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
    for f in findings:
        _bound_by_cost(f, rules.get(f["rule"]))
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
            mine = explains[rule.id] if explains and rule.id in explains else _unconditional(rule)
            if f["severity"] == "info":
                mine = tuple(other for other in mine if other in rule.explains_when)
            for other in mine:
                if other in fired and other not in explained_by and other != f["rule"]:
                    explained_by[other] = f["rule"]
                    grew = True
        for _ in range(len(order)):  # chains (a explains b explains c)
            for other, cause in explained_by.items():
                _inherit(fired[cause], fired[other], with_cost=not getattr(rules.get(other), "symptom", False))
        if not grew:
            break
    for f in order:  # a cause that took a symptom's severity keeps its own cost: bound it again
        _bound_by_cost(f, rules.get(f["rule"]))
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


def _bound_by_cost(f: dict, rule: Rule | None) -> None:
    """The engine's invariant over every rule: a finding is no louder than its cost allows (``LOUD_FLOORS``);
    one without a cost may be loud only as a stated ``risk``, whose reason joins its summary."""
    cost = f.get("cost_share")
    if cost is None:
        if rule is None or rule.risk is None:
            f["severity"] = "info"
        elif f["severity"] != "info" and rule.risk not in f["summary"]:
            f["summary"] += f" ({rule.risk})"
        return
    for severity, floor in reversed(LOUD_FLOORS):
        if SEVERITIES.index(f["severity"]) >= SEVERITIES.index(severity) and cost < floor:
            f["severity"] = SEVERITIES[SEVERITIES.index(severity) - 1]


def _unconditional(rule: Rule) -> tuple:
    return tuple(other for other in rule.explains if other not in rule.explains_when)


def _order_key(f: dict, rules: dict[str, Rule]):
    cost = f.get("cost_share")
    rule = rules.get(f["rule"])
    return (
        -SEVERITIES.index(f["severity"]),
        f.get("cost_basis") == "unmeasured",  # time no phase explains: after the measured causes
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
