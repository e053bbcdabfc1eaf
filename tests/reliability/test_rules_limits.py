"""A hostile or broken rule file is a clear ``file:line: what`` error, never a traceback, a stack overflow or
hundreds of megabytes of output; a figure a rule cannot compute with is unknown, never an exception."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ranksight.rules import ExprError, Rule, RuleError, evaluate, load_rules, parse, parse_rules

RULE = """rules:
  - id: {id}
    axis: sync
    title: A rule from a user
    value: {value}
    levels: {{warning: 1}}
    summary: "{summary}"
    fix: {{text: Look at the steps.}}
"""


def _rule_file(folder, text: str | bytes, name: str = "mine.yaml") -> str:
    folder.mkdir(exist_ok=True)
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(folder)


def _check(rules_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ranksight", "rules", "check", rules_dir],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_rule_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    text = RULE.format(id="cafe", value="step_median_s", summary="slow").encode()
    text = text.replace(b"A rule", b"A r\xe9gle")  # Latin-1, as an old editor saves it
    folder = _rule_file(tmp_path / "rules", text)
    with pytest.raises(RuleError) as err:
        load_rules(folder)
    offset = text.index(b"\xe9")
    assert err.value.errors == [
        f"{os.path.join(folder, 'mine.yaml')}:4: not UTF-8 (byte 0xe9 at offset {offset}); save it as UTF-8"
    ]
    out = _check(folder)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "mine.yaml:4: not UTF-8" in out.stderr


def test_an_expression_of_200k_terms_is_refused_by_length_quickly(tmp_path):
    value = "+".join(["step_median_s"] * 200_000)
    folder = _rule_file(tmp_path / "rules", RULE.format(id="long", value=value, summary="s"))
    started = time.perf_counter()
    with pytest.raises(RuleError) as err:
        load_rules(folder)
    assert time.perf_counter() - started < 30  # it was a RecursionError after a long parse
    (error,) = err.value.errors
    assert error.endswith(":5: rule 'long': value: expression is 2,799,999 characters long; the limit is 10,000")


@pytest.mark.parametrize(
    "text",
    [
        "+".join(["x"] * 2_000),  # a left-deep chain of 1,999 additions
        "-" * 5_000 + "x",  # unary minus, nested
        "not " * 1_000 + "x",
        "min(" * 150 + "x" + ")" * 150,
    ],
    ids=["additions", "negations", "nots", "calls"],
)
def test_deep_nesting_under_the_length_limit_is_refused_by_depth(text):
    with pytest.raises(ExprError, match="nests more than 100 levels deep"):
        parse(text)


def test_an_expression_at_the_limits_still_parses_and_evaluates():
    text = "+".join(["x"] * 100)  # 100 terms: 99 nested additions, 199 characters
    assert parse(text).names == {"x"}
    from ranksight.rules._expr import evaluate as evaluate_expr

    assert evaluate_expr(parse(text), {"x": 1}) == 100


def test_yaml_nested_too_deeply_is_an_error_not_a_recursion_error(tmp_path):
    folder = _rule_file(tmp_path / "rules", "rules: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(RuleError, match="YAML nested too deeply"):
        load_rules(folder)


@pytest.mark.parametrize(
    "summary, problem",
    [
        ("{value:>300000000}", "asks for a width or precision of 300,000,000; the limit is 200"),
        ("{value:.100000f}", "asks for a width or precision of 100,000; the limit is 200"),
        ("{value:>{steps}}", "takes its format from another field"),
        ("{value:0>" + "9" * 5000 + "}", "asks for a width or precision of over a trillion"),
    ],
    ids=["width", "precision", "nested field", "5000-digit width"],
)
def test_a_summary_format_over_the_limits_is_refused_at_load_time_with_its_line(tmp_path, summary, problem):
    folder = _rule_file(tmp_path / "rules", RULE.format(id="wide", value="step_median_s", summary=summary))
    with pytest.raises(RuleError) as err:
        load_rules(folder)
    (error,) = err.value.errors
    assert error.startswith(f"{os.path.join(folder, 'mine.yaml')}:7: rule 'wide': summary template: {{value:")
    assert problem in error and "\n" not in error


def test_formats_within_the_limits_still_load(tmp_path):
    summary = "{value:>12.3f} {value:,.1f} {value:.0%} {value:g} {ranks:<200}"
    ruleset = parse_rules(RULE.format(id="fine", value="step_median_s", summary=summary))
    assert [r.id for r in ruleset.rules] == ["fine"]


def _fired(rule: Rule, features: dict) -> list[dict]:
    base = {"rank": 0, "steps": 40, "step_median_s": 2.0}
    return evaluate([rule], {0: {**base, **features}})


def test_a_rule_built_in_code_cannot_print_an_unbounded_summary():
    """The loader refuses such a template; one that reaches the evaluator another way prints plainly."""
    (loaded,) = parse_rules(RULE.format(id="code", value="step_median_s", summary="s")).rules
    from dataclasses import replace

    rule = replace(loaded, summary="median {value:>300000000} and {value:.3f} s")
    (finding,) = _fired(rule, {})
    assert finding["summary"] == "median 2.0 and 2.000 s"


@pytest.mark.parametrize(
    "value", ["floor(step_median_s * 1e308 * 10)", "round(step_median_s * 1e308 * 10)", "ceil(step_median_s - nan_s)"]
)
def test_a_value_a_function_cannot_take_is_unknown_not_an_exception(value):
    """floor / round / ceil of an infinity or a NaN raise in Python: in a rule the value is unknown."""
    (loaded,) = parse_rules(RULE.format(id="inf", value="step_median_s", summary="s")).rules
    from dataclasses import replace

    rule = replace(loaded, value=parse(value))
    assert _fired(rule, {"nan_s": float("nan")}) == []
