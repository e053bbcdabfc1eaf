"""The one evaluator (rule expressions over feature columns) held to Python's arithmetic and to itself rank by rank.

The language means what Python's operators mean: ``_python`` below walks an expression's tree with them, one
rank's features at a time (the reference, kept by the tests only). Every expression of every built-in rule
and checklist item, on frames built from the rules' own thresholds (each feature present, absent, NaN,
infinite, and at, just below and just above every constant it is compared with; some the same on every
rank, as job-level figures are), on the CPU corpus's features and on random expressions of the whole
language, gives on each row of a frame what Python gives on that rank alone: unknown or not, the same
number, the same type. And a rule judged over many ranks fires on exactly the ranks where it fires on each
rank alone (a one-row frame), with one of those ranks' findings. The findings themselves are held to the
golden ones (``test_rules_golden.py``).
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import operator
import os
import random

import pytest

from ranksight.collectors import FEATURES
from ranksight.rules import evaluate, load_rules, parse, parse_rules, run_checklist
from ranksight.rules._expr import Frame
from ranksight.rules._expr import evaluate as eval_expr

from ._rules_golden import HIT_RULES as _HIT_RULES
from ._rules_golden import _constants, _exprs, _pool, _threshold_frame, planted_frame

RULES = load_rules()
_EVIDENCE = {name for rule in RULES.rules for name in rule.evidence}
_EXACT_INT = 2**53


class _Unknown(Exception):
    """An absent feature or a division by zero: ``coalesce`` tries its next argument."""


class _Beyond(Exception):
    """An integer beyond 2**53: exact in Python, float64 in the columns (no feature comes near)."""


_PY_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_PY_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_PY_CMPOPS.update({ast.Eq: operator.eq, ast.NotEq: operator.ne})
_PY_FUNCS = {"min": min, "max": max, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil}
_PY_CONSTS = {"true": True, "false": False, "True": True, "False": False}


def _walk(node: ast.AST, env: dict):
    value = _walk_node(node, env)
    if type(value) is int and abs(value) > _EXACT_INT:
        raise _Beyond(value)
    return value


def _walk_node(node: ast.AST, env: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _PY_CONSTS:
            return _PY_CONSTS[node.id]
        if env.get(node.id) is None:
            raise _Unknown(node.id)
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _walk(node.left, env), _walk(node.right, env)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Unknown("division by zero")
        return _PY_BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _walk(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BoolOp):  # short-circuits, each operand as bool(), like Python
        is_and = isinstance(node.op, ast.And)
        for operand in node.values:
            if bool(_walk(operand, env)) != is_and:
                return not is_and
        return is_and
    if isinstance(node, ast.Compare):
        left = _walk(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _walk(comparator, env)
            if not _PY_CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if node.func.id == "coalesce":
        for arg in node.args:
            try:
                return _walk(arg, env)
            except _Unknown:
                continue
        raise _Unknown("coalesce")
    return _PY_FUNCS[node.func.id](*(_walk(arg, env) for arg in node.args))


def _python(expr, env: dict):
    """What Python makes of the expression on one rank: None when unknown (an error too); raises _Beyond."""
    try:
        return _walk(expr.tree, env)
    except (_Unknown, ArithmeticError, ValueError, TypeError):
        return None


def _same_number(a: float, b: float) -> bool:
    """Equal, NaN alike. A zero's sign may differ (Python's int 0 has none, ``0 * -1`` in float64 is -0.0):
    no expression can tell them apart, a division by either zero being unknown."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


def _assert_values_match(expr, frame: Frame, alone: bool = False) -> int:
    """Per row: unknown where Python says None, else the same number of the same type; where the expression
    holds too. With ``alone``, each row as a one-row frame as well. Returns the rows compared."""
    v, holds, compared = frame.value(expr), frame.holds(expr), 0
    for i, env in enumerate(frame.rows):
        try:
            ref = _python(expr, env)
        except _Beyond:
            continue
        got = v.at(i)
        assert (ref is None) == (got is None), (expr.text, env, ref, got)
        if ref is not None:
            assert type(got) is type(ref) and _same_number(float(ref), float(got)), (expr.text, env, ref, got)
        assert holds[i] == bool(ref), (expr.text, env, ref)
        if alone:
            one = eval_expr(expr, env)
            assert type(one) is type(got) and (one is None or _same_number(float(one), float(got))), (expr.text, env)
        compared += 1
    return compared


def _as_each_rank_alone(rule, feats: dict[int, dict], ranks: int | None = None) -> list:
    """Over all ranks (or the first ``ranks``), ``rule`` fires where it fires on each rank alone, with one of
    those ranks' own figures and text but for the ranks, and the highest of their confidences."""
    feats = {r: feats[r] for r in sorted(feats)[:ranks]}
    whole = evaluate([rule], feats)
    alone = {r: evaluate([rule], {r: f}) for r, f in feats.items()}
    fired = [r for r, found in alone.items() if found]
    assert [f["ranks"] for f in whole] == ([fired] if fired else []), rule.id
    if fired:
        (finding,) = whole
        figures = ("severity", "cost_share", "speedup", "cost_basis", "evidence", "explained_by")
        assert any(all(alone[r][0][k] == finding[k] for k in figures) for r in fired), (rule.id, finding)
        assert finding["confidence"] == max(alone[r][0]["confidence"] for r in fired), rule.id
    return whole


def _checklist_as_each_rank_alone(items, feats: dict[int, dict]) -> None:
    """The checklist over all ranks is each item's worst of its value on each rank alone (n/a where none has one)."""
    whole = run_checklist(items, feats)
    alone = [run_checklist(items, {r: f}) for r, f in feats.items()]
    for i, (item, got) in enumerate(zip(items, whole)):
        values = [one[i]["value"] for one in alone if one[i]["status"] != "n/a"]
        want = (max if item.compare == ">=" else min)(values) if values else None
        assert got["value"] == want and (got["status"] == "n/a") == (want is None), item.item
        if values:
            assert got == next(one[i] for one in alone if one[i]["value"] == want and one[i]["status"] != "n/a")


@pytest.mark.parametrize("rule", RULES.rules, ids=lambda r: r.id)
def test_each_rule_on_its_own_thresholds_as_python_and_rank_by_rank(rule):
    exprs = _exprs(rule)
    names = sorted({n for e in exprs for n in e.names} | set(rule.evidence))
    pool = _pool(_constants(exprs, (t for _, t in rule.levels)))
    fired = 0
    for seed in range(6):
        feats = _threshold_frame(random.Random(f"{rule.id}-{seed}"), names, pool, 300, _EVIDENCE)
        frame = Frame(feats)
        for expr in exprs:
            _assert_values_match(expr, frame, alone=seed == 0)
        _as_each_rank_alone(rule, feats, ranks=60)
        fired += bool(evaluate([rule], frame))
    assert fired, f"{rule.id} never fired: the test would not see a difference in its findings"


def test_each_checklist_item_as_python_and_rank_by_rank():
    for item in RULES.checklist:
        exprs = [e for e in (item.when, item.value) if e is not None]
        names = sorted({n for e in exprs for n in e.names})
        pool = _pool(_constants(exprs, (item.warn, item.fail)))
        for seed in range(4):
            feats = _threshold_frame(random.Random(f"{item.item}-{seed}"), names, pool, 200, _EVIDENCE)
            frame = Frame(feats)
            for expr in exprs:
                _assert_values_match(expr, frame)
            _checklist_as_each_rank_alone([item], feats)


def test_every_builtin_expression_as_python_on_drawn_ranks():
    """Each row of a frame, and each rank as a one-row frame, as Python computes it."""
    exprs = {e.text: e for rule in RULES.rules for e in _exprs(rule)}
    exprs.update((e.text, e) for item in RULES.checklist for e in (item.when, item.value) if e is not None)
    for text in ("coalesce(a, b / 0, 2) + -c", "not (a < b < c) or floor(a) == ceil(b)", "min(a, b) / max(0, c)"):
        exprs[text] = parse(text)
    assert len(exprs) > 50
    rng = random.Random(3)
    names = sorted(set(FEATURES) | {"a", "b", "c"})
    rows = [
        {n: rng.choice([None, 0, 0.0, 1, -1.5, rng.random(), rng.uniform(-5, 5), 1e300]) for n in names}
        for _ in range(300)
    ]
    frame = Frame(dict(enumerate(rows)))
    for text in sorted(exprs):
        _assert_values_match(exprs[text], frame, alone=True)


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


def test_random_expressions_as_python():
    """The whole language: unknown and error statuses, short circuits, coalesce, min/max of NaN, round, and the
    type of each result (an int, a float, a bool)."""
    rng = random.Random(7)
    values = [None, 0, 1, 2, -3, 0.0, -0.0, 0.5, 2.5, -2.5, 1e308, float("nan"), math.inf, -math.inf, True, False]
    rows = [{name: rng.choice(values) for name in _NAMES} for _ in range(150)]
    rows.append({name: 7 for name in _NAMES})
    present = [{name: rng.choice(values[1:]) for name in _NAMES} for _ in range(60)]  # none absent
    frames = [Frame(dict(enumerate(rows))), Frame(dict(enumerate(present)))]
    frames.append(Frame({r: {**rows[-1], "rank": r} for r in range(5)}))  # the same on every rank: one element
    compared = 0
    for i in range(3000):
        expr = parse(_random_expr(rng, 4))
        for frame in frames:
            compared += _assert_values_match(expr, frame, alone=i % 10 == 0)
    assert compared > 500_000


def test_a_string_makes_an_expression_unknown_and_each_rank_keeps_its_type():
    text = """
rules:
  - id: grows
    axis: sync
    title: t
    when: parameter_bytes + 1 > parameter_bytes
    severity: warning
    summary: "s {ranks}"
    fix: {text: f}
"""
    (rule,) = parse_rules(text).rules
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": "1" if r == 1 else 1} for r in range(4)}
    assert _as_each_rank_alone(rule, feats)[0]["ranks"] == [0, 2, 3]  # "1" + 1 is unknown
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": 2**53 - 2 + r % 2} for r in range(4)}
    assert _as_each_rank_alone(rule, feats)[0]["ranks"] == [0, 1, 2, 3]  # exact up to 2**53
    feats = {r: {"rank": r, "steps": 3, "parameter_bytes": [1, 1.0, True, 1][r]} for r in range(4)}
    frame = Frame(feats)
    assert [type(frame.value(parse("parameter_bytes")).at(r)) for r in range(4)] == [int, float, bool, int]
    assert [type(frame.value(parse("parameter_bytes * 2")).at(r)) for r in range(4)] == [int, float, int, int]
    assert [type(frame.value(parse("parameter_bytes / 1")).at(r)) for r in range(4)] == [float] * 4
    # One value on every rank (a job-level figure) is held as one element.
    assert Frame({r: {"steps": 3} for r in range(1000)}).column("steps").val.shape == (1,)
    # No rank at all (a run with nothing recorded): no finding, every checklist item n/a.
    assert evaluate(RULES.rules, {}) == []
    assert {c["status"] for c in run_checklist(RULES.checklist, {})} == {"n/a"}


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_anomalies_as_rank_by_rank(seed):
    fired = {f["rule"] for f in evaluate(RULES.rules, planted_frame(seed))}  # 10,000 ranks
    assert {"input-bound", "straggler", "host-slowed-rank", "graph-breaks"} <= fired, fired
    small = planted_frame(seed, ranks=200)
    for rule in RULES.rules:
        _as_each_rank_alone(rule, small)


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


def test_the_cpu_corpus_features_as_python_and_rank_by_rank():
    """Real features, not drawn ones: every condition and figure of every rule (``when``, value, noise, cost,
    fix cases, ``suggest``, ``explains``) as Python computes it, each rule as on each rank alone."""
    with gzip.open(CORPUS_FEATURES, "rt") as f:
        runs = json.load(f)
    assert len(runs) == 14
    fired = set()
    for run in runs.values():
        feats = {int(r): f for r, f in run["features"].items()}
        context = {int(r): c for r, c in run["context"].items()}
        frame = Frame(feats)
        for rule in RULES.rules:
            for expr in _exprs(rule):
                _assert_values_match(expr, frame)
            _as_each_rank_alone(rule, feats)
        _checklist_as_each_rank_alone(RULES.checklist, feats)
        fired |= {f["rule"] for f in evaluate(RULES.rules, frame, context)}
    # The corpus plants these, and the rows named them: the comparison covers firing rules, not silence alone.
    assert {"input-bound", "straggler", "graph-breaks", "unused-parameter-scan", "exposed-allreduce"} <= fired, fired


# The worst rank among the hits: the first of the greatest (severity, cost, extreme value, rounded confidence).
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


def _findings(feats: dict[int, dict]) -> dict[str, dict]:
    """The findings, each rule as on each rank alone."""
    for rule in HIT_RULES.rules:
        _as_each_rank_alone(rule, feats, ranks=60)
    return {f["rule"]: f for f in evaluate(HIT_RULES.rules, feats)}


def test_the_first_of_equally_bad_ranks_is_the_worst():
    """1,000 ranks alike on every key: the first is the worst, whose own features are the evidence."""
    feats = _hits_frame([{"data_wait_share": 0.2, "data_wait_host_share": 0.0}] * 1000)
    feats[0]["data_wait_share"] = 0.1  # a lower level: rank 1 is the first of the worst
    found = _findings(feats)["levelled"]
    assert found["ranks"] == list(range(1000)) and found["evidence"]["step_median_s"] == 0.101
    below = _hits_frame([{"compute_vs_median": 0.8 if rank % 7 else 0.4} for rank in range(700)])
    found = _findings(below)["below"]  # compare <=: the lowest value is the worst; ranks 0, 7, ...
    assert found["severity"] == "critical" and found["evidence"] == {"step_median_s": 0.1, "value": 0.4}


def test_ranks_equal_but_for_their_steps_are_told_apart_by_the_rounded_confidence():
    """Same severity, cost and value; the confidence (its settled part) decides, rounded as reported: a later
    rank with more steps wins, and ranks whose confidences round alike leave the first one the worst."""
    rows = [{"data_wait_share": 0.2, "data_wait_host_share": 0.0, "steps": steps} for steps in (4, None, 20, 40, 19)]
    found = _findings(_hits_frame(rows))["levelled"]
    assert found["evidence"]["step_median_s"] == 0.102 and found["confidence"] == 0.86  # rank 2, the first settled
    rows = [{"data_wait_share": 0.2, "data_wait_host_share": 0.0, "steps": steps} for steps in (10, 10.2, 4)]
    feats = _hits_frame(rows)  # 0.7875 and 0.78885: rank 1's is higher, both read 0.79
    alone = [evaluate(HIT_RULES.rules[:1], {r: feats[r]})[0]["confidence"] for r in (0, 1)]
    assert alone == [0.79, 0.79]
    assert _findings(feats)["levelled"]["evidence"]["step_median_s"] == 0.1  # rank 0: rounds alike


def test_an_int_value_stays_an_int_in_the_finding():
    feats = _hits_frame([{"graph_breaks": n} for n in (0, 2, 5, 5, 3)])
    found = _findings(feats)["counted"]
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
    found = _findings(_hits_frame(rows))["levelled"]
    assert found["cost_share"] == 0.16 and found["evidence"]["value"] == 0.36
    found = _findings(_hits_frame(rows[:2] + rows[3:]))["levelled"]
    assert found["cost_share"] == 0.0 and found["evidence"]["value"] == 0.35  # a cost of 0 beats an unknown one
    found = _findings(_hits_frame([{**row, "data_wait_host_share": None} for row in rows]))["levelled"]
    assert found["cost_share"] is None and found["evidence"]["value"] == 0.5


def test_a_condition_of_explains_counts_on_the_hit_ranks_only():
    rows = [{"data_wait_share": 0.2 if rank < 50 else 0.0, "host_cpu_contended": 0} for rank in range(100)]
    rows[37]["host_cpu_contended"] = 1  # one hit rank: cause explains effect
    assert _findings(_hits_frame(rows))["effect"]["explained_by"] == "cause"
    rows[37]["host_cpu_contended"], rows[80]["host_cpu_contended"] = 0, 1  # a rank cause did not fire on
    assert _findings(_hits_frame(rows))["effect"]["explained_by"] is None


def test_a_bool_value_a_nan_value_and_a_string_in_a_condition_of_explains():
    """A bool value is reported as one (a rule without levels does not measure it); a NaN value counts as the
    least extreme; a string in a condition of ``explains`` leaves it unknown, so it does not hold."""
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
    rows[2]["loader_num_workers"] = "2"  # "2" > 0 is a TypeError in Python: unknown, so it does not hold
    feats = _hits_frame(rows)
    findings = evaluate(rules.rules, feats)
    assert findings[0]["rule"] == "flagged" and findings[0]["evidence"] == {"value": True}
    assert findings[0]["ranks"] == [1, 2, 3, 4, 5] and findings[0]["explained_by"] is None
    rows[0]["compute_vs_median"] = math.nan
    found = {f["rule"]: f for f in evaluate(rules.rules, _hits_frame(rows))}["nan-valued"]
    assert found["evidence"] == {"value": 1.5} and found["ranks"] == list(range(6))
    for rule in rules.rules:
        _as_each_rank_alone(rule, _hits_frame(rows))
