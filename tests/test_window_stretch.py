"""The kernel window's shares as an untraced step shows them, on run folders recorded on one H200.

``tests/data/gpu/h200_corpus_runs.tgz`` holds three runs of benchmarks/diagnosis_corpus.py --device cuda
(benchmarks/results/gpu1_{mix,fix,r3}.runs.tgz): nanoGPT with ``find_unused_parameters=True`` and healthy,
and the DDP tutorial with a slow loader. In the nanoGPT runs the traced steps took 70-460 ms against a
43 ms median (the profiler's own host work), so the windows' kernel-busy shares read 0.12-0.58 while each
window ran ~40 ms of kernels per step: the GPU was ~92 % busy, not starved.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from ranksight.collectors import open_run
from ranksight.rules import diagnose

RUNS = Path(__file__).parent / "data" / "gpu" / "h200_corpus_runs.tgz"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("h200")
    with tarfile.open(RUNS) as tar:
        tar.extractall(out, filter="data")
    return out / "runs"


def features(runs: Path, prefix: str) -> dict:
    (path,) = runs.glob(prefix + "*")
    with open_run(path) as run:
        return run.features()[0]


@pytest.mark.parametrize("prefix", ["gpt_trainer-unused-params-r0", "gpt_trainer-none-r0"])
def test_a_window_stretched_by_the_profiler_reads_the_untraced_steps_busy_share(runs, prefix):
    f = features(runs, prefix)
    assert f["kernel_busy_ratio"] < 0.6  # as the windows measured it over their stretched span
    assert f["window_stretch"] > 1.5
    assert f["window_kernel_s_per_step"] == pytest.approx(0.0398, abs=0.001)
    assert f["gpu_busy_ratio"] == pytest.approx(f["window_kernel_s_per_step"] / f["step_median_s"])
    assert 0.88 < f["gpu_busy_ratio"] < 0.95
    # The idle the windows saw waiting for the host was mostly the profiler's own host time.
    assert f["idle_host_wait_ratio_traced"] > 0.4 and f["idle_host_wait_ratio"] < 0.06


def test_the_stretched_nanogpt_run_is_no_longer_called_gpu_starved(runs):
    (path,) = runs.glob("gpt_trainer-unused-params-r0*")
    findings = diagnose(str(path))["findings"]
    assert findings[0]["rule"] == "unused-parameter-scan"
    assert "gpu-starved" not in {f["rule"] for f in findings}


def test_a_slow_loaders_idle_is_input_bound_not_launch_bound(runs):
    """The GPU idles 79 % waiting for the host, 74 % of the step for the loader: the launches' share of that
    idle is the rest, so input-bound is named first."""
    (path,) = runs.glob("ddp_tutorial-input-r0*")
    findings = diagnose(str(path))["findings"]
    assert findings[0]["rule"] == "input-bound"
    launch = [f for f in findings if f["rule"] == "launch-bound"]
    assert not launch or launch[0]["cost_share"] < 0.1
