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
