"""The diagnosis corpus's workloads run and produce readable runs (benchmarks/diagnosis_corpus.py).

Two of the realistic scripts (the DDP tutorial's trainer and the nanoGPT-style trainer), healthy, as
2-rank gloo jobs through the same runner the benchmark uses. What is checked is that each produced a
run ``ranksight diagnose --json`` reads, with both ranks and every step; whether the verdict is right
is the benchmark's business, not a test's.
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
