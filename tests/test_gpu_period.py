"""A GPU rank's step breakdown is read on the GPU stream's clock, not the host's.

The step rows here are shaped like those the H200 runs recorded (``docs/diagnosis.md``): a GPU-bound
job whose host runs ahead of the GPU, so its ~1 ms waits for the loader hide behind queued kernels;
an input-starved one, where the GPU stream idles through the host's wait; and an NCCL-like DDP job,
whose host sees its all-reduce futures complete at enqueue while the GPU waits 12 ms for them. They
go through the agent's own spool writer into a real run directory, then through the real readers.
"""

from __future__ import annotations

import os
import time

import duckdb
import pytest

from ranksight.agent._identity import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import PHASES, ingest, open_run, store_path
from ranksight.collectors._queries import step_breakdown
from ranksight.dashboard import _queries as q
from ranksight.dashboard._rollup import Rollup
from ranksight.rules import diagnose

STEPS = 40
MS = 1e-3


def _rows(shape: dict) -> list[dict]:
    rows = []
    for i in range(STEPS):
        j = 1 + 0.02 * ((i * 7) % 5 - 2)  # deterministic +-4 %, so medians are not degenerate
        host = {k: v * j for k, v in shape["host"].items()}
        gpu = {k: v * j for k, v in shape["gpu"].items()}
        named = sum(host.get(k, 0) for k in ("data_wait_s", "compute_s", "comm_exposed_s", "optimizer_s"))
        rows.append(
            {
                "step": i,
                "time_ns": time.time_ns() + i * 10**7,
                **host,
                "other_s": max(0.0, host["step_s"] - named),
                **gpu,
                "buckets": shape.get("buckets"),
                "bucket_bytes": shape.get("bucket_bytes"),
            }
        )
    return rows


def _write_run(root, name: str, ranks: int, shape: dict, backend: str | None = None) -> str:
    path = os.path.join(str(root), name)
    for rank in range(ranks):
        ident = Identity("gpu-period", name, "n0", rank, rank, ranks, 4000 + rank)
        w = SpoolWriter(path, ident)
        w.write("steps", _rows(shape))
        meta = {**ident.labels(), "status": "finished", "heartbeat_ns": time.time_ns(), "steps": STEPS}
        meta["model"] = {"devices": ["cuda:0"], "parameter_bytes": 10**8, "class": "Net"}
        if backend:
            meta["ddp"] = {"backend": backend, "find_unused_parameters": False, "bucket_cap_bytes": 25 << 20}
        w.write_meta(meta)
    return path


# Host 12 ms a step (1.2 ms of it waiting for the loader); the GPU works 33.7 ms and never idles.
GPU_BOUND = {
    "host": {"step_s": 12 * MS, "data_wait_s": 1.2 * MS, "compute_s": 10 * MS, "optimizer_s": 0.2 * MS},
    "gpu": {
        "gpu_gap_s": 0.002 * MS,
        "gpu_step_s": 33.7 * MS,
        "h2d_s": 0.05 * MS,
        "gpu_compute_s": 33.4 * MS,
        "gpu_optimizer_s": 0.2 * MS,
    },
}
# Host 40 ms a step, 30 ms of it waiting; the GPU idles 30 ms before each step, then keeps pace (10 ms).
STARVED = {
    "host": {"step_s": 40 * MS, "data_wait_s": 30 * MS, "compute_s": 7 * MS, "optimizer_s": 0.5 * MS},
    "gpu": {
        "gpu_gap_s": 30 * MS,
        "gpu_step_s": 10 * MS,
        "h2d_s": 0.2 * MS,
        "gpu_compute_s": 7 * MS,
        "gpu_optimizer_s": 0.5 * MS,
    },
}
# DDP over NCCL: the host's futures complete at enqueue (0.05 ms "exposed"), the GPU waits 12 ms.
NCCL_EXPOSED = {
    "host": {
        "step_s": 30 * MS,
        "data_wait_s": 0.1 * MS,
        "compute_s": 20 * MS,
        "comm_exposed_s": 0.05 * MS,
        "allreduce_s": 0.3 * MS,
        "optimizer_s": 0.5 * MS,
    },
    "gpu": {
        "gpu_gap_s": 0.01 * MS,
        "gpu_step_s": 30 * MS,
        "h2d_s": 0.1 * MS,
        "gpu_compute_s": 17 * MS,
        "gpu_comm_exposed_s": 12 * MS,
        "gpu_optimizer_s": 0.6 * MS,
    },
    "buckets": 4,
    "bucket_bytes": 100 << 20,
}
# NCCL with a metric all_reduce + barrier after optimizer.step(): it holds the stream 3 ms, inside the
# optimizer span the events bound; on the host the barrier blocked 2.5 ms.
NCCL_METRICS = {
    "host": {**NCCL_EXPOSED["host"], "comm_blocked_s": 2.5 * MS},
    "gpu": {**NCCL_EXPOSED["gpu"], "gpu_optimizer_s": 3.6 * MS, "gpu_comm_blocked_s": 3 * MS},
    "buckets": 4,
    "bucket_bytes": 100 << 20,
}
# nanoGPT: the next batch is fetched between forward and backward, 30 ms on the host, inside the step;
# the stream idles 28 ms of it (the agent took that out of gpu_compute_s), nothing before the step.
PREFETCH_STARVED = {
    "host": {"step_s": 42 * MS, "data_wait_s": 30 * MS, "data_wait_in_step_s": 30 * MS, "compute_s": 10 * MS,
             "optimizer_s": 0.5 * MS},
    "gpu": {"gpu_gap_s": 0.01 * MS, "gpu_step_s": 40 * MS, "h2d_s": 0.1 * MS, "gpu_compute_s": 11 * MS,
            "gpu_optimizer_s": 0.5 * MS, "gpu_data_idle_s": 28 * MS},
}  # fmt: skip
# The same prefetch hidden behind queued kernels (the stream never waited), while logging between
# steps leaves the stream idle 5 ms before each step: that gap is not the input's.
PREFETCH_HIDDEN_LOGGING_GAP = {
    "host": {"step_s": 50 * MS, "data_wait_s": 20 * MS, "data_wait_in_step_s": 20 * MS, "compute_s": 25 * MS,
             "optimizer_s": 0.5 * MS},
    "gpu": {"gpu_gap_s": 5 * MS, "gpu_step_s": 50 * MS, "h2d_s": 0.1 * MS, "gpu_compute_s": 49 * MS,
            "gpu_optimizer_s": 0.5 * MS, "gpu_data_idle_s": 0.01 * MS},
}  # fmt: skip
# A CPU rank (no GPU columns) with a metric all_reduce + barrier: 4 ms of a 30 ms step held.
CPU_METRICS = {
    "host": {"step_s": 30 * MS, "data_wait_s": 2 * MS, "compute_s": 20 * MS, "comm_exposed_s": 1 * MS,
             "comm_blocked_s": 4 * MS, "optimizer_s": 1 * MS},
    "gpu": {},
}  # fmt: skip


@pytest.mark.parametrize(
    "shape",
    [GPU_BOUND, STARVED, NCCL_EXPOSED, PREFETCH_STARVED, PREFETCH_HIDDEN_LOGGING_GAP],
    ids=["gpu-bound", "starved", "nccl", "prefetch-starved", "prefetch-hidden"],
)
def test_phases_add_up_to_the_gpu_period_and_rollup_agrees(tmp_path, shape):
    path = _write_run(tmp_path, "run", 2, shape)
    rows = step_breakdown(open_run(path))
    ours = {r["rank"]: r for r in q.breakdown_per_rank(Rollup(path).cursor())}
    for r in rows:
        assert sum(r[f"{p[:-2]}_share"] for p in PHASES) == pytest.approx(1.0, abs=0.01), r
        gpu = shape["gpu"]
        assert r["step_median_s"] == pytest.approx(gpu["gpu_gap_s"] + gpu["gpu_step_s"], rel=0.05)
        for p in PHASES:
            assert ours[r["rank"]][f"{p[:-2]}_share"] == pytest.approx(r[f"{p[:-2]}_share"], rel=1e-9)


def test_a_hidden_loader_wait_is_not_input_bound(tmp_path):
    path = _write_run(tmp_path, "gpu-bound", 2, GPU_BOUND)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] < 0.001  # the GPU never waited for it
    assert row["data_wait_host_share"] == pytest.approx(1.2 / 33.7, rel=0.1)
    assert row["compute_share"] > 0.95
    rules = [f["rule"] for f in diagnose(path)["findings"] if f["severity"] != "info"]
    assert "input-bound" not in rules, rules


def test_an_exposed_loader_wait_is_input_bound(tmp_path):
    path = _write_run(tmp_path, "starved", 2, STARVED)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] == pytest.approx(0.75, abs=0.03)
    first = diagnose(path)["findings"][0]
    assert (first["axis"], first["rule"], first["severity"]) == ("data_pipeline", "input-bound", "critical")


def test_a_prefetch_inside_the_step_counts_what_it_cost_the_stream(tmp_path):
    path = _write_run(tmp_path, "prefetch", 2, PREFETCH_STARVED)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] == pytest.approx(28 / 40, rel=0.05)
    first = diagnose(path)["findings"][0]
    assert (first["rule"], first["severity"]) == ("input-bound", "critical")
    # Hidden behind queued kernels, it costs nothing, and a logging gap before the step is not the input's.
    path = _write_run(tmp_path, "hidden", 2, PREFETCH_HIDDEN_LOGGING_GAP)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] < 0.001
    assert row["other_share"] == pytest.approx(5 / 55, rel=0.1)


def _write_ranks(root, name: str, shapes: list[dict]) -> str:
    """One run whose ranks have shapes of their own (who waits where differs by rank)."""
    path = os.path.join(str(root), name)
    for rank, shape in enumerate(shapes):
        ident = Identity("gpu-period", name, "n0", rank, rank, len(shapes), 4000 + rank)
        w = SpoolWriter(path, ident)
        w.write("steps", _rows(shape))
        meta = {**ident.labels(), "status": "finished", "heartbeat_ns": time.time_ns(), "steps": STEPS}
        meta["model"] = {"devices": ["cuda:0"], "parameter_bytes": 10**8, "class": "Net"}
        meta["ddp"] = {"backend": "nccl", "find_unused_parameters": False, "bucket_cap_bytes": 25 << 20}
        w.write_meta(meta)
    return path


def _waiting(exposed_ms: float, blocked_ms: float) -> dict:
    host = {**NCCL_EXPOSED["host"], "comm_blocked_s": blocked_ms * MS}
    gpu = {**NCCL_EXPOSED["gpu"], "gpu_comm_exposed_s": exposed_ms * MS, "gpu_comm_blocked_s": blocked_ms * MS}
    gpu["gpu_compute_s"] = 30 * MS - exposed_ms * MS - blocked_ms * MS - 0.7 * MS
    return {"host": host, "gpu": gpu, "buckets": 4, "bucket_bytes": 100 << 20}


def test_blocking_collectives_cost_what_every_rank_waits_beyond_ddp(tmp_path):
    """Metric collectives whose waits alternate between ranks (HF on 2 H200s: rank 1 waited in the
    barriers, rank 0 later in DDP's all-reduce): every rank waited 8.5 ms or more a step, 2 ms of it
    DDP's own floor, so the blocking collectives cost 6.5 ms, not the 1.9 ms least blocked time."""
    from ._golden import run_features

    path = _write_ranks(tmp_path, "turns", [_waiting(6.6, 1.9), _waiting(2.0, 7.2)])
    f = run_features(path)[0]
    assert f["comm_floor_share"] == pytest.approx(2.0 / 30, rel=0.05)
    assert f["comm_blocked_floor_share"] == pytest.approx(6.5 / 30, rel=0.05)
    # One rank always last: the floor is its own blocked time, as the least blocked time was.
    path = _write_ranks(tmp_path, "late", [_waiting(6.0, 5.0), _waiting(1.0, 0.5)])
    f = run_features(path)[0]
    assert f["comm_blocked_floor_share"] == pytest.approx(0.5 / 30, rel=0.05)


def test_exposed_allreduce_under_nccl_is_read_on_the_gpu(tmp_path):
    path = _write_run(tmp_path, "nccl", 2, NCCL_EXPOSED, backend="nccl")
    row = step_breakdown(open_run(path))[0]
    assert row["comm_exposed_share"] == pytest.approx(12 / 30, rel=0.05)  # the host alone would say 0.2 %
    result = diagnose(path)
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "exposed-allreduce"), result["findings"]
    # Host-timed all-reduce is meaningless under NCCL: absent, not a made-up overlap of 0.
    assert "comm_overlap" not in first["evidence"] or first["evidence"]["comm_overlap"] is None


def test_a_store_from_before_the_gpu_columns_is_read_and_migrated(tmp_path):
    path = _write_run(tmp_path, "old", 1, STARVED)
    ingest(path)
    with duckdb.connect(store_path(path)) as con:  # what schema version 1 wrote
        for column in ("gpu_gap_s", "gpu_comm_exposed_s", "gpu_optimizer_s"):
            con.execute(f"ALTER TABLE steps DROP COLUMN {column}")
    for f in os.listdir(os.path.join(path, "steps")):
        os.remove(os.path.join(path, "steps", f))  # the store alone holds the rows now
    con = open_run(path)
    assert con.execute("SELECT count(*), count(gpu_gap_s) FROM steps").fetchone() == (STEPS, 0)
    # Without the gap the whole host wait counts, as before the column existed.
    assert step_breakdown(con)[0]["data_wait_share"] == pytest.approx(0.75, abs=0.03)
    ident = Identity("gpu-period", "old", "n0", 0, 0, 1, 5000)
    SpoolWriter(path, ident).write("steps", _rows(STARVED)[:3])
    ingest(path)
    with duckdb.connect(store_path(path), read_only=True) as con:
        assert con.execute("SELECT count(*), count(gpu_gap_s) FROM steps").fetchone() == (STEPS + 3, 3)


@pytest.mark.parametrize(
    "shape",
    [GPU_BOUND, STARVED, NCCL_EXPOSED, NCCL_METRICS, CPU_METRICS, PREFETCH_STARVED, PREFETCH_HIDDEN_LOGGING_GAP],
    ids=["gpu-bound", "starved", "nccl", "nccl-metrics", "cpu-metrics", "prefetch-starved", "prefetch-hidden"],
)
def test_live_metrics_read_the_gpu_clock_like_the_breakdown(tmp_path, shape):
    """What Prometheus and OTLP export (the agent's rollup) agrees with the stored breakdown."""
    from ranksight.agent._rollup import Rollup as MetricRollup

    rows = _rows(shape)
    live = MetricRollup()
    live.update("steps", rows)
    snap = live.snapshot()
    path = _write_run(tmp_path, "run", 1, shape)
    ref = step_breakdown(open_run(path), warmup_steps=0)[0]
    assert snap.step_sum_s / snap.step_count == pytest.approx(ref["step_mean_s"], rel=1e-9)
    assert snap.gauges["ranksight_data_wait_ratio"] == pytest.approx(ref["data_wait_share"], rel=1e-9)
    if "gpu_comm_exposed_s" in shape["gpu"] or "comm_blocked_s" in shape["host"]:
        assert snap.gauges["ranksight_comm_exposed_ratio"] == pytest.approx(ref["comm_exposed_share"], rel=1e-9)
    else:  # no DDP: no all-reduce to expose, so no gauge (the breakdown shows 0 %)
        assert "ranksight_comm_exposed_ratio" not in snap.gauges


def test_gpu_busy_prefers_the_kernel_window_over_nvml_and_nvml_only_past_start_up(tmp_path):
    from ranksight.collectors._features import NVML_STEADY_SAMPLES

    from ._golden import run_features

    path = _write_run(tmp_path, "busy", 1, GPU_BOUND)
    w = SpoolWriter(path, Identity("gpu-period", "busy", "n0", 0, 0, 1, 4000))
    now = time.time_ns()

    def nvml(steps):
        rows = [{"time_ns": now + s, "step": s, "name": "gpu_utilization_ratio", "value": 0.24} for s in steps]
        w.write("samples", rows)

    nvml([1, 2, 3])  # start-up only: NVML's 1 s averages of a young run say nothing of its steady state
    nvml(range(20, 20 + NVML_STEADY_SAMPLES - 1))
    f = run_features(path)[0]
    assert f["gpu_utilization_ratio"] == 0.24 and f["gpu_busy_ratio"] is None
    assert "gpu-starved" not in {x["rule"] for x in diagnose(path)["findings"]}
    nvml([30])  # enough seconds after warm-up: NVML stands in for the window
    assert run_features(path)[0]["gpu_busy_ratio"] == 0.24
    assert "gpu-starved" in {x["rule"] for x in diagnose(path)["findings"]}
    w.write("samples", [{"time_ns": now, "step": 20, "name": "kernel_busy_ratio", "value": 0.84}])
    assert run_features(path)[0]["gpu_busy_ratio"] == 0.84  # the window's exact share wins


def test_rows_from_an_older_agent_read_in_the_dashboard_like_the_breakdown(tmp_path):
    """A segment without the newer GPU columns: the rollup NULLs them (no error) and keeps host comm."""
    import pyarrow.parquet as pq

    path = _write_run(tmp_path, "old", 2, NCCL_EXPOSED)
    for name in os.listdir(os.path.join(path, "steps")):
        f = os.path.join(path, "steps", name)
        old = pq.read_table(f).drop_columns(["gpu_gap_s", "gpu_comm_exposed_s", "gpu_optimizer_s"])
        pq.write_table(old, f)
    ours = q.breakdown_per_rank(Rollup(path).cursor())
    ref = step_breakdown(open_run(path))
    for a, b in zip(ours, ref):
        for p in PHASES:
            assert a[f"{p[:-2]}_share"] == pytest.approx(b[f"{p[:-2]}_share"], rel=1e-9)
        assert b["comm_exposed_share"] == pytest.approx(0.05 / 30.1, rel=0.05)  # the host's figure, kept
