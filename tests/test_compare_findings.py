"""How ``ranksight.dashboard._compare`` sorts findings between two diagnoses: by rule, with their cost."""

from __future__ import annotations

from ranksight.dashboard._compare import CHANGED_COST, compare


def _diag(run: str, step_s: float, findings: list[tuple[str, str, float | None]]) -> dict:
    rows = [
        {"rank": r, "steps": 10, "step_mean_s": step_s, "step_median_s": step_s, "data_wait_share": 0.1,
         "h2d_share": None, "compute_share": 0.7, "comm_exposed_share": 0.1, "optimizer_share": 0.05,
         "other_share": 0.05}
        for r in (0, 1)
    ]  # fmt: skip
    return {
        "run": run,
        "breakdown": {"ranks": rows},
        "findings": [
            {"rule": rule, "severity": sev, "cost_share": cost, "speedup": None if cost is None else 1 / (1 - cost)}
            for rule, sev, cost in findings
        ],
    }


def test_findings_appear_disappear_change_or_stay():
    before = [("input-bound", "critical", 0.4), ("straggler", "info", 0.10), ("busy-host", "info", None)]
    after = [("straggler", "info", 0.10 + CHANGED_COST / 2), ("busy-host", "info", None), ("sync", "info", 0.2)]
    a = _diag("a", 0.2, before + [("sync", "warning", 0.2)])
    b = _diag("b", 0.1, after + [("recompiles", "warning", 0.05), ("recompiles", "info", 0.01)])
    result = compare(a, b)
    found = result["findings"]
    assert [f["rule"] for f in found["disappeared"]] == ["input-bound"]
    assert found["disappeared"][0]["speedup"] == 1 / 0.6
    assert [(f["rule"], f["severity"]) for f in found["appeared"]] == [("recompiles", "warning")]  # first one wins
    assert [f["rule"] for f in found["changed"]] == ["sync"]  # same cost, lower severity
    assert [f["rule"] for f in found["unchanged"]] == ["straggler", "busy-host"]  # within the noise; no cost
    assert result["speedup"] == 2.0
    assert {m["key"]: m for m in result["metrics"]}["step_mean_s"]["relative"] == -0.5


def test_a_cost_raised_by_what_a_finding_explains_says_so_and_shares_move_in_points():
    from ranksight.commands.compare import _explained, render_comparison

    a = _diag("a", 0.2, [("input-bound", "warning", 0.14), ("gpu-starved", "warning", 0.14)])
    a["findings"][1]["explained_by"] = "input-bound"  # input-bound took gpu-starved's higher cost
    b = _diag("b", 0.1, [])
    b["breakdown"]["ranks"][0]["data_wait_share"] = 0.0001
    result = compare(a, b)
    result["explains"] = {"a": _explained(a), "b": _explained(b)}
    text = render_comparison(result)
    assert "gone in B:     input-bound [WARNING], cost in A 14 % with what it explains (gpu-starved)" in text
    assert "gone in B:     gpu-starved [WARNING], cost in A 14 % (up to" in text
    wait = next(line for line in text.splitlines() if line.startswith("data wait share"))
    assert wait.split()[-2:] == ["pp", "–"]  # a near-zero share's change: points, no relative change
