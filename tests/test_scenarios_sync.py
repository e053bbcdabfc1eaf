"""Planted-fault scenarios, end to end: a real 2-rank gloo job with the agent attached, then the diagnosis.

Each scenario asserts the first finding (the root cause to fix first): its axis and rule, and the
ranks where that matters. Faults: sync, straggler. Small step counts keep the file well under a minute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from ._scenarios import describe, run_scenario  # noqa: E402

pytestmark = pytest.mark.slow


def test_large_gradients_little_compute_is_exposed_allreduce(tmp_path):
    result = run_scenario(tmp_path, "sync")
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "exposed-allreduce"), describe(result)
    assert first["ranks"] == [0, 1]
    assert first["evidence"]["comm_floor_to_compute"] >= 0.5  # even the rank that waits least


def test_slow_last_rank_is_the_straggler(tmp_path):
    result = run_scenario(tmp_path, "straggler", steps=16)
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "straggler"), describe(result)
    assert first["ranks"] == [1]
    assert first["evidence"]["straggler_score"] < 0.75
    # The fast rank's wait in all-reduce is reported, after its cause.
    rules = [f["rule"] for f in result["findings"]]
    if "exposed-allreduce" in rules:
        assert rules.index("straggler") < rules.index("exposed-allreduce")
