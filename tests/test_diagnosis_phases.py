"""The step phases with blocking collectives (host and GPU clocks), and who waits for whom on the GPU's clock.

Rows go through real Parquet segments and the real DuckDB views, shaped as the agent writes them: on a
CPU rank the agent leaves blocked time out of compute and other; on a GPU rank the CUDA events do not.
"""

from __future__ import annotations

import json
import os

import pytest

from ranksight.collectors import PHASES, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.rules import diagnose

from ._golden import run_features
from .test_diagnose import _identity, _write

MS = 1e-3


def _run(tmp_path, rows_of_rank, backend="gloo", on_gpu=False) -> str:
    run = str(tmp_path / "run-1")
    os.makedirs(os.path.join(run, "ranks"), exist_ok=True)
    world = len(rows_of_rank)
    for rank, rows in enumerate(rows_of_rank):
        _write(run, "steps", rank, [{"step": i, "time_ns": 10**18 + i * 10**8, **r} for i, r in enumerate(rows)], world)
        meta = {**_identity(rank, world), "status": "finished", "heartbeat_ns": 1, "steps": len(rows)}
        meta["ddp"] = {"backend": backend, "find_unused_parameters": False, "bucket_cap_bytes": 25 << 20}
        meta["model"] = {"parameter_bytes": 1 << 20, "devices": ["cuda:0" if on_gpu else "cpu"], "class": "Net"}
        with open(os.path.join(run, "ranks", f"rank-{rank:05d}.json"), "w") as f:
            json.dump(meta, f)
    return run


def _shares(row) -> dict:
    return {p: row[f"{p[:-2]}_share"] for p in PHASES}


def test_cpu_comm_phase_adds_the_blocked_collectives_the_agent_took_out_of_the_rest(tmp_path):
    # 100 ms: 60 compute, 10 DDP exposed, 20 blocked in a metric all-reduce and a barrier, 8 other, 2 optimizer.
    row = {"step_s": 0.1, "data_wait_s": 0.0, "compute_s": 0.06, "comm_exposed_s": 0.01, "comm_blocked_s": 0.02,
           "collectives": 2, "collective_bytes": 4, "optimizer_s": 0.002, "other_s": 0.008, "buckets": 1,
           "bucket_bytes": 1 << 20}  # fmt: skip
    shares = _shares(step_breakdown(open_run(_run(tmp_path, [[row] * 30])))[0])
    assert shares["comm_exposed_s"] == pytest.approx(0.3) and shares["compute_s"] == pytest.approx(0.6)
    assert shares["other_s"] == pytest.approx(0.08) and shares["h2d_s"] is None
    assert sum(v for v in shares.values() if v is not None) == pytest.approx(1.0)


def test_gpu_blocked_time_is_carved_out_of_the_spans_that_hold_it(tmp_path):
    # GPU period 30 ms; a 6 ms metric all-reduce after optimizer.step() lies inside gpu_optimizer_s (8 ms).
    row = {"step_s": 0.012, "data_wait_s": None, "compute_s": 0.01, "optimizer_s": 0.001, "other_s": 0.0,
           "gpu_gap_s": 0.0005, "gpu_step_s": 0.0295, "h2d_s": 0.0005, "gpu_compute_s": 0.018,
           "gpu_comm_exposed_s": 0.002, "gpu_optimizer_s": 0.008, "gpu_comm_blocked_s": 0.006,
           "comm_blocked_s": 0.0001, "buckets": 1, "bucket_bytes": 1 << 20}  # fmt: skip
    run = _run(tmp_path, [[row] * 30], backend="nccl", on_gpu=True)
    shares = _shares(step_breakdown(open_run(run))[0])
    assert shares["data_wait_s"] is None  # not measured: NULL, not 0
    assert shares["comm_exposed_s"] == pytest.approx((2 + 6) / 30)
    # The unexplained remainder (30 - 28.5 = 1.5 ms) gives its part first, the optimizer span the rest.
    assert shares["optimizer_s"] == pytest.approx((8 - (6 - 1.5)) / 30)
    assert shares["other_s"] == pytest.approx(0.0) and shares["compute_s"] == pytest.approx(18 / 30)
    assert sum(v for v in shares.values() if v is not None) == pytest.approx(1.0)
    f = run_features(run)[0]
    assert f["comm_blocked_share"] == pytest.approx(6 / 30) and f["grad_comm_share"] == pytest.approx(2 / 30)
    assert f["data_measured"] == 0 and f["ranks_data_measured"] == 0


def test_on_gpus_the_late_rank_is_found_on_the_gpu_clock(tmp_path):
    """NCCL: the host's futures complete at enqueue, so host comm says nothing; the GPU's waits tell."""

    def row(gpu_compute, gpu_wait, host_compute):
        return {"step_s": 0.05, "data_wait_s": 0.0, "compute_s": host_compute, "comm_exposed_s": 0.0001,
                "optimizer_s": 0.001, "other_s": 0.0, "gpu_gap_s": 0.0, "gpu_step_s": 0.05, "h2d_s": 0.0005,
                "gpu_compute_s": gpu_compute, "gpu_comm_exposed_s": gpu_wait, "gpu_optimizer_s": 0.001,
                "buckets": 4, "bucket_bytes": 100 << 20}  # fmt: skip

    # Rank 1 computes 46 ms on the GPU, rank 0 37 ms and waits 9 ms; on the host both look alike.
    fast = [row(0.037 * (1 + 0.01 * (i % 3)), 0.009, 0.02) for i in range(30)]
    slow = [row(0.046 * (1 + 0.01 * (i % 3)), 0.0003, 0.02) for i in range(30)]
    run = _run(tmp_path, [fast, slow], backend="nccl", on_gpu=True)
    feats = run_features(run)
    assert feats[1]["least_wait_step_share"] == 1.0
    assert feats[1]["straggler_cost_share"] == pytest.approx((9 - 0.3) / 50.5, rel=0.05)
    first = diagnose(run)["findings"][0]
    assert (first["rule"], first["ranks"], first["severity"]) == ("straggler", [1], "warning")
