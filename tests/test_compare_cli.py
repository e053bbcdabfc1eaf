"""``ranksight compare`` on two real demo runs: an input-bound job (A) and the same job healthy (B).

Both are real 2-rank gloo runs with the agent attached; the comparison is read through the CLI, as
JSON and as text, and checked against each run's own diagnosis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

RANKSIGHT = [sys.executable, "-m", "ranksight"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    pytest.importorskip("torch")
    from ranksight.commands.demo_job import DemoConfig, run_demo

    root = tmp_path_factory.mktemp("cmp") / "ranksight-runs"
    a = run_demo(DemoConfig(fault="input", steps=20, run_dir=str(root), run_id="before-input"))
    b = run_demo(DemoConfig(fault="none", steps=20, run_dir=str(root), run_id="after-fix"))
    return root, a, b


def _cli(args: list[str], cwd) -> str:
    out = subprocess.run(RANKSIGHT + args, cwd=str(cwd), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_compare_reports_the_fix_the_way_each_diagnosis_does(two_runs):
    root, a, b = two_runs
    result = json.loads(_cli(["compare", a, b, "--json"], root.parent))
    diag_a = json.loads(_cli(["diagnose", a, "--json"], root.parent))

    assert result["a"]["run"] == diag_a["run"] and result["a"]["ranks"] == result["b"]["ranks"] == 2
    assert result["a"]["steps_per_rank"] == result["b"]["steps_per_rank"] == 15  # 20 steps, 5 warm-up
    metrics = {m["key"]: m for m in result["metrics"]}
    wait = metrics["data_wait_share"]
    assert wait["a"] > 0.15 and wait["b"] < 0.1 and wait["delta"] == pytest.approx(wait["b"] - wait["a"])
    assert metrics["h2d_share"]["a"] is None and metrics["h2d_share"]["b"] is None  # CPU job: absent, not 0
    step = metrics["step_mean_s"]
    assert result["speedup"] == pytest.approx(step["a"] / step["b"])
    assert metrics["throughput_steps_s"]["a"] == pytest.approx(1 / step["a"])

    # The input-bound finding is gone in B, and the comparison carries A's own cost and speedup for it.
    gone = {f["rule"]: f for f in result["findings"]["disappeared"]}
    assert "input-bound" in gone, result["findings"]
    in_a = next(f for f in diag_a["findings"] if f["rule"] == "input-bound")
    assert gone["input-bound"]["cost_share"] == in_a["cost_share"] > 0.1
    assert gone["input-bound"]["speedup"] == in_a["speedup"] > 1.1
    assert all(f["rule"] != "input-bound" for f in result["findings"]["appeared"] + result["findings"]["changed"])


def test_compare_text_leads_with_the_speedup(two_runs):
    root, a, b = two_runs
    result = json.loads(_cli(["compare", a, b, "--json"], root.parent))
    # Bare run ids from the folder that holds ./ranksight-runs: the same comparison.
    text = _cli(["compare", "before-input", "after-fix"], root.parent)
    lines = text.splitlines()
    assert lines[0].startswith("A: before-input  (2 ranks, 15 steps each after warm-up)")
    s = result["speedup"]
    expected = f"B's steps are {s:.2f}× faster than A's" if s >= 1 else f"B's steps are {1 / s:.2f}× slower than A's"
    assert lines[3].startswith(expected), text
    wait_row = next(line for line in lines if line.startswith("data wait share"))
    # A share's change in points, and no relative change of a share (a near-zero share made it thousands of %).
    assert wait_row.rstrip().endswith("–") and " pp " in wait_row + " "
    assert any(line.strip().startswith("gone in B:") and "input-bound" in line for line in lines), text
    assert os.path.basename(a) == "before-input"
