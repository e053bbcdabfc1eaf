"""Golden findings of the rule engine: inputs drawn (seeded) around real jobs, and what the engine made of them.

``cases()`` yields every input: the 14 runs of the CPU corpus with their context; 1,500 one-rank jobs drawn
as the severity invariant draws its own, over the figures these rules read (a feature added since moves no
draw); 300 jobs of 2 to 5 ranks drawn around the healthy one, with a framework each; each
built-in rule and checklist item on frames built from its own thresholds (absent, NaN, infinite, at and
beside every constant it compares with); two 10,000-rank jobs with planted anomalies; and ranks tied on
every key of the worst-rank choice. The rules are the built-in ones as they were when the golden file was
written (``tests/data/rules_golden/``), so tuning a built-in rule does not move what the engine is held to.
``tests/data/rules_golden.json.gz`` holds the findings and checklist the engine gave on them;
``test_rules_golden.py`` compares. Written again (after checking why a finding moved) with::

    .venv/bin/python -m tests._rules_golden
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import os
import random

import numpy as np

from ranksight.collectors import FEATURES
from ranksight.rules import evaluate, load_rules, parse_rules, run_checklist

from .test_severity_invariant import _draw  # drawn as the invariant's jobs are

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "rules_golden.json.gz")
RULES = os.path.join(os.path.dirname(__file__), "data", "rules_golden")
CORPUS = os.path.join(os.path.dirname(__file__), "data", "corpus_cpu14_features.json.gz")
_FRAMEWORKS = ("plain", "lightning", "transformers", "accelerate", "run")


def _exprs(rule):
    out = [rule.when, rule.value, rule.noise, rule.cost, *(e for _, e in rule.suggest)]
    out += [case.when for case in rule.fix_cases] + list(rule.explains_when.values())
    return [e for e in out if e is not None]


def _read_by(ruleset) -> set:
    """The features a rule set's rules and checklist read (their expressions and evidence)."""
    exprs = [e for rule in ruleset.rules for e in _exprs(rule)]
    exprs += [e for item in ruleset.checklist for e in (item.when, item.value) if e is not None]
    return {n for e in exprs for n in e.names} | {n for rule in ruleset.rules for n in rule.evidence}


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


def _threshold_frame(rng: random.Random, names, pool, ranks: int, evidence: set) -> dict[int, dict]:
    """``ranks`` ranks; about a third of the names hold one value on every rank (job-level); evidence figures
    finite (the report shows them)."""
    finite = [v for v in pool if not (isinstance(v, float) and not math.isfinite(v))]
    pools = {name: finite if name in evidence else pool for name in names}
    job = {name: rng.choice(pools[name]) for name in names if rng.random() < 0.35}
    feats = {}
    for rank in range(ranks):
        f = dict.fromkeys(FEATURES)
        f.update({name: job[name] if name in job else rng.choice(pools[name]) for name in names})
        f["rank"] = rank
        f["steps"] = rng.choice([None, 0, 5, 20, 40])
        feats[rank] = f
    return feats


def planted_frame(seed: int, ranks: int = 10_000) -> dict[int, dict]:
    """A CPU DDP job at ``ranks`` ranks: job-level figures alike everywhere, per-rank shares drawn at random,
    and a few ranks with a planted anomaly (a hungry loader, a straggler, a contended host, graph breaks)."""
    rng = np.random.default_rng(seed)
    job = dict.fromkeys(FEATURES)
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


HIT_RULES = """
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


def _hits_frame(rows: list[dict]) -> dict[int, dict]:
    feats = {}
    for rank, row in enumerate(rows):
        f = dict.fromkeys(FEATURES)
        f.update(rank=rank, steps=40, step_median_s=0.1 + rank / 1000)
        f.update(row)
        feats[rank] = f
    return feats


def cases():
    """(name, rules, checklist, features, context) for every golden input; checklist None where not judged."""
    builtin = load_rules(RULES, include_builtin=False)
    with gzip.open(CORPUS, "rt") as f:
        corpus = json.load(f)
    for name, run in sorted(corpus.items()):
        feats = {int(r): f for r, f in run["features"].items()}
        context = {int(r): c for r, c in run["context"].items()}
        yield f"corpus/{name}", builtin.rules, builtin.checklist, feats, context
    # Jobs drawn as the severity invariant draws them, over the figures the golden's rules read: every sample
    # name is a feature, and one added since (which these rules cannot read) must move no draw.
    names = sorted(_read_by(builtin) - {"rank"})
    rng = random.Random(20261206)
    for i in range(1500):
        yield f"severity/{i}", builtin.rules, None, {0: _draw(rng, names)}, None
    # Jobs of a few ranks, each rank drawn on its own, the framework drawn too: explains, inheritance, fixes.
    rng, ctx_rng = random.Random(5), random.Random(6)
    for i in range(300):
        ranks = rng.choice((2, 3, 5))
        feats = {}
        for rank in range(ranks):
            feats[rank] = {**_draw(rng, names), "rank": rank, "ranks_reporting": ranks, "world_size": ranks}
        framework = ctx_rng.choice(_FRAMEWORKS)
        context = {r: {"framework": framework} for r in feats}
        yield f"ranks/{i}", builtin.rules, builtin.checklist, feats, context
    evidence = {name for rule in builtin.rules for name in rule.evidence}
    for rule in builtin.rules:
        exprs = _exprs(rule)
        used = sorted({n for e in exprs for n in e.names} | set(rule.evidence))
        pool = _pool(_constants(exprs, (t for _, t in rule.levels)))
        for seed in range(6):
            feats = _threshold_frame(random.Random(f"{rule.id}-{seed}"), used, pool, 300, evidence)
            yield f"thresholds/{rule.id}/{seed}", builtin.rules, builtin.checklist, feats, None
    for item in builtin.checklist:
        exprs = [e for e in (item.when, item.value) if e is not None]
        used = sorted({n for e in exprs for n in e.names})
        pool = _pool(_constants(exprs, (item.warn, item.fail)))
        for seed in range(4):
            feats = _threshold_frame(random.Random(f"{item.item}-{seed}"), used, pool, 200, evidence)
            yield f"checklist/{item.item}/{seed}", builtin.rules, builtin.checklist, feats, None
    for seed in (0, 1):
        yield f"planted/{seed}", builtin.rules, builtin.checklist, planted_frame(seed), None
    hit_rules = parse_rules(HIT_RULES).rules
    rng = random.Random(11)
    shares = [None, 0.0, 0.05, 0.1, 0.1000001, 0.2, 0.3, 0.5, 1.0, 2]
    for i in range(40):
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
        yield f"ties/{i}", hit_rules, None, _hits_frame(rows), None


def judge(rules, checklist, feats, context) -> dict:
    """What the engine makes of one input: its findings and (where judged) its checklist."""
    out = {"findings": evaluate(rules, feats, context)}
    if checklist is not None:
        out["checklist"] = run_checklist(checklist, feats)
    return out


def record(path: str = GOLDEN) -> dict:
    """Judge every case and write the golden file."""
    golden = {name: judge(rules, checklist, feats, context) for name, rules, checklist, feats, context in cases()}
    text = json.dumps(golden, sort_keys=True, separators=(",", ":"))
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(text.encode())
    return golden


if __name__ == "__main__":
    written = record()
    print(f"{len(written)} cases, {sum(len(v['findings']) for v in written.values())} findings -> {GOLDEN}")
