"""``ranksight import`` on a real CUDA trace: pageable copies and a host sync per step read as the agent reads them.

Skipped without CUDA (CPU CI); run on the H200 with the other GPU tests (docs/gpu-validation.md).
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ijson")

pytestmark = [
    pytest.mark.requires_cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    folder = os.path.join(ROOT, "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("import_trace")


def test_gpu_trace_gives_the_agents_first_finding_and_phases(tmp_path):
    r = _bench().paired("pageable-sync", "cuda", str(tmp_path), active=8)
    assert r["agent_first"] is not None and r["import_first"] is not None
    assert r["import_first"]["rule"] == r["agent_first"]["rule"], (r["agent_first"], r["import_first"])
    assert r["max_diff_pp"] <= 3.0, r["ranks"]
    h2d = r["ranks"][0]["h2d_s"]
    assert h2d["import"] is not None and h2d["import"] > 0.01  # the pageable copies are seen on the GPU


def test_gpu_trace_samples_name_pageable_copies_and_host_syncs(tmp_path):
    import duckdb

    bench = _bench()
    r = bench.paired("pageable-sync", "cuda", str(tmp_path), active=4)
    run = os.path.join(str(tmp_path), "imported", "import-pageable-sync")
    glob = os.path.join(run, "samples", "*.parquet")
    values = dict(duckdb.sql(f"SELECT name, median(value) FROM read_parquet('{glob}') GROUP BY name").fetchall())
    assert values["h2d_pageable_ratio"] > 0.9
    assert values["host_syncs_per_step"] >= 1
    assert values["kernels_per_step"] > 10
    assert r["problems"] == []
