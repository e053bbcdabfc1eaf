"""The pure parts of benchmarks/gpu_cost.py: rotation, options, ratios, summaries (no timing asserted)."""

from __future__ import annotations

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "gpu_cost.py")
_spec = importlib.util.spec_from_file_location("gpu_cost", _PATH)
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


def test_rotation_puts_every_arm_in_every_position():
    arms = ["none", "a", "b", "c", "d"]
    orders = [gc.rotated(arms, r) for r in range(len(arms))]
    for order in orders:
        assert sorted(order) == sorted(arms)
    for pos in range(len(arms)):
        assert {o[pos] for o in orders} == set(arms)
    assert gc.rotated(arms, 1) == ["a", "b", "c", "d", "none"]


def test_extra_arm():
    name, opts = gc.parse_extra_arm('ranksight_k1={"gpu": {"events_every_steps": 1}}')
    assert (name, opts) == ("ranksight_k1", {"gpu": {"events_every_steps": 1}})
    for bad in ("k1={}", "ranksight", "ranksight_x=[1]", "ranksight={}"):
        with pytest.raises(ValueError):
            gc.parse_extra_arm(bad)


def test_cpus():
    assert gc.parse_cpus("2-4,7, 3") == [2, 3, 4, 7]
    assert gc.default_cpus(list(range(16))) == list(range(2, 10))
    assert gc.default_cpus([0, 1]) == [0, 1]


def test_spread_and_window_mean():
    assert gc.spread([]) == {}
    s = gc.spread([1.02, 0.98, 1.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (1.0, 0.98, 1.02, 3)
    assert "p25" in gc.spread([1, 2, 3, 4])
    samples = [(0.0, 10.0), (1.0, 20.0), (2.0, 30.0), (3.0, 90.0)]
    assert gc.mean_in_window(samples, 0.5, 2.5) == 25.0
    assert gc.mean_in_window(samples, 5, 6) is None


def test_round_ratios_pair_within_rounds():
    runs = [
        {"round": 0, "arm": "none", "mean_step_s": 0.010},
        {"round": 0, "arm": "ranksight", "mean_step_s": 0.0101},
        {"round": 1, "arm": "none", "mean_step_s": 0.020},
        {"round": 1, "arm": "ranksight", "mean_step_s": 0.020},
        {"round": 2, "arm": "ranksight", "mean_step_s": 0.5},  # no baseline in that round: no ratio
    ]
    got = gc.round_ratios(runs)
    assert list(got) == ["ranksight"]
    assert got["ranksight"] == pytest.approx([1.01, 1.0])


def test_plan_helpers():
    assert gc.choose_batch([(1, 0.002), (2, 0.0035), (4, 0.007)], 0.003) == (2, 0.0035)
    assert gc.block_for(0.003) == 100 and gc.block_for(1.0) == 10
    assert gc.steps_for(4.0, 0.003, 100) == 1300
    assert gc.steps_for(0.01, 0.003, 100) == 100
    assert gc.bound(1.0, 3.0) == "GPU" and gc.bound(3.0, 3.0) == "host" and gc.bound(1.0, None) is None


def _run(arm, r, step, warm=1.0, **kw):
    base = {
        "arm": arm,
        "size": "3ms",
        "round": r,
        "mean_step_s": step,
        "warmup_s": warm,
        "warmup_block_s": [warm / 2, warm / 2],
        "block": 100,
        "process_cpu_us_per_step": 1000.0,
        "main_thread_cpu_us_per_step": 900.0,
        "thread_cpu_us_per_step": {"ranksight": 20.0, "other": 5.0} if arm == "ranksight" else {},
        "host_enqueue_s": 0.004,
        "gpu_step_s": 0.003,
        "gpu_util": 80.0,
        "startup_s": 1.0,
        "launch_wall_s": 9.0,
    }
    base.update(kw)
    return base


def test_summary_table_and_verdict():
    runs = [
        _run("none", 0, 0.0030),
        _run("ranksight", 0, 0.00303, warm=1.1, window=[{"one_off_s": 0.1, "window_ran": True, "stop_ms": 30.0}]),
        _run("traceml", 0, 0.0033),
        {"arm": "profiler", "size": "3ms", "round": 0, "error": "missing traceml_ai"},
        _run("none", 1, 0.0031),
        _run("ranksight", 1, 0.0031, warm=1.1),
        _run("traceml", 1, 0.0034),
    ]
    calib = {"3ms": {"target_ms": 3.0, "layers": 1, "batch": 2}}
    summary = gc.summarize(runs, calib)
    arms = summary["3ms"]["arms"]
    assert arms["ranksight"]["ratio"]["median"] == pytest.approx(1.005)
    assert arms["ranksight"]["tool_thread_cpu_us"] == 20.0
    assert arms["ranksight"]["window_one_off_s"]["median"] == pytest.approx(0.1)
    assert arms["ranksight"]["warmup_extra_s"]["n"] == 2
    assert arms["ranksight"]["bound"] == "host"
    assert arms["profiler"]["runs"] == 0 and arms["profiler"]["errors"]
    text = gc.table(summary)
    assert "not run: missing traceml_ai" in text and "| 3ms (L1, b2) | ranksight | 2 |" in text
    lines = gc.verdict(summary)
    assert lines == ["3ms: ranksight 1.0050; goal <= 1.01: met; TraceML 1.0984: not above"]
