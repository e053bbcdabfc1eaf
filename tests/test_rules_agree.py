"""A finding that rests on a derived figure is held a level down, and says so, where another measure of the same
quantity contradicts it (a rule's ``agree`` checks)."""

from __future__ import annotations

import pytest

from ranksight.rules import RuleError, evaluate, load_rules, parse_rules

from .test_rules_evaluate import HEALTHY, frame


@pytest.fixture(scope="module")
def rules():
    return load_rules().rules


def _first(found: list[dict], rule: str) -> dict:
    return next(f for f in found if f["rule"] == rule)


def test_a_starved_gpu_that_nvml_reads_busy_is_held_down_and_says_why(rules):
    starved = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.9, "gpu_busy_ratio": 0.35, "kernel_busy_ratio": 0.35}
    alone = _first(evaluate(rules, frame(r0={**starved, "gpu_utilization_ratio": 0.4})), "gpu-starved")
    assert alone["severity"] == "critical" and "disagree" not in alone["summary"]
    held = _first(evaluate(rules, frame(r0={**starved, "gpu_utilization_ratio": 1.0})), "gpu-starved")
    assert held["severity"] == "warning"
    assert "NVML reads the GPU busy 100% of the time" in held["summary"]
    assert held["confidence"] < alone["confidence"]
    # Without NVML there is nothing to disagree with.
    none = _first(evaluate(rules, frame(r0={**starved, "gpu_utilization_ratio": None})), "gpu-starved")
    assert none["severity"] == "critical"


def test_launch_bound_idle_that_nvml_does_not_see_is_held_down(rules):
    job = {**HEALTHY, "model_on_gpu": 1, "short_kernel_ratio": 0.6, "kernels_per_step": 900.0}
    job.update(idle_host_wait_ratio=0.5, kernel_busy_ratio=0.5, gpu_busy_ratio=0.5)
    seen = _first(evaluate(rules, frame(r0={**job, "gpu_utilization_ratio": 0.55})), "launch-bound")
    unseen = _first(evaluate(rules, frame(r0={**job, "gpu_utilization_ratio": 0.99})), "launch-bound")
    assert seen["severity"] == "critical" and unseen["severity"] == "warning"
    assert "disagree" in unseen["summary"] and "disagree" not in seen["summary"]


RULE = """
rules:
  - id: demo
    axis: sync
    title: t
    when: step_median_s > 0
    severity: warning
    summary: s
    fix: {text: f}
    agree:
%s
"""


@pytest.mark.parametrize(
    "entry, message",
    [
        ("      - check: step_median_s > 0", "needs a 'check' and a 'says'"),
        ("      - {check: no_such_feature > 0, says: x}", "unknown feature"),
        ("      - {check: step_median_s > 0, says: x, when: y}", "unknown agree key"),
        ("      - {check: step_median_s > 0, says: '{nope}'}", "nope"),
    ],
)
def test_a_malformed_agree_entry_is_one_clear_error(entry, message):
    with pytest.raises(RuleError, match=message):
        parse_rules(RULE % entry)
