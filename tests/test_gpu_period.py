"""A GPU rank's step breakdown is read against the GPU's clock as well as the host's.

The step rows here are shaped like those an H200 run recorded (``docs/diagnosis.md``): a GPU-bound
job whose host runs ahead of the GPU, so its ~1 ms waits for the loader are hidden behind queued
kernels, and an input-starved one, where the GPU stream sits idle for the host's wait. They go
through the agent's own spool writer into a real run directory, then through the real readers.
"""

from __future__ import annotations

import os
import time

import duckdb
import pytest

from ranksight.agent._identity import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import PHASES, ingest, open_run, step_breakdown, store_path
from ranksight.dashboard import _queries as q
from ranksight.dashboard._rollup import Rollup
from ranksight.rules import diagnose

STEPS = 40


def _gpu_rows(step_s, data_wait_s, gpu_step_s, gpu_gap_s, compute_s):
    rows = []
    for i in range(STEPS):
        jitter = 1 + 0.02 * ((i * 7) % 5 - 2)  # deterministic +-4 %, so medians are not degenerate
        step = step_s * jitter
        rows.append(
            {
                "step": i,
                "time_ns": time.time_ns() + i * 10**7,
                "step_s": step,
                "data_wait_s": data_wait_s * jitter,
                "h2d_s": 5e-5,
                "compute_s": compute_s * jitter,
                "optimizer_s": 2e-4,
                "other_s": max(0.0, step - data_wait_s * jitter - compute_s * jitter - 2e-4),
                "gpu_compute_s": gpu_step_s * 0.95,
                "gpu_step_s": gpu_step_s,
                "gpu_gap_s": gpu_gap_s,
            }
        )
    return rows


def _write_run(root, name: str, ranks: int, **shape) -> str:
    path = os.path.join(str(root), name)
    for rank in range(ranks):
        ident = Identity("gpu-period", name, "n0", rank, rank, ranks, 4000 + rank)
        w = SpoolWriter(path, ident)
        w.write("steps", _gpu_rows(**shape))
        w.write_meta(
            {
                **ident.labels(),
                "status": "finished",
                "heartbeat_ns": time.time_ns(),
                "steps": STEPS,
                "model": {"devices": ["cuda:0"], "parameter_bytes": 10**8, "class": "Net"},
            }
        )
    return path


# Host 12 ms a step (1.2 ms of it waiting for the loader), GPU 33.7 ms: the host is ahead, nothing idles.
GPU_BOUND = dict(step_s=0.012, data_wait_s=0.0012, gpu_step_s=0.0337, gpu_gap_s=2e-6, compute_s=0.010)
# Host 40 ms a step, 30 ms of it waiting; the GPU works 8 ms and idles 30 ms before each step.
STARVED = dict(step_s=0.040, data_wait_s=0.030, gpu_step_s=0.008, gpu_gap_s=0.030, compute_s=0.007)


@pytest.mark.parametrize("shape", [GPU_BOUND, STARVED], ids=["gpu-bound", "starved"])
def test_phases_add_up_to_the_step_period_and_rollup_agrees(tmp_path, shape):
    path = _write_run(tmp_path, "run", 2, **shape)
    rows = step_breakdown(open_run(path))
    ours = {r["rank"]: r for r in q.breakdown_per_rank(Rollup(path).cursor())}
    for r in rows:
        total = sum(r[f"{p[:-2]}_share"] for p in PHASES)
        assert total == pytest.approx(1.0, abs=0.01), r
        period = max(shape["step_s"], shape["gpu_step_s"] + shape["gpu_gap_s"])
        assert r["step_median_s"] == pytest.approx(period, rel=0.05)
        for p in PHASES:
            assert ours[r["rank"]][f"{p[:-2]}_share"] == pytest.approx(r[f"{p[:-2]}_share"], rel=1e-9)


def test_a_hidden_loader_wait_is_not_input_bound(tmp_path):
    path = _write_run(tmp_path, "gpu-bound", 2, **GPU_BOUND)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] < 0.001  # the GPU never waited for it
    assert row["data_wait_host_share"] == pytest.approx(0.0012 / 0.0337, rel=0.1)
    assert row["gpu_ahead_share"] > 0.6  # GPU-bound: the host finished long before the GPU did
    rules = [f["rule"] for f in diagnose(path)["findings"] if f["severity"] != "info"]
    assert "input-bound" not in rules, rules


def test_an_exposed_loader_wait_is_input_bound(tmp_path):
    path = _write_run(tmp_path, "starved", 2, **STARVED)
    row = step_breakdown(open_run(path))[0]
    assert row["data_wait_share"] == pytest.approx(0.75, abs=0.03)
    first = diagnose(path)["findings"][0]
    assert (first["axis"], first["rule"], first["severity"]) == ("data_pipeline", "input-bound", "critical")


def test_a_store_from_before_gpu_gap_is_read_and_migrated(tmp_path):
    path = _write_run(tmp_path, "old", 1, **STARVED)
    ingest(path)
    with duckdb.connect(store_path(path)) as con:  # what schema version 1 wrote: no gpu_gap_s
        con.execute("ALTER TABLE steps DROP COLUMN gpu_gap_s")
    for f in os.listdir(os.path.join(path, "steps")):
        os.remove(os.path.join(path, "steps", f))  # the store alone holds the rows now
    con = open_run(path)
    assert con.execute("SELECT count(*), count(gpu_gap_s) FROM steps").fetchone() == (STEPS, 0)
    # Without the gap the whole host wait counts, as before the column existed.
    assert step_breakdown(con)[0]["data_wait_share"] == pytest.approx(0.75, abs=0.03)
    ident = Identity("gpu-period", "old", "n0", 0, 0, 1, 5000)
    SpoolWriter(path, ident).write("steps", _gpu_rows(**STARVED)[:3])
    ingest(path)
    with duckdb.connect(store_path(path), read_only=True) as con:
        assert con.execute("SELECT count(*), count(gpu_gap_s) FROM steps").fetchone() == (STEPS + 3, 3)
