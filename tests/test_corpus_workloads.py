"""The diagnosis corpus's workloads run and produce readable runs (benchmarks/diagnosis_corpus.py).

Two of the realistic scripts (the DDP tutorial's trainer and the nanoGPT-style trainer), healthy, as
2-rank gloo jobs through the same runner the benchmark uses. What is checked is that each produced a
run ``ranksight diagnose --json`` reads, with both ranks and every step; whether the verdict is right
is the benchmark's business, not a test's. The GPU corpus's launch (one rank per GPU, no
``OMP_NUM_THREADS``) and the scripts' device options are checked without a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")

pytestmark = pytest.mark.slow

STEPS = 12
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _corpus():
    spec = importlib.util.spec_from_file_location(
        "diagnosis_corpus", os.path.join(ROOT, "benchmarks", "diagnosis_corpus.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["ddp_tutorial", "gpt_trainer"])
def test_workload_produces_a_readable_two_rank_run(script, tmp_path):
    corpus = _corpus()
    result = corpus.run_one(script, "none", 0, STEPS, str(tmp_path), timeout=120)
    assert result.status == "ok", f"{result.status}: {result.error_tail}"
    assert result.ranks_reporting == 2, result.breakdown

    report = corpus.diagnose_json(result.run_path, warmup=0)  # every step, warm-up included
    ranks = {row["rank"]: row for row in report["breakdown"]["ranks"]}
    assert sorted(ranks) == [0, 1]
    assert {rank: row["steps"] for rank, row in ranks.items()} == {0: STEPS, 1: STEPS}
    assert all(row["step_median_s"] > 0 for row in ranks.values())
    # the script's own clock saw the same number of optimizer steps on each rank
    assert {rank: t["steps"] for rank, t in result.truth.items()} == {"0": STEPS, "1": STEPS}


def test_cpu_jobs_launch_as_before_and_gpu_jobs_one_rank_per_gpu():
    corpus = _corpus()
    gpt, lightning = corpus.SCRIPTS["gpt_trainer"], corpus.SCRIPTS["lightning_trainer"]
    cpu = corpus.launch_command(gpt, "none", 30, "runs", "r")
    assert cpu[cpu.index("--nproc-per-node") + 1] == "2"
    assert not {"--device", "--size", "--dist-backend", "--straggler-rank"} & set(cpu)
    assert corpus.job_env("t")["OMP_NUM_THREADS"] == "1"

    gpus = corpus.Launch(device="cuda", ranks=4)
    cmd = corpus.launch_command(gpt, "straggler", 30, "runs", "r", launch=gpus)
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4"
    assert cmd[cmd.index("--device") + 1] == "cuda"
    assert "--dist-backend" not in cmd  # the scripts pick NCCL themselves
    assert corpus.job_env("t", device="cuda").get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")
    # Lightning starts its own ranks: told how many GPUs, never given a process-group backend
    smoke = corpus.Launch(device="cuda", ranks=1, dist_backend="gloo", straggler_rank=0)
    cmd = corpus.launch_command(lightning, "straggler", 30, "runs", "r", launch=smoke)
    assert cmd[cmd.index("--devices") + 1] == "1" and "--dist-backend" not in cmd
    assert cmd[cmd.index("--straggler-rank") + 1] == "0"
    cmd = corpus.launch_command(gpt, "none", 30, "runs", "r", launch=smoke)
    assert cmd[cmd.index("--dist-backend") + 1] == "gloo"


@pytest.mark.parametrize("script", ["gpt_trainer", "ddp_tutorial", "hf_trainer", "lightning_trainer"])
def test_every_workload_takes_the_device_options(script):
    if script == "hf_trainer":
        pytest.importorskip("transformers")
    if script == "lightning_trainer":
        pytest.importorskip("lightning")
    import subprocess

    path = os.path.join(ROOT, "benchmarks", "workloads", script + ".py")
    out = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for option in ("--device", "--size", "--straggler-rank", "--fix"):
        assert option in out.stdout


def test_the_gpu_matrix_plans_repeats_per_fault_and_fixes_per_script():
    corpus = _corpus()
    faults = ["none", "pageable", "cpu-ops", "host-sync"]
    plan = corpus.build_plan(
        ["gpt_trainer", "ddp_tutorial"], faults, 1, ["pageable=3"], ["gpt_trainer/cpu-ops", "pageable"]
    )
    faulty = [(s, f) for s, f, _, fixed in plan if not fixed]
    assert ("gpt_trainer", "pageable") not in faulty  # nanoGPT's batches are tokens: nothing to pin
    assert faulty.count(("ddp_tutorial", "pageable")) == 3 and faulty.count(("ddp_tutorial", "none")) == 1
    assert [(s, f) for s, f, _, fixed in plan if fixed] == [("gpt_trainer", "cpu-ops"), ("ddp_tutorial", "pageable")]
    assert plan[-2:] == [("gpt_trainer", "cpu-ops", 0, True), ("ddp_tutorial", "pageable", 0, True)]  # fixes last
    every = corpus.build_plan(["gpt_trainer"], faults, 2, (), [])  # --check-fix alone: every fixable fault
    assert [f for _, f, _, fixed in every if fixed] == ["cpu-ops", "host-sync"]
    with pytest.raises(SystemExit):
        corpus.build_plan(["gpt_trainer"], faults, 1, (), ["none"])  # healthy has nothing to fix
    gpus = corpus.Launch(device="cuda", ranks=1)
    cmd = corpus.launch_command(corpus.SCRIPTS["gpt_trainer"], "cpu-ops", 30, "runs", "r", launch=gpus, fixed=True)
    assert cmd[-1] == "--fix" and "--fix" not in corpus.launch_command(
        corpus.SCRIPTS["gpt_trainer"], "none", 30, "r", "r"
    )


def _run(corpus, fault, fixed, step_s, samples, findings, verdict=None, mean_s=None):
    r = corpus.RunResult("gpt_trainer", fault, 0, "id", "path", expected=corpus.EXPECTED[fault], fixed=fixed)
    truth = {"steps": 30, "step_median_s": step_s, "fault_share": None, "samples_per_step": samples}
    r.truth = {"0": {**truth, **({"step_mean_s": mean_s} if mean_s else {})}}
    r.step_median_s, r.findings = step_s, findings
    r.verdict = verdict or (findings[0]["rule"] if findings else "silent")
    return r


def test_the_fix_check_compares_the_stated_cost_with_the_gain_per_sample():
    corpus = _corpus()
    syncs = [{"rule": "input-path-syncs", "severity": "warning", "cost_share": 0.2, "speedup": 1.25}]
    runs = [
        _run(corpus, "host-sync", False, 0.050, 32, syncs),
        _run(corpus, "host-sync", False, 0.054, 32, [{**syncs[0], "cost_share": 0.3}]),
        _run(corpus, "host-sync", True, 0.040, 32, []),
        # launch-bound's fix raises the batch 16x: the step is 4x longer, each sample 4x cheaper
        _run(corpus, "launch-bound", False, 0.010, 32, [{"rule": "launch-bound", "cost_share": 0.9}]),
        _run(corpus, "launch-bound", True, 0.040, 512, []),
        # fragmentation states no time cost: read as 0, against what expandable segments gave back
        _run(corpus, "fragmentation", False, 0.050, 32, [{"rule": "fragmentation", "cost_share": None}]),
        _run(corpus, "fragmentation", True, 0.049, 32, []),
        _run(corpus, "input", False, 0.1, 32, [{"rule": "input-bound", "cost_share": 0.5}]),  # no fixed run
    ]
    rows = {row["fault"]: row for row in corpus.fix_check(runs)}
    assert sorted(rows) == ["fragmentation", "host-sync", "launch-bound"]
    sync = rows["host-sync"]
    assert sync["cost_share"] == 0.25 and sync["named_first"] == 2 and sync["speedup"] == 1.33
    assert sync["gain_truth"] == pytest.approx(1 - 0.040 / 0.052, abs=1e-4)  # medians: 52 ms before, 40 after
    assert sync["diff_pp"] == pytest.approx((0.25 - sync["gain_truth"]) * 100, abs=0.05) and sync["within"]
    launch = rows["launch-bound"]
    assert launch["gain_truth"] == 0.75 and launch["diff_pp"] == 15.0 and not launch["within"]
    frag = rows["fragmentation"]
    assert frag["cost_share"] == 0.0 and not frag["cost_stated"] and frag["within"]
    text = "\n".join(corpus.fix_check_text(list(rows.values())))
    assert "(none stated)" in text and "+15.0 pp" in text
    # the fixed runs are not scored as misses of their fault
    assert corpus.score(runs)["by_fault"]["host-sync"]["runs"] == 2


def test_the_fix_check_keeps_the_mean_steps_gain_beside_the_median_steps():
    """Slow steps (a window, an eval) in both runs make the median step's gain larger than the mean step's;
    the check is judged on the median and shows the mean beside it."""
    corpus = _corpus()
    wait = [{"rule": "input-bound", "severity": "critical", "cost_share": 0.50, "speedup": 2.0}]
    runs = [
        _run(corpus, "input", False, 0.095, 24, wait, mean_s=0.150),
        _run(corpus, "input", True, 0.043, 24, [], mean_s=0.090),
    ]
    (row,) = corpus.fix_check(runs)
    assert row["gain_truth"] == pytest.approx(1 - 0.043 / 0.095, abs=1e-4)  # 54.7 %
    assert row["gain_truth_mean"] == pytest.approx(0.40, abs=1e-4)
    assert row["diff_pp"] == pytest.approx(-4.7, abs=0.05) and row["within"]
    assert row["diff_pp_mean"] == pytest.approx(10.0, abs=0.05)
    assert "40.0%" in "\n".join(corpus.fix_check_text([row]))


def test_the_truth_summary_gives_the_mean_step_after_warm_up(tmp_path):
    corpus = _corpus()
    ends = [0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 2.0, 2.1]  # after 5 warm-up steps: 0.1 0.1 0.4 0.1
    (tmp_path / "truth-rank0.json").write_text(json.dumps({"rank": 0, "step_ends": ends, "fault_s": [0.0] * 10}))
    t = corpus.truth_summary(str(tmp_path))["0"]
    assert t["step_median_s"] == pytest.approx(0.1) and t["step_mean_s"] == pytest.approx(0.175)
