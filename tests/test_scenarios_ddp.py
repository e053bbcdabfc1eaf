"""Planted-fault scenarios, end to end: a real 2-rank gloo job with the agent attached, then the diagnosis.

Each scenario asserts the first finding (the root cause to fix first): its axis and rule, and the
ranks where that matters. Faults: graph-break, unused-params. Small step counts keep the file well under a minute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from ._scenarios import describe, past_real_stragglers, run_scenario  # noqa: E402

pytestmark = pytest.mark.slow


def test_data_dependent_branch_and_ragged_batches_are_graph_breaks(tmp_path):
    result = run_scenario(tmp_path, "graph-break")
    first = past_real_stragglers(result)[0]
    assert (first["axis"], first["rule"]) == ("parallelism", "graph-breaks"), describe(result)
    assert first["ranks"] == [0, 1] and first["evidence"]["graph_breaks"] >= 1
    assert "recompiles" in [f["rule"] for f in result["findings"]]
    graph = next(c for c in result["checklist"] if c["item"] == "graph breaks")
    assert graph["status"] in ("warn", "fail")


def test_find_unused_parameters_on_a_fully_used_model(tmp_path):
    result = run_scenario(tmp_path, "unused-params")
    # On this 2-vCPU machine one rank's thread sometimes needs ~30 % more CPU time for the same work for a
    # whole run (its vCPU is slower): a real straggler then costs more than the scan's estimated 2 % and
    # rightly comes first. It must show that extra CPU time; nothing else may outrank the planted fault.
    # The scan's estimated 2 % is hygiene (below the 3 % warning floor): listed with its fix, at info, and
    # nothing else is loud.
    findings = past_real_stragglers(result)
    assert [f["rule"] for f in findings if f["severity"] != "info"] == [], describe(result)
    scan = next((f for f in findings if f["rule"] == "unused-parameter-scan"), None)
    assert scan is not None and scan["axis"] == "parallelism", describe(result)
    assert scan["severity"] == "info" and scan["ranks"] == [0, 1]
    assert scan["evidence"]["unused_parameter_size"] == 0 and scan["evidence"]["ddp_stats_iteration"] > 0
