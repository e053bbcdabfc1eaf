"""The kernel window is reduced in a child process: the same figures as on the agent thread, from a real
profiler result and from the H200 window of tests/data/gpu, and a failing child falls back to the agent thread."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from ranksight.agent._trace_reduce import events_from_chrome, reduce_file_in_child, reduce_window

WINDOW = os.path.join(os.path.dirname(__file__), "data", "gpu", "window_baseline.json.gz")


def test_the_child_reduces_a_gpu_window_as_the_agent_thread_does(tmp_path):
    with gzip.open(WINDOW, "rt") as f:
        trace = json.load(f)
    path = tmp_path / "window.json"
    path.write_text(json.dumps(trace))
    here = reduce_window(events_from_chrome(trace), model_on_gpu=True)
    there = reduce_file_in_child(str(path), True)
    assert here is not None and there == here
    assert there.samples["kernel_busy_ratio"] > 0


def _traced_window(monitor, reduce_in_child: bool) -> list[dict]:
    import torch

    from ranksight.agent._events import EV_GPU
    from ranksight.agent._trace_window import TraceWindow

    w = TraceWindow(monitor, steps=2, every_steps=100, every_s=0, first_step=1, use_cuda=False)
    w.reduce_in_child = reduce_in_child
    model, x = torch.nn.Linear(16, 16), torch.randn(4, 16)
    for step in range(6):
        with monitor.step():
            if w.due(step, 0):
                w.begin(step)
            model(x).sum().backward()
            if w.state:
                w.end(step)
    (payload,) = [e[2] for e in list(monitor._events) if e[0] == EV_GPU and e[2][0] == "w"]
    return w.reduce(payload)


@pytest.fixture
def monitor(tmp_path):
    import ranksight

    mon = ranksight.init(run_dir=str(tmp_path), job="child", run_id="child", flush_interval_s=600)
    yield mon
    mon.close()


def test_a_profiler_results_window_reads_the_same_in_the_child(monitor):
    pytest.importorskip("torch")
    timing = ("trace_window_stop_seconds", "trace_window_cost_seconds", "trace_window_reduce_seconds")
    child = {r["name"]: r["value"] for r in _traced_window(monitor, True) if r["name"] not in timing}
    monitor._events.clear()
    here = {r["name"]: r["value"] for r in _traced_window(monitor, False) if r["name"] not in timing}
    assert child["trace_window_steps"] == 2 and set(child) == set(here)
    assert monitor.errors == {}


def test_a_child_that_cannot_run_falls_back_to_the_agent_thread(monitor, monkeypatch):
    pytest.importorskip("torch")
    import sys

    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    rows = {r["name"]: r["value"] for r in _traced_window(monitor, True)}
    assert rows["trace_window_steps"] == 2  # reduced here after all
    warnings = [e for e in list(monitor._events) if e[1] == "warning" and e[2][0] == "trace_window_child"]
    assert len(warnings) == 1
