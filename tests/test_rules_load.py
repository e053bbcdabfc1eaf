"""Rule files: the expression language, the schema validator (every error, file:line) and the built-ins."""

from __future__ import annotations

import os
import textwrap

import pytest

from ranksight.rules import ExprError, RuleError, load_rules, parse, parse_rules
from ranksight.rules._expr import evaluate

GOOD_RULE = """
rules:
  - id: slow-steps
    axis: sync
    title: Slow steps
    value: step_median_s
    levels: {warning: 1.0, critical: 5.0}
    evidence: [step_median_s]
    summary: "steps take {step_median_s:.1f} s on {ranks}"
    fix: {text: "make them faster", snippet: "x = 1"}
"""


def _write(folder, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- expressions
def test_expressions_compute_and_compare():
    env = {"a": 0.3, "b": 0.1, "n": 4}
    assert evaluate(parse("a >= 0.2 and b < 0.2"), env) is True
    assert evaluate(parse("a / b"), env) == pytest.approx(3.0)
    assert evaluate(parse("max(a, b) - min(a, b) * 2"), env) == pytest.approx(0.1)
    assert evaluate(parse("not (n == 4) or abs(-b) > 0.05"), env) is True
    assert evaluate(parse("0.1 < a <= 0.3"), env) is True
    assert parse("a + b * n").names == frozenset({"a", "b", "n"})


def test_absent_feature_makes_the_result_unknown_but_and_short_circuits():
    env = {"a": 0.3, "gpu": None, "flag": 0}
    assert evaluate(parse("gpu > 0.5"), env) is None  # absent, not false and never zero
    assert evaluate(parse("a / (flag * 2)"), env) is None  # division by zero is unknown too
    assert evaluate(parse("flag == 1 and gpu > 0.5"), env) is False


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "a.__class__",
        "a[0]",
        "lambda: 1",
        "open('x')",
        "'text' == a",
        "a if b else c",
        "a ** 2",
        "[a, b]",
        "",
    ],
)
def test_anything_outside_the_small_language_is_rejected(text):
    with pytest.raises(ExprError):
        parse(text)


# ---------------------------------------------------------------- validator
def test_every_error_is_reported_at_once_with_file_and_line(tmp_path):
    path = _write(
        tmp_path,
        "bad.yaml",
        """\
        rules:
          - id: Bad_Id
            axis: network
            title: One
            value: data_wait_share
            levels: {warning: 0.5, critical: 0.1}
            summary: "x"
            fix: {text: "y"}
          - id: two
            axis: sync
            title: Two
            when: foo_share > __import__
            severity: urgent
            summary: "{nope}"
            fix: {text: "y"}
            colour: red
          - id: three
            axis: sync
        checklist:
          - item: thing
            group: kernels
            value: data_wait_share
            warn: 0.5
            fail: 0.1
        """,
    )
    with pytest.raises(RuleError) as info:
        load_rules(str(tmp_path))
    errors = info.value.errors
    text = "\n".join(errors)
    expected = {
        2: "must be lower-case",
        3: "axis must be one of",
        6: "thresholds must get stricter",
        12: "unknown feature(s) __import__, foo_share",
        13: "severity must be one of",
        14: "summary names {nope}",
        16: "unknown rule key 'colour'",
        17: "rule is missing 'title'",
        24: "fail must be stricter than warn",
    }
    for line, message in expected.items():
        assert any(e.startswith(f"{path}:{line}:") and message in e for e in errors), (line, message, text)
    assert len(errors) >= len(expected)
    lines = [int(e[len(path) + 1 :].split(":")[0]) for e in errors]
    assert lines == sorted(lines)  # in file order


def test_cost_and_fix_template_errors_have_their_lines(tmp_path):
    path = _write(
        tmp_path,
        "fit.yaml",
        """\
        rules:
          - id: one
            axis: sync
            title: One
            cost: data_wait_share * 2
            noise: data_wait_share_noise
            cost_basis: guessed
            suggest:
              rank: 1
              workers: coalesce(loader_num_workers, 0) + spare
            summary: "{workers} workers"
            fix:
              text: "use {workers} workers on {transport}, {cores}"
              snippet: "DataLoader(ds, num_workers={workers})"
              cases:
                - text: no when here
              frameworks:
                keras: {snippet: "x"}
                lightning: {snippet: "{workers}", colour: red}
          - id: two
            axis: sync
            title: Two
            value: data_wait_share
            noise: data_wait_share_noise
            severity: info
            summary: "s"
            fix: {text: "t"}
        """,
    )
    with pytest.raises(RuleError) as info:
        load_rules(str(tmp_path))
    errors = info.value.errors
    expected = {
        7: "cost_basis must be one of measured, estimate, unmeasured",
        9: "suggest name 'rank' must be a new lower_case name",
        10: "suggest.workers: unknown feature(s) spare",
        13: "fix.text names {workers}, {cores}, which is not",
        16: "fix.cases[0] needs a 'when'",
        18: "unknown framework 'keras'",
        19: "has unknown key 'colour'",
        24: "noise needs levels",
    }
    text = "\n".join(errors)
    for line, message in expected.items():
        assert any(e.startswith(f"{path}:{line}:") and message in e for e in errors), (line, message, text)


def test_cost_rules_get_the_default_bands_and_templates_may_name_context_and_suggestions(tmp_path):
    _write(
        tmp_path,
        "ok.yaml",
        """\
        rules:
          - id: fitted
            axis: data_pipeline
            title: Fitted
            cost: data_wait_share
            suggest:
              workers: coalesce(loader_num_workers, 0) + 2
              more: workers * 2
            summary: "{workers} on {framework} ({speedup}x, {cost_share:.0%})"
            fix:
              text: "{more} workers, literal {{braces}}"
              cases:
                - when: more > 100
                  text: "too many"
              frameworks:
                transformers: {snippet: "TrainingArguments(dataloader_num_workers={workers})"}
        """,
    )
    rule = next(r for r in load_rules(str(tmp_path)).rules if r.id == "fitted")
    assert rule.levels == (("info", 0.03), ("warning", 0.10), ("critical", 0.25)) and rule.value == rule.cost
    assert [n for n, _ in rule.suggest] == ["workers", "more"]
    assert set(rule.fix_frameworks) == {"transformers"} and rule.fix_cases[0].text == "too many"


def test_yaml_syntax_error_has_a_line(tmp_path):
    path = _write(tmp_path, "broken.yaml", "rules:\n  - id: x\n    axis: [sync\n")
    with pytest.raises(RuleError) as info:
        load_rules(str(tmp_path))
    assert info.value.errors[0].startswith(f"{path}:")
    assert "not valid YAML" in info.value.errors[0]


def test_explains_must_name_a_known_rule(tmp_path):
    _write(tmp_path, "r.yaml", GOOD_RULE.replace("    fix:", "    explains: [no-such-rule]\n    fix:"))
    with pytest.raises(RuleError, match="explains unknown rule 'no-such-rule'"):
        load_rules(str(tmp_path))


def test_missing_or_empty_rules_dir_is_an_error(tmp_path):
    with pytest.raises(RuleError, match="not a directory"):
        load_rules(str(tmp_path / "absent"))
    with pytest.raises(RuleError, match="no \\*.yaml rule files"):
        load_rules(str(tmp_path))


# ---------------------------------------------------------------- built-ins and extension
def test_builtin_rules_cover_the_matrix():
    ruleset = load_rules()
    ids = {r.id for r in ruleset.rules}
    matrix = {
        "input-bound",
        "pageable-copies",
        "input-path-syncs",
        "exposed-allreduce",
        "straggler",
        "cpu-ops",
        "unused-parameter-scan",
        "graph-breaks",
        "recompiles",
        "fragmentation",
        "alloc-retries",
        "launch-bound",
        "memory-imbalance",
        "blocking-collectives",
        "host-oversubscribed",
        "input-not-measured",
    }
    assert matrix <= ids
    # Every built-in rule that can be measured says what fixing it gives back.
    no_cost = {r.id for r in ruleset.rules if r.cost is None}
    # Fragmentation costs the allocator's retries and device calls where there are any (0 otherwise).
    assert no_cost == {"input-not-measured", "replicated-model-state", "memory-imbalance", "busy-host"}
    assert {r.axis for r in ruleset.rules} == {"data_pipeline", "sync", "parallelism"}
    assert all(r.fix_text and r.summary for r in ruleset.rules)
    assert {c.group for c in ruleset.checklist} == {"graph capture", "memory planning", "kernels"}
    assert len(ruleset.checklist) >= 12


def test_user_rules_add_to_and_override_builtins(tmp_path):
    _write(tmp_path, "mine.yaml", GOOD_RULE)
    override = GOOD_RULE.replace("id: slow-steps", "id: input-bound").replace("axis: sync", "axis: data_pipeline")
    _write(tmp_path, "override.yml", override)
    ruleset = load_rules(str(tmp_path))
    by_id = {r.id: r for r in ruleset.rules}
    assert "slow-steps" in by_id
    assert by_id["input-bound"].levels == (("warning", 1.0), ("critical", 5.0))
    assert by_id["input-bound"].source.endswith("override.yml:3")
    assert len([r for r in ruleset.rules if r.id == "input-bound"]) == 1


def test_parse_rules_raises_when_standalone():
    with pytest.raises(RuleError, match="<string>:1"):
        parse_rules("- just a list\n")


def test_explains_may_carry_a_condition_and_a_bad_one_is_an_error(tmp_path):
    other = GOOD_RULE.replace("id: slow-steps", "id: other").replace("rules:\n", "")
    linked = GOOD_RULE.replace("    fix:", "    explains: [{other: ddp_backend_gloo == 1}]\n    fix:")
    _write(tmp_path, "r.yaml", linked + other)
    rule = next(r for r in load_rules(str(tmp_path)).rules if r.id == "slow-steps")
    assert rule.explains == ("other",) and rule.explains_when["other"].names == {"ddp_backend_gloo"}
    _write(tmp_path, "r.yaml", linked.replace("ddp_backend_gloo == 1", "no_such_feature > 1") + other)
    with pytest.raises(RuleError, match="explains.other: unknown feature"):
        load_rules(str(tmp_path))
    _write(tmp_path, "r.yaml", GOOD_RULE.replace("    fix:", "    explains: {other: 1}\n    fix:") + other)
    with pytest.raises(RuleError, match="explains must be a list"):
        load_rules(str(tmp_path))
