"""The rules over feature columns (``rules/_vector.py``) against the per-rank evaluator, finding by finding.

The per-rank evaluator is the specification: every built-in rule and checklist item is evaluated both ways
on synthetic frames built from the rules' own thresholds (each feature a rule reads present, absent, NaN,
infinite, and exactly at, just below and just above every constant the rule compares it with; some features
the same on every rank, as job-level figures are), on random expressions of the whole language, and on
10,000-rank frames with a few planted per-rank anomalies. A frame the columns cannot evaluate exactly (a
string, an integer beyond 2**53) is judged rank by rank, with the same findings.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import os
import random

import numpy as np
import pytest

from ranksight.collectors import FEATURES
from ranksight.rules import load_rules
from ranksight.rules._evaluate import _fire, candidates, evaluate, run_checklist
from ranksight.rules._expr import evaluate as eval_expr
from ranksight.rules._expr import parse
from ranksight.rules._load import parse_rules
from ranksight.rules._vector import OK, Frame, NotVectorised, when_mask
from ranksight.rules._vector import evaluate as vec_eval

RULES = load_rules()


def _exprs(rule):
    out = [rule.when, rule.value, rule.noise, rule.cost, *(e for _, e in rule.suggest)]
    out += [case.when for case in rule.fix_cases] + list(rule.explains_when.values())
    return [e for e in out if e is not None]


def _constants(exprs, extra=()) -> set:
    found = set(extra)
    for expr in exprs:
        found |= {n.value for n in ast.walk(expr.tree) if isinstance(n, ast.Constant)}
    return found


def _pool(constants) -> list:
    """Values for a feature: absent, the special floats, and each constant with its near neighbours."""
    pool = [None, None, 0, 1, 0.0, 1.0, -1.0, 2, float("nan"), math.inf, -math.inf]
    for c in constants:
        pool += [c, float(c), c * (1 + 1e-9) or 1e-12, c * (1 - 1e-9) or -1e-12, c + 1, c - 1]
    return pool


# An infinite or NaN evidence figure stops the per-rank evaluator itself (``_round`` raises): those names
# are drawn from finite values only.
_EVIDENCE = {name for rule in RULES.rules for name in rule.evidence}


def _frame(rng: random.Random, names, pool, ranks: int) -> dict[int, dict]:
    """``ranks`` ranks; about a third of the names hold one value on every rank (job-level)."""
    finite = [v for v in pool if not (isinstance(v, float) and not math.isfinite(v))]
    pools = {name: finite if name in _EVIDENCE else pool for name in names}
    job = {name: rng.choice(pools[name]) for name in names if rng.random() < 0.35}
    feats = {}
    for rank in range(ranks):
        f = {name: None for name in FEATURES}
        f.update({name: job[name] if name in job else rng.choice(pools[name]) for name in names})
        f["rank"] = rank
        f["steps"] = rng.choice([None, 0, 5, 20, 40])
        feats[rank] = f
    return feats


def _same_as_per_rank(feats: dict[int, dict], rules=RULES) -> tuple[list, Frame]:
    """Both ways, the same findings and checklist; and each rule's candidate ranks are exactly the ranks
    where it fires (the columns judge the levels too), unless it was judged rank by rank."""
    frame = Frame(feats)
    expected = evaluate(rules.rules, feats, per_rank=True)
    assert evaluate(rules.rules, frame) == expected
    assert run_checklist(rules.checklist, frame) == run_checklist(rules.checklist, feats, per_rank=True)
    for rule in rules.rules:
        if rule.id not in frame.fallbacks:
            fires = [rank for rank in frame.ranks if _fire(rule, feats[rank]) is not None]
            assert candidates(rule, Frame(feats)) == fires, rule.id
    return expected, frame


def _same_number(a: float, b: float) -> bool:
    """Equal, NaN alike. A zero's sign may differ (Python's int 0 has none, ``0 * -1`` in float64 is -0.0):
    no expression can tell them apart, a division by either zero being unknown."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


def _assert_values_match(expr, frame: Frame) -> None:
    """Per rank: unknown where the per-rank evaluator says None, else the same number (NaN alike)."""
    v = vec_eval(expr, frame)
    val = np.broadcast_to(v.val, (frame.n,))
    st = np.broadcast_to(OK if v.st is None else v.st, (frame.n,))
    for i, env in enumerate(frame.rows):
        ref = eval_expr(expr, env)
        assert (ref is None) == (st[i] != OK), (expr.text, env, ref, st[i])
        if ref is not None:
            assert _same_number(float(ref), float(val[i])), (expr.text, env, ref, val[i])
            assert v.bools or not isinstance(ref, bool), expr.text
    holds = np.array([bool(eval_expr(expr, env)) for env in frame.rows])
    assert (when_mask(expr, frame) == holds).all(), expr.text


@pytest.mark.parametrize("rule", RULES.rules, ids=lambda r: r.id)
def test_each_rule_fires_on_its_own_thresholds_as_rank_by_rank(rule):
    exprs = _exprs(rule)
    names = sorted({n for e in exprs for n in e.names} | set(rule.evidence))
    pool = _pool(_constants(exprs, (t for _, t in rule.levels)))
    fired = 0
    for seed in range(6):
        feats = _frame(random.Random(f"{rule.id}-{seed}"), names, pool, 300)
        findings, frame = _same_as_per_rank(feats)
        assert frame.fallbacks == []
        fired += any(f["rule"] == rule.id for f in findings)
        for expr in exprs:
            _assert_values_match(expr, frame)
    assert fired, f"{rule.id} never fired: the test would not see a difference in its findings"


def test_each_checklist_item_as_rank_by_rank():
    for item in RULES.checklist:
        exprs = [e for e in (item.when, item.value) if e is not None]
        names = sorted({n for e in exprs for n in e.names})
        pool = _pool(_constants(exprs, (item.warn, item.fail)))
        for seed in range(4):
            feats = _frame(random.Random(f"{item.item}-{seed}"), names, pool, 200)
            _same_as_per_rank(feats)
            frame = Frame(feats)
            for expr in exprs:
                _assert_values_match(expr, frame)


_NAMES = ("a", "b", "c")
_FUNCS = ("min", "max", "abs", "round", "floor", "ceil", "coalesce")


def _random_expr(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice([*_NAMES, *_NAMES, "0", "1", "2", "0.5", "-1", "true", "false", "1e308"])
    kind = rng.randrange(6)
    sub = lambda: _random_expr(rng, depth - 1)  # noqa: E731
    if kind == 0:
        return f"({sub()} {rng.choice('+-*/')} {sub()})"
    if kind == 1:
        ops = [rng.choice(["<", "<=", ">", ">=", "==", "!="]) for _ in range(rng.randint(1, 2))]
        return "(" + sub() + "".join(f" {op} {sub()}" for op in ops) + ")"
    if kind == 2:
        return "(" + f" {rng.choice(['and', 'or'])} ".join(sub() for _ in range(rng.randint(2, 3))) + ")"
    if kind == 3:
        return f"({rng.choice(['not ', '-'])}{sub()})"
    func = rng.choice(_FUNCS)
    n = 1 if func in ("abs", "round", "floor", "ceil") else rng.randint(1, 3)
    return f"{func}({', '.join(sub() for _ in range(n))})"


def test_random_expressions_match_the_per_rank_evaluator():
    """The whole language: unknown and error statuses, short circuits, coalesce, min/max of NaN, round."""
    rng = random.Random(7)
    values = [None, 0, 1, 2, -3, 0.0, -0.0, 0.5, 2.5, -2.5, 1e308, float("nan"), math.inf, -math.inf, True, False]
    rows = [{name: rng.choice(values) for name in _NAMES} for _ in range(150)]
    rows.append({name: 7 for name in _NAMES})  # the same on every rank below: one-element columns
    present = [{name: rng.choice(values[1:]) for name in _NAMES} for _ in range(60)]  # no status column
    frames = [Frame(dict(enumerate(rows))), Frame(dict(enumerate(present)))]
    frames.append(Frame({r: {**rows[-1], "rank": r} for r in range(5)}))
    checked = 0
    for _ in range(3000):
        expr = parse(_random_expr(rng, 4))
        for frame in frames:
            try:
                _assert_values_match(expr, frame)
                checked += 1
            except NotVectorised:
                pass
    assert checked > 5000


def test_a_column_the_arrays_cannot_hold_exactly_is_judged_rank_by_rank():
    text = """
rules:
  - id: big-int
    axis: sync
    title: t
    when: parameter_bytes + 1 > parameter_bytes
    severity: warning
    summary: "s {ranks}"
    fix: {text: f}
  - id: plain
    axis: sync
    title: t
    when: steps >= 1
    severity: info
    summary: "s {ranks}"
    fix: {text: f}
"""
    rules = parse_rules(text)
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": 2**60 + r} for r in range(4)}
    findings, frame = _same_as_per_rank(feats, rules)
    assert [f["rule"] for f in findings] == ["big-int", "plain"]  # 2**60 + 1 > 2**60 holds in Python
    assert frame.fallbacks == ["big-int"]
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": "1" if r == 1 else 1} for r in range(4)}
    findings, frame = _same_as_per_rank(feats, rules)
    assert frame.fallbacks == ["big-int"]
    assert findings[0]["rule"] == "big-int" and findings[0]["ranks"] == [0, 2, 3]  # "1" + 1 is unknown
    # One value on every rank (a job-level figure) is held as one element: exactly where float64 holds it.
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": 2**60} for r in range(4)}
    findings, frame = _same_as_per_rank(feats, rules)
    assert frame.fallbacks == ["big-int"] and findings[0]["ranks"] == [0, 1, 2, 3]
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": [1, 1.0, True, 1][r]} for r in range(4)}
    findings, frame = _same_as_per_rank(feats, rules)
    assert frame.fallbacks == [] and frame.column("parameter_bytes").val.shape == (1,)


def _planted_frame(seed: int, ranks: int = 10_000) -> dict[int, dict]:
    """A 2-rank-per-node-ish CPU DDP job at ``ranks`` ranks: job-level figures alike everywhere, per-rank
    shares drawn at random, and a few ranks with a planted anomaly (a hungry loader, a straggler, memory)."""
    rng = np.random.default_rng(seed)
    job = {name: None for name in FEATURES}
    job.update(
        world_size=ranks, ranks_reporting=ranks, nodes=ranks // 8, ddp=1, fsdp=0, compiled=0, model_on_gpu=0,
        ddp_backend_gloo=1, find_unused_parameters=0, static_graph=0, loader_wrapped=1, loader_num_workers=2,
        loader_pin_memory=0, ranks_data_measured=ranks, data_measured=1, graph_breaks=0, recompiles=0,
        recompiles_after_warmup=0, cpus_allowed=16, cpu_count=16, local_world_size=8, torch_threads=1,
        cpus_per_rank=2.0, threads_demanded=24, oversubscription_ratio=1.5, comm_floor_share=0.04,
        comm_floor_share_noise=0.005, comm_blocked_floor_share=0.0, imbalance_cost_share=0.02,
        least_wait_top_share=0.3, grad_bytes_per_step=4.0e6, buckets_per_step=2, transport_bytes_per_s=1e9,
        transport_latency_s=0.0035, allreduce_wire_s=0.008, allreduce_latency_s=0.007, parameter_bytes=4_000_000,
        records_dropped_total=0, agent_errors_total=0, slowest_rank=ranks - 1,
    )  # fmt: skip
    feats = {}
    shares = rng.dirichlet([8, 2, 1, 1, 1], ranks)
    for rank in range(ranks):
        f = dict(job)
        compute, wait, comm, opt, other = (float(x) for x in shares[rank])
        f.update(
            rank=rank, steps=int(rng.integers(15, 1000)), step_median_s=float(rng.gamma(20, 0.0005)),
            compute_share=compute, data_wait_share=wait * 0.2, data_wait_share_noise=0.002,
            comm_exposed_share=comm, grad_comm_share=comm * 0.8, optimizer_share=opt * 0.5, other_share=other * 0.3,
            host_bound_share=compute + wait * 0.2 + opt * 0.5, least_wait_step_share=float(rng.uniform(0, 0.3)),
            straggler_cost_share=float(rng.uniform(0, 0.02)), straggler_cost_share_noise=0.001,
            straggler_work_explained=float(rng.uniform(-1, 1)) if rng.random() < 0.9 else None,
            host_load_ratio=float(rng.uniform(0.2, 1.2)), host_cpu_contended=int(rng.random() < 0.1),
            run_time_s=float(rng.uniform(1, 100)), compute_vs_median=float(rng.normal(1, 0.05)),
        )  # fmt: skip
        feats[rank] = f
    for rank in rng.choice(ranks, 5, replace=False):  # hungry loaders
        feats[int(rank)]["data_wait_share"] = float(rng.uniform(0.1, 0.5))
    straggler = int(rng.integers(ranks))
    feats[straggler].update(least_wait_step_share=0.95, straggler_cost_share=0.2, straggler_work_explained=0.9)
    for rank in rng.choice(ranks, 3, replace=False):  # a rank of a contended host, last at most collectives
        feats[int(rank)].update(
            least_wait_step_share=0.85, straggler_work_explained=0.1, host_cpu_contended=1, straggler_cost_share=0.08
        )
    for rank in rng.choice(ranks, 2, replace=False):
        feats[int(rank)].update(graph_breaks=4, compiled=1, recompiles_after_warmup=2)
    return feats


@pytest.mark.parametrize("seed", [0, 1])
def test_10000_ranks_with_planted_anomalies_as_rank_by_rank(seed):
    feats = _planted_frame(seed)
    findings, frame = _same_as_per_rank(feats)
    assert frame.fallbacks == []
    fired = {f["rule"] for f in findings}
    assert {"input-bound", "straggler", "host-slowed-rank", "graph-breaks"} <= fired, fired
    # Most rules are judged on a few ranks, not 10,000.
    judged = sum(len(candidates(rule, Frame(feats))) for rule in RULES.rules)
    assert judged < len(RULES.rules) * len(feats) / 4


CORPUS_FEATURES = os.path.join(os.path.dirname(__file__), "data", "corpus_cpu14_features.json.gz")
"""Each rank's features and context of the 14 runs of the CPU diagnosis corpus of 2026-12-03
(``benchmarks/diagnosis_corpus.py --scripts gpt_trainer ddp_tutorial --repeats 1 --out OUT``: the nanoGPT-style
trainer and the DDP tutorial, each healthy and with six planted faults, two gloo ranks), as ``Run.features()``
and ``Run.context()`` read them from the rows. Made again with::

    python -c "import glob, gzip, json, os; from ranksight.collectors import open_run
    runs = {os.path.basename(p): open_run(p, follow_spool=False) for p in sorted(glob.glob('OUT/runs/*'))}
    out = json.dumps({n: {'features': r.features(), 'context': r.context()} for n, r in runs.items()}, sort_keys=True)
    gzip.GzipFile('tests/data/corpus_cpu14_features.json.gz', 'wb', mtime=0).write(out.encode())"
"""


def _corpus_runs() -> dict[str, tuple[dict, dict]]:
    with gzip.open(CORPUS_FEATURES, "rt") as f:
        runs = json.load(f)
    return {
        name: (
            {int(r): f for r, f in run["features"].items()},
            {int(r): c for r, c in run["context"].items()},
        )
        for name, run in runs.items()
    }


def test_the_cpu_corpus_features_as_rank_by_rank():
    """Real features, not drawn ones: on each run of the CPU corpus the columns give the findings and the
    checklist the per-rank evaluator gives, with the run's context, and every condition and figure of every
    rule (``when``, value, noise, cost, fix cases, ``suggest``, ``explains``) holds on the same ranks."""
    runs = _corpus_runs()
    assert len(runs) == 14
    fired = set()
    for name, (feats, context) in runs.items():
        frame = Frame(feats)
        expected = evaluate(RULES.rules, feats, context, per_rank=True)
        assert evaluate(RULES.rules, frame, context) == expected, name
        assert run_checklist(RULES.checklist, frame) == run_checklist(RULES.checklist, feats, per_rank=True), name
        assert frame.fallbacks == [], name
        for rule in RULES.rules:
            fires = [rank for rank in frame.ranks if _fire(rule, feats[rank]) is not None]
            assert candidates(rule, Frame(feats)) == fires, (name, rule.id)
            for expr in _exprs(rule):
                _assert_values_match(expr, frame)
        fired |= {f["rule"] for f in expected}
    # The corpus plants these, and the rows named them: the comparison covers firing rules, not silence alone.
    assert {"input-bound", "straggler", "graph-breaks", "unused-parameter-scan", "exposed-allreduce"} <= fired, fired


# The hits' figures over the columns: the worst rank must be the one Python's ``max`` picks over ``_fire``'s hits.
_HIT_RULES = """
rules:
  - id: levelled
    axis: data_pipeline
    title: t
    value: data_wait_share
    noise: data_wait_share_noise
    levels: {info: 0.05, warning: 0.1, critical: 0.3}
    cost: data_wait_share - data_wait_host_share
    confidence: 0.9
    evidence: [step_median_s]
    summary: "{value} on {ranks}, {cost_share}"
    fix: {text: f}
  - id: below
    axis: sync
    title: t
    value: compute_vs_median
    compare: "<="
    levels: {warning: 0.9, critical: 0.5}
    evidence: [step_median_s]
    risk: loud without a cost
    summary: "{value} on {ranks}"
    fix: {text: f}
  - id: counted
    axis: sync
    title: t
    value: graph_breaks
    levels: {warning: 1, critical: 4}
    evidence: [step_median_s]
    risk: loud without a cost
    summary: "{value} breaks on {ranks}"
    fix: {text: f}
  - id: cause
    axis: data_pipeline
    title: t
    when: data_wait_share > 0.05
    severity: warning
    explains: [{effect: host_cpu_contended > 0}]
    risk: loud without a cost
    summary: "s {ranks}"
    fix: {text: f}
  - id: effect
    axis: sync
    title: t
    when: step_median_s > 0
    severity: warning
    risk: loud without a cost
    summary: "s {ranks}"
    fix: {text: f}
"""
HIT_RULES = parse_rules(_HIT_RULES)


def _hits_frame(rows: list[dict]) -> dict[int, dict]:
    """Ranks 0..n-1 with ``rows``' features, every other feature absent, 40 steps unless given."""
    feats = {}
    for rank, row in enumerate(rows):
        f = dict.fromkeys(FEATURES)
        f.update(rank=rank, steps=40, step_median_s=0.1 + rank / 1000)
        f.update(row)
        feats[rank] = f
    return feats


def _findings_by_columns(feats: dict[int, dict]) -> dict[str, dict]:
    """The findings, the same both ways, with no rule judged rank by rank."""
    frame = Frame(feats)
    findings = evaluate(HIT_RULES.rules, frame)
    assert findings == evaluate(HIT_RULES.rules, feats, per_rank=True)
    assert frame.fallbacks == []
    return {f["rule"]: f for f in findings}


def test_the_first_of_equally_bad_ranks_is_the_worst():
    """1,000 ranks alike on every key: Python's ``max`` keeps the first, whose own features are the evidence."""
    feats = _hits_frame([{"data_wait_share": 0.2, "data_wait_host_share": 0.0}] * 1000)
    feats[0]["data_wait_share"] = 0.1  # a lower level: rank 1 is the first of the worst
    found = _findings_by_columns(feats)["levelled"]
    assert found["ranks"] == list(range(1000)) and found["evidence"]["step_median_s"] == 0.101
    below = _hits_frame([{"compute_vs_median": 0.8 if rank % 7 else 0.4} for rank in range(700)])
    found = _findings_by_columns(below)["below"]  # compare <=: the lowest value is the worst; ranks 0, 7, ...
    assert found["severity"] == "critical" and found["evidence"] == {"step_median_s": 0.1, "value": 0.4}


def test_ranks_equal_but_for_their_steps_are_told_apart_by_the_rounded_confidence():
    """Same severity, cost and value; the confidence (its settled part) decides, rounded as reported: a later
    rank with more steps wins, and ranks whose confidences round alike leave the first one the worst."""
    rows = [{"data_wait_share": 0.2, "data_wait_host_share": 0.0, "steps": steps} for steps in (4, None, 20, 40, 19)]
    found = _findings_by_columns(_hits_frame(rows))["levelled"]
    assert found["evidence"]["step_median_s"] == 0.102 and found["confidence"] == 0.86  # rank 2, the first settled
    rows = [{"data_wait_share": 0.2, "data_wait_host_share": 0.0, "steps": steps} for steps in (10, 10.2, 4)]
    feats = _hits_frame(rows)  # 0.7875 and 0.78885: rank 1's is higher, both read 0.79
    assert _fire(HIT_RULES.rules[0], feats[0]).confidence == _fire(HIT_RULES.rules[0], feats[1]).confidence == 0.79
    assert _findings_by_columns(feats)["levelled"]["evidence"]["step_median_s"] == 0.1  # rank 0: rounds alike


def test_an_int_value_stays_an_int_in_the_finding():
    feats = _hits_frame([{"graph_breaks": n} for n in (0, 2, 5, 5, 3)])
    found = _findings_by_columns(feats)["counted"]
    assert found["ranks"] == [1, 2, 3, 4] and found["severity"] == "critical"
    assert type(found["evidence"]["value"]) is int and found["summary"].startswith("5 breaks on ranks 1, 2, 3, 4")


def test_a_cost_unknown_on_some_hits_ranks_below_every_known_one():
    """No host share on the worse ranks: their cost is unknown (keyed -1), so a known cost, even 0, is worse."""
    rows = [
        {"data_wait_share": 0.4, "data_wait_host_share": None},
        {"data_wait_share": 0.35, "data_wait_host_share": 0.35},
        {"data_wait_share": 0.36, "data_wait_host_share": 0.2},
        {"data_wait_share": 0.5, "data_wait_host_share": None},
    ]
    found = _findings_by_columns(_hits_frame(rows))["levelled"]
    assert found["cost_share"] == 0.16 and found["evidence"]["value"] == 0.36
    found = _findings_by_columns(_hits_frame(rows[:2] + rows[3:]))["levelled"]
    assert found["cost_share"] == 0.0 and found["evidence"]["value"] == 0.35  # a cost of 0 beats an unknown one
    found = _findings_by_columns(_hits_frame([{**row, "data_wait_host_share": None} for row in rows]))["levelled"]
    assert found["cost_share"] is None and found["evidence"]["value"] == 0.5


def test_a_condition_of_explains_counts_on_the_hit_ranks_only():
    rows = [{"data_wait_share": 0.2 if rank < 50 else 0.0, "host_cpu_contended": 0} for rank in range(100)]
    rows[37]["host_cpu_contended"] = 1  # one hit rank: cause explains effect
    assert _findings_by_columns(_hits_frame(rows))["effect"]["explained_by"] == "cause"
    rows[37]["host_cpu_contended"], rows[80]["host_cpu_contended"] = 0, 1  # a rank cause did not fire on
    assert _findings_by_columns(_hits_frame(rows))["effect"]["explained_by"] is None


def test_drawn_hits_with_many_ties_as_rank_by_rank():
    """Values, noise, costs and steps drawn from a few each, so ranks tie on every key in every way."""
    rng = random.Random(11)
    shares = [None, 0.0, 0.05, 0.1, 0.1000001, 0.2, 0.3, 0.5, 1.0, 2]
    for _ in range(40):
        rows = [
            {
                "data_wait_share": rng.choice(shares),
                "data_wait_share_noise": rng.choice([None, 0.0, 0.01, -1, 1e-9]),
                "data_wait_host_share": rng.choice([None, 0.0, 0.1, 0.5]),
                "compute_vs_median": rng.choice([None, 0.3, 0.5, 0.5000001, 0.7, 0.9, 1, 0]),
                "graph_breaks": rng.choice([None, 0, 1, 4, 9]),
                "host_cpu_contended": int(rng.random() < 0.02),
                "steps": rng.choice([None, 0, 4, 19, 19.99, 20, 40]),
            }
            for _ in range(rng.choice([1, 2, 30, 400]))
        ]
        _findings_by_columns(_hits_frame(rows))


def test_hit_figures_the_columns_cannot_give_exactly_are_judged_rank_by_rank():
    """A bool value (not a number to ``_known``), a NaN value (Python's tuples compare it by identity), a
    string in a condition of ``explains``: the same findings, the rule (or its condition) named."""
    text = """
rules:
  - id: flagged
    axis: sync
    title: t
    when: data_wait_share > 0
    value: data_wait_share > 0.1
    severity: warning
    summary: "s {ranks} {value}"
    fix: {text: f}
  - id: nan-valued
    axis: sync
    title: t
    when: steps > 0
    value: compute_vs_median
    severity: info
    explains: [{flagged: loader_num_workers > 0}]
    summary: "s {ranks} {value}"
    fix: {text: f}
"""
    rules = parse_rules(text)
    rows = [{"data_wait_share": 0.05 * r, "compute_vs_median": 1.0 + r / 10, "loader_num_workers": 0} for r in range(6)]
    rows[2]["loader_num_workers"] = "2"  # "2" > 0 is a TypeError per rank: unknown, so it does not hold
    findings, frame = _same_as_per_rank(_hits_frame(rows), rules)
    assert frame.fallbacks == ["flagged", "nan-valued: explains flagged"]
    assert findings[0]["evidence"] == {"value": True}
    rows[3]["compute_vs_median"] = math.nan
    findings, frame = _same_as_per_rank(_hits_frame(rows), rules)
    assert frame.fallbacks == ["flagged", "nan-valued"]
