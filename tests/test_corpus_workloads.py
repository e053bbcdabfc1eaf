"""The diagnosis corpus's workloads run and produce readable runs (benchmarks/diagnosis_corpus.py).

Two of the realistic scripts (the DDP tutorial's trainer and the nanoGPT-style trainer), healthy, as
2-rank gloo jobs through the same runner the benchmark uses. What is checked is that each produced a
run ``ranksight diagnose --json`` reads, with both ranks and every step; whether the verdict is right
is the benchmark's business, not a test's. The GPU corpus's launch (one rank per GPU, no
``OMP_NUM_THREADS``) and the scripts' device options are checked without a GPU.
"""

from __future__ import annotations

import importlib.util
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
    for option in ("--device", "--size", "--straggler-rank"):
        assert option in out.stdout
