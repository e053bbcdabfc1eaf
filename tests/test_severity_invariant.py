"""The engine's severity invariant, over every built-in rule: no finding is a warning below 3 % of the step or
critical below 20 %, and a finding with no cost is loud only as a stated risk. Checked on random jobs drawn
around real ones, with each rule's causes and effects in the same frame, so inheritance is exercised too."""

from __future__ import annotations

import random

import pytest

from ranksight.collectors import FEATURES
from ranksight.rules import evaluate, load_rules
from ranksight.rules._load import LOUD_FLOORS

from .test_rules_evaluate import HEALTHY

_COUNTS = {"graph_breaks", "recompiles", "recompiles_after_warmup", "memory_alloc_retries_total", "buckets_per_step"}
_FLAGS = {"model_on_gpu", "ddp", "find_unused_parameters", "compiled", "data_measured", "static_graph"}


def _draw(rng: random.Random, names: list[str]) -> dict:
    """A job: the healthy one with a random half of its figures (and some absent ones) moved anywhere."""
    f = dict.fromkeys(FEATURES)
    f.update(HEALTHY)
    for name in rng.sample(names, k=len(names) // 2):
        roll = rng.random()
        if roll < 0.1:
            f[name] = None
        elif name in _FLAGS:
            f[name] = rng.choice((0, 1))
        elif name in _COUNTS:
            f[name] = rng.choice((0, 1, 2, 5, 30))
        elif name.endswith(("_share", "_ratio", "_noise")):
            f[name] = rng.choice((0.0, 0.01, 0.025, 0.05, 0.15, 0.19, 0.3, 0.6, 0.95)) * rng.uniform(0.9, 1.1)
        else:
            current = f.get(name)
            f[name] = (current if isinstance(current, (int, float)) and current else 1.0) * rng.uniform(0.1, 4.0)
    f.update(rank=0, steps=rng.choice((3, 40, 400)), ranks_reporting=1, world_size=1)
    return f


def test_no_finding_is_louder_than_its_cost_over_every_builtin_rule():
    rules = load_rules().rules
    by_id = {r.id: r for r in rules}
    names = sorted(n for n in FEATURES if n not in ("rank",))
    rng = random.Random(20261206)
    floors = dict(LOUD_FLOORS)
    loud_seen, bounded_rules = 0, set()
    for _ in range(1500):
        for f in evaluate(rules, {0: _draw(rng, names)}):
            cost, severity = f["cost_share"], f["severity"]
            if severity == "info":
                continue
            loud_seen += 1
            if cost is None:
                assert by_id[f["rule"]].risk, f"{f['rule']}: {severity} with no cost and no stated risk"
                assert by_id[f["rule"]].risk in f["summary"]
                continue
            assert cost >= floors["warning"], f"{f['rule']}: {severity} at a cost of {cost}"
            if severity == "critical":
                assert cost >= floors["critical"], f"{f['rule']}: critical at a cost of {cost}"
            bounded_rules.add(f["rule"])
    # Not vacuous: loud findings of many rules were checked.
    assert loud_seen > 500 and len(bounded_rules) >= 10, (loud_seen, sorted(bounded_rules))


def test_a_rule_with_a_cost_cannot_also_claim_a_risk():
    from ranksight.rules._load import parse_rules

    text = (
        "rules:\n  - id: r\n    axis: sync\n    title: t\n    cost: step_median_s\n    risk: oom\n"
        "    summary: s\n    fix: {text: f}\n"
    )

    with pytest.raises(Exception, match="risk"):
        parse_rules(text)
