"""FSDP2 on two GPUs over NCCL: the demo's exposed-all-gather fault named first, the healthy FSDP2 job
silent. Skipped without 2 CUDA devices (the CPU versions are in test_fsdp_diagnosis.py).

On a GPU the host's times say little (NCCL returns at enqueue); the agent brackets FSDP2's wait for each
all-gather (and an all-gather issued on the compute stream) with CUDA events on the step's stream, and
the FSDP features read the per-step floor of that time across ranks.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ranksight.collectors import open_run  # noqa: E402
from ranksight.commands.demo_job import DemoConfig, run_demo  # noqa: E402
from ranksight.rules import diagnose  # noqa: E402

pytestmark = [
    pytest.mark.requires_cuda,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


def _run(tmp_path, fault: str) -> tuple[str, dict]:
    path = run_demo(DemoConfig(fault=fault, ranks=2, steps=60, run_dir=str(tmp_path), flush_interval_s=0.5))
    return path, diagnose(path)


def _describe(result: dict) -> list:
    return [(f["rule"], f["severity"], f["cost_share"], f["ranks"]) for f in result["findings"]]


@pytest.mark.xfail(
    strict=False,
    reason="on 2 H200s launch-bound (rank 0, cost 0.77) came before exposed-all-gather (0.29): open, see "
    "benchmarks/results/gpu_validation_history.md 'The FSDP2 demo on 2 GPUs'",
)
def test_gpu_fsdp_without_prefetching_is_exposed_all_gather_first(tmp_path):
    path, result = _run(tmp_path, "fsdp-no-prefetch")
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "exposed-all-gather"), _describe(result)
    assert first["ranks"] == [0, 1] and first["severity"] in ("warning", "critical"), _describe(result)
    con = open_run(path)
    # The step's stream waited for the all-gathers issued on it: GPU time, not the host's enqueue time.
    gpu_blocked, rows = con.execute("SELECT sum(gpu_comm_blocked_s), count(*) FROM steps WHERE step >= 5").fetchone()
    assert rows > 0 and gpu_blocked > 0


def test_gpu_healthy_fsdp2_job_is_silent(tmp_path):
    _, result = _run(tmp_path, "fsdp")
    loud = [f for f in result["findings"] if f["severity"] in ("warning", "critical")]
    assert loud == [], _describe(result)
