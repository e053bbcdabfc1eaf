"""``ranksight compare --gate`` and ``ranksight baseline`` end to end, on real 2-rank gloo runs with the agent.

A healthy run (A), the same job with a slow input pipeline planted (B: a sleep per batch in the dataset),
and a run too short to decide on. The gate is read through the command line as a CI job would: its exit
code, its one-line reason on stderr, its JSON and its Markdown.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._jobs import Job, run

pytestmark = pytest.mark.slow

RANKSIGHT = [sys.executable, "-m", "ranksight"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    out = str(root / "out")
    base = dict(run_dir=str(root / "runs"), out_dir=out, width=32, depth=1, batch=64)
    healthy = run(Job(run_id="healthy", steps=150, **base))
    # A sleep several times the step: a shared CI machine's load can double a step, never hide this.
    slow = run(Job(run_id="slow-input", steps=150, slow_item_s=0.03, **base))
    short = run(Job(run_id="short", steps=30, **base))
    return root, healthy, slow, short


def _cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(RANKSIGHT + args, cwd=str(cwd), capture_output=True, text=True, timeout=300)


def test_a_planted_input_slowdown_fails_the_gate_and_names_the_data_wait(runs):
    root, healthy, slow, _ = runs
    out = _cli(["compare", healthy, slow, "--gate", "3%", "--json"], root)
    assert out.returncode == 1, out.stderr
    change = json.loads(out.stdout)["change"]
    assert change["status"] == "fail" and change["verdict"] == "slower"
    assert change["job"]["step"]["change"]["low"] > 0.03
    assert change["attribution"][0]["phase"] == "data_wait_s" and change["attribution"][0]["moved"]
    assert [f["what"] for f in change["failed"]] == ["step_time"]
    # Judged on what the phases explain beyond the host's stretch of the step's own work.
    assert change["failed"][0]["interval"] == change["job"]["step"]["explained"]
    assert change["attribution"][0]["excess"]["low"] > 0.03 and change["verdict_reason"] is None
    assert set(change["ranks"]) == {"0", "1"} and all(r["verdict"] == "slower" for r in change["ranks"].values())
    # The phases' parts add up to the change; the table's share change is in points, with no relative column.
    parts = sum(p["contribution"]["point"] for p in change["job"]["phases"].values())
    assert parts == pytest.approx(change["job"]["step"]["change"]["point"], abs=1e-9)
    wait = next(m for m in json.loads(out.stdout)["metrics"] if m["key"] == "data_wait_share")
    assert wait["relative"] is None and wait["delta"] > 0.05
    # A finding that appeared (or, where a busy host put a little data wait in A, grew) accounts for part of it.
    grew = [f for f in change["findings"] if f["rule"] == "input-bound" and f["how"] in ("appeared", "changed")]
    assert grew and (grew[0]["cost_b"] or 0) > (grew[0]["cost_a"] or 0) + 0.05, change["findings"]

    text = _cli(["compare", healthy, slow, "--gate", "3%"], root)
    assert text.returncode == 1
    assert "Gate (step time +3 % at 95 %): FAIL: step time is at least +" in text.stdout
    headline = next(line for line in text.stdout.splitlines() if "(slower):" in line)
    assert headline.split("(slower): ")[1].startswith("data wait +"), headline
    wait_row = next(line for line in text.stdout.splitlines() if line.startswith("data wait share"))
    assert " pp " in wait_row + " " and wait_row.rstrip().endswith("–")


def test_the_faster_direction_and_the_same_run_pass(runs):
    root, healthy, slow, _ = runs
    faster = _cli(["compare", slow, healthy, "--gate", "3%", "--json"], root)
    assert faster.returncode == 0, faster.stderr
    change = json.loads(faster.stdout)["change"]
    assert change["status"] == "pass" and change["verdict"] == "faster" and change["job"]["step"]["change"]["high"] < 0
    same = _cli(["compare", healthy, healthy, "--gate", "3%", "--json"], root)
    change = json.loads(same.stdout)["change"]["job"]["step"]["change"]
    assert same.returncode == 0 and change["point"] == 0.0 and change["low"] < 0 < change["high"]
    # Without --gate the comparison only reports: exit 0 even for a slowdown.
    plain = _cli(["compare", healthy, slow, "--json"], root)
    assert plain.returncode == 0 and json.loads(plain.stdout)["change"]["status"] == "report"


def test_runs_that_cannot_be_compared_exit_2_with_one_line(runs, tmp_path):
    root, healthy, _, short = runs
    out = _cli(["compare", healthy, short, "--gate", "3%"], root)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "cannot compare: too few steps to decide: B (short) keeps" in out.stderr
    as_json = _cli(["compare", healthy, short, "--gate", "3%", "--json"], root)
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["change"]["status"] == "incomparable"
    # A baseline of another world size.
    saved = tmp_path / "base.json"
    assert _cli(["baseline", "save", healthy, str(saved)], root).returncode == 0
    doc = json.loads(saved.read_text())
    doc["world_size"] = 4
    saved.write_text(json.dumps(doc))
    other = _cli(["baseline", "compare", str(saved), healthy, "--gate", "3%"], root)
    assert other.returncode == 2 and "different world sizes: A has 4 ranks, B 2" in other.stderr
    bad = _cli(["compare", healthy, short, "--gate", "three"], root)
    assert bad.returncode == 2 and "not a share" in bad.stderr


def test_a_baseline_file_gates_like_the_run_it_was_saved_from(runs, tmp_path):
    root, healthy, slow, _ = runs
    saved = tmp_path / "healthy.json"
    out = _cli(["baseline", "save", healthy, str(saved)], root)
    assert out.returncode == 0 and str(saved) in out.stdout
    doc = json.loads(saved.read_text())
    assert doc["format"] == "ranksight-baseline" and doc["world_size"] == 2 and set(doc["ranks"]) == {"0", "1"}
    assert doc["ranks"]["0"]["step"][0] == 5 and all(v is None for v in doc["ranks"]["0"]["h2d_s"])
    from_file = _cli(["baseline", "compare", str(saved), slow, "--gate", "3%", "--json"], root)
    from_run = _cli(["compare", healthy, slow, "--gate", "3%", "--json"], root)
    assert from_file.returncode == from_run.returncode == 1
    a, b = json.loads(from_file.stdout), json.loads(from_run.stdout)
    assert a["change"]["job"] == b["change"]["job"] and a["change"]["ranks"] == b["change"]["ranks"]
    assert a["findings"] == b["findings"]
    for ma, mb in zip(a["metrics"], b["metrics"]):  # two diagnoses of one run: equal to the last bits
        assert ma["key"] == mb["key"] and ma["a"] == pytest.approx(mb["a"]) and ma["b"] == pytest.approx(mb["b"])


def test_markdown_and_per_phase_limits_from_pyproject(runs, tmp_path):
    root, healthy, slow, _ = runs
    md = _cli(["compare", healthy, slow, "--gate", "3%", "--markdown"], root)
    assert md.returncode == 1
    assert md.stdout.startswith("### ❌ ranksight: slow-input against healthy")
    assert "| phase | part of the change | interval | beyond the host's stretch | share A | share B |" in md.stdout
    assert "| data wait | +" in md.stdout
    # Per-phase limits in ./pyproject.toml: a data-wait limit far above what was planted, a step-time limit
    # on the command line far above it too: it passes; a tight data-wait limit alone fails it.
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ranksight.gate]\n[tool.ranksight.gate.phases]\ndata_wait = "5000pp"\n'
    )
    loose = _cli(["compare", healthy, slow, "--gate", "5000%", "--json"], tmp_path)
    assert loose.returncode == 0, loose.stderr
    assert json.loads(loose.stdout)["change"]["limits"] == {"step_time": 50.0, "phases": {"data_wait_s": 50.0}}
    (tmp_path / "gate.yaml").write_text("phases:\n  data_wait: 2pp\n")
    tight = _cli(["compare", healthy, slow, "--gate-config", "gate.yaml", "--json"], tmp_path)
    assert tight.returncode == 1
    assert [f["what"] for f in json.loads(tight.stdout)["change"]["failed"]] == ["data_wait_s"]


def test_the_help_documents_the_exit_codes():
    out = subprocess.run(RANKSIGHT + ["compare", "--help"], capture_output=True, text=True, timeout=60)
    assert "exit codes:" in out.stdout and "--markdown" in out.stdout and "--gate LIMIT" in out.stdout
    out = subprocess.run(RANKSIGHT + ["baseline", "compare", "--help"], capture_output=True, text=True, timeout=60)
    assert "exit codes:" in out.stdout and "FILE" in out.stdout
