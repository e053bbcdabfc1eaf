"""Planted-fault scenarios, end to end: a real 2-rank gloo job with the agent attached, then the diagnosis.

Each scenario asserts the first finding (the root cause to fix first): its axis and rule, and the
ranks where that matters. Faults: sync, straggler, straggler30, blocking. Small step counts keep the file
around a minute.
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
    assert first["ranks"] == [0, 1] and first["severity"] in ("warning", "critical")
    ev = first["evidence"]
    # Classed by bytes: 57 MB take longer on the wire than the round trips, even on the rank that waits least.
    assert ev["allreduce_wire_s"] > ev["allreduce_latency_s"] and ev["comm_floor_share"] >= 0.1
    assert "bucket_cap_mb=" in first["fix"]["snippet"] and "bucket_cap_mb=25," not in first["fix"]["snippet"]


def test_slow_last_rank_is_the_straggler(tmp_path):
    result = run_scenario(tmp_path, "straggler", steps=16)
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "straggler"), describe(result)
    assert first["ranks"] == [1] and first["severity"] == "critical"
    assert first["evidence"]["least_wait_step_share"] >= 0.8 and first["cost_share"] >= 0.25
    # The fast rank's wait at the all-reduce is the straggler's cost, not a sync problem of its own.
    assert "exposed-allreduce" not in [f["rule"] for f in result["findings"]]


def test_a_rank_thirty_percent_slower_is_a_warning_naming_it(tmp_path):
    """The known failure: a rank ~35 % slower got only info, because compute ratios missed it."""
    result = run_scenario(tmp_path, "straggler30")  # 40 steps: a few seconds of a loaded host do not outvote it
    first = result["findings"][0]
    assert (first["axis"], first["rule"], first["ranks"]) == ("sync", "straggler", [1]), describe(result)
    assert first["severity"] in ("warning", "critical") and first["cost_share"] >= 0.1
    assert "rank 1" in first["summary"]


def test_metric_all_reduce_and_barrier_every_step_are_blocking_collectives(tmp_path):
    result = run_scenario(tmp_path, "blocking")
    found = {f["rule"]: f for f in result["findings"]}
    assert "blocking-collectives" in found, describe(result)
    f = found["blocking-collectives"]
    # Three metric all-reduces, an all_gather_object and a barrier per step (the gradient buckets are not counted).
    assert f["ranks"] == [0, 1] and f["evidence"]["collectives_per_step"] == 5
    assert "all_reduce x3.0/step (user)" in f["summary"] and "barrier x1.0/step (user)" in f["summary"]
    assert f["severity"] in ("warning", "critical") and f["cost_share"] >= 0.1
    assert "async_op=True" in f["fix"]["snippet"]
