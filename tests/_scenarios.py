"""Shared by the scenario tests: run one planted-fault demo job and diagnose it."""

from __future__ import annotations

from ranksight.commands.demo_job import DemoConfig, run_demo
from ranksight.rules import diagnose


def run_scenario(tmp_path, fault: str, steps: int = 40) -> dict:
    """Run a real 2-rank demo job with ``fault`` planted and return its diagnosis.

    40 steps by default: in 20, a few seconds in which the host slowed one rank were enough for a
    (real, while it lasted) straggler to outrank the planted fault about once in ten runs."""
    cfg = DemoConfig(fault=fault, ranks=2, steps=steps, run_dir=str(tmp_path), flush_interval_s=0.5)
    return diagnose(run_demo(cfg))


def describe(result: dict) -> list:
    """The findings as short tuples, for assertion messages."""
    return [(f["rule"], f["severity"], f["confidence"], f["ranks"]) for f in result["findings"]]


REAL_STRAGGLER_WORK = 0.5
"""The least share of the wait a straggler caused that its extra thread CPU time must account for, for a
straggler warning to be the truth about a run of this VM (its two vCPUs run the same code at different
speeds in some runs: ``test_scenarios_data.test_healthy_job_gets_no_warning``) rather than a wrong verdict."""


def assert_real_straggler(finding: dict, result: dict) -> None:
    """``finding`` is a straggler that the run's own figures back: its rank had that much more work."""
    assert finding["rule"] == "straggler", describe(result)
    assert finding["evidence"]["straggler_work_explained"] >= REAL_STRAGGLER_WORK, (describe(result), finding)


def past_real_stragglers(result: dict) -> list:
    """The findings after any leading straggler warnings, each of which must be real (``assert_real_straggler``):
    a rank slowed for a whole run costs more than some planted faults' estimate, and rightly comes first."""
    findings = result["findings"]
    while findings and findings[0]["rule"] == "straggler":
        assert_real_straggler(findings[0], result)
        findings = findings[1:]
    return findings
