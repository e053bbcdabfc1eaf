"""CPU-testable parts of the GPU signals, on real traces and an allocator snapshot recorded on an H200.

Fixtures (tests/data/gpu/, recorded by benchmarks/gpu_validate.py at d0882b6 on the H200, torch 2.11 / CUDA 13):
``window_{baseline,pageable,cpu_layernorm,item}.json.gz`` are the agent's sampled windows (2 steps of a
small GPT-like model, bf16) with one fault planted each; ``snapshot_fragmented.json.gz`` is a trimmed
``torch.cuda.memory_snapshot()`` after a fragmenting allocation pattern, with the allocator's counters.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from ranksight.agent._allocator import fragmentation_from_snapshot
from ranksight.agent._nvml import nvml_index_for
from ranksight.agent._trace_reduce import events_from_chrome, reduce_window

DATA = Path(__file__).parent / "data" / "gpu"
ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> dict:
    with gzip.open(DATA / name, "rt") as f:
        return json.load(f)


def _truth_module():
    spec = importlib.util.spec_from_file_location("gpu_truth", ROOT / "benchmarks" / "gpu_truth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def windows() -> dict:
    return {
        name: reduce_window(events_from_chrome(_load(f"window_{name}.json.gz")))
        for name in ("baseline", "pageable", "cpu_layernorm", "item")
    }


@pytest.mark.parametrize("name", ["baseline", "pageable", "cpu_layernorm", "item"])
def test_reducer_agrees_with_an_independent_grid_analysis(name, windows):
    """Interval unions vs painting a 100 ns grid from the JSON (flow-linked launches): within 0.5 pp."""
    truth = _truth_module().truth_from_trace(_load(f"window_{name}.json.gz"))
    got = windows[name].samples
    for key in ("compute_kernel_ratio", "comm_kernel_ratio", "memcpy_ratio", "h2d_copy_ratio", "idle_ratio"):
        assert got[key] == pytest.approx(truth[key], abs=0.005), key
    assert windows[name].span_ns * 1e-9 == pytest.approx(truth["span_s"], rel=1e-3)


def test_pageable_loader_shows_as_pageable_copies(windows):
    base, page = windows["baseline"].samples, windows["pageable"].samples
    assert base["h2d_pageable_ratio"] == 0.0
    assert page["h2d_pageable_ratio"] == 1.0
    assert page["h2d_copy_ratio"] > 3 * base["h2d_copy_ratio"]
    # A pageable .to("cuda") blocks the host: one sync per tensor copied (input and target).
    assert page["host_syncs_per_step"] == 2.0
    assert windows["pageable"].sync_sources[0][0].startswith("aten::to")


def test_layernorm_left_on_the_cpu_shows_as_cpu_ops(windows):
    base, cpu_ln = windows["baseline"], windows["cpu_layernorm"]
    assert cpu_ln.samples["cpu_op_ratio"] > 0.05
    assert cpu_ln.samples["cpu_op_ratio"] > 5 * base.samples["cpu_op_ratio"]
    top = [name for name, _ in cpu_ln.cpu_ops_top]
    assert any("layer_norm" in name for name in top[:3])
    assert not any("layer_norm" in name for name, _ in base.cpu_ops_top)


def test_item_in_the_loop_shows_as_one_host_sync_per_step(windows):
    assert windows["baseline"].samples["host_syncs_per_step"] == 0.0
    item = windows["item"]
    assert item.samples["host_syncs_per_step"] == 1.0
    assert item.sync_sources == [("aten::item (cudaStreamSynchronize)", 1.0)]


@pytest.mark.parametrize("which", ["first in the window", "first after the window"])
def test_a_gpu_record_that_starts_before_its_launch_changes_no_window_figure(which, windows):
    """Some CUPTI versions return a later session's first records on another clock, a day early. Kept, such a
    record inside the window stretches the span (a busy GPU reads idle); just after it, it closes the span
    before it opens (no kernel-level reading). Left out and counted, the window reads as without it."""
    from ranksight.trace_reduce import AFTER_MARK

    events = events_from_chrome(_load("window_baseline.json.gz"))
    launch = {e.corr: e for e in events if e.kind == "rt" and e.corr}
    after = min(e.start_ns for e in events if e.kind == "ann" and e.name == AFTER_MARK)
    kernels = sorted(
        (e for e in events if e.kind == "kernel" and e.corr in launch), key=lambda e: launch[e.corr].start_ns
    )
    pick = (
        kernels[0] if which == "first in the window" else next(k for k in kernels if launch[k.corr].start_ns >= after)
    )
    day = 86_400 * 10**9
    bad = [e._replace(start_ns=e.start_ns - day, end_ns=e.end_ns - day) if e is pick else e for e in events]
    clean, got = windows["baseline"], reduce_window(bad)
    assert got.samples["impossible_gpu_records"] == 1.0
    assert "impossible_gpu_records" not in clean.samples
    assert got.span_ns == pytest.approx(clean.span_ns, rel=0.02)
    for key in ("kernel_busy_ratio", "compute_kernel_ratio", "idle_ratio", "h2d_copy_ratio"):
        assert got.samples[key] == pytest.approx(clean.samples[key], abs=0.01), key


def test_an_imported_steps_gpu_figures_leave_out_a_record_that_starts_before_its_launch():
    """``ranksight import`` reads a step's GPU span from its records' first start: one record a day early would
    make a 16 ms step read a day long."""
    from ranksight.importer._trace_reduce_steps import StepSpan, TraceEvent, reduce_step
    from ranksight.trace_reduce import WINDOW_MARK

    events = [TraceEvent(*e) for e in events_from_chrome(_load("window_baseline.json.gz"))]
    mark = min((e for e in events if e.kind == "ann" and e.name == WINDOW_MARK), key=lambda e: e.start_ns)
    span = StepSpan(1, mark.start_ns, mark.end_ns, mark.lane)
    launch = {e.corr: e.start_ns for e in events if e.kind == "rt" and e.corr}
    gpu = [
        e
        for e in events
        if e.kind in ("kernel", "memcpy", "memset") and span.start_ns <= launch.get(e.corr, 0) < span.end_ns
    ]
    host = [
        e for e in events if e.kind not in ("kernel", "memcpy", "memset") and span.start_ns <= e.start_ns < span.end_ns
    ]
    first = min((e for e in gpu if e.kind == "kernel"), key=lambda e: launch[e.corr])
    day = 86_400 * 10**9
    shifted = [e._replace(start_ns=e.start_ns - day, end_ns=e.end_ns - day) if e is first else e for e in gpu]
    clean, got = reduce_step(span, host + gpu, None, 0), reduce_step(span, host + shifted, None, 0)
    assert 0 < clean.step["gpu_step_s"] < 1
    assert got.step["gpu_step_s"] == pytest.approx(clean.step["gpu_step_s"], rel=0.02)
    assert got.step["gpu_compute_s"] == pytest.approx(clean.step["gpu_compute_s"], rel=0.02)
    assert got.samples["impossible_gpu_records"] == 1.0


def test_window_shares_are_well_formed(windows):
    for red in windows.values():
        s = red.samples
        assert red.steps == 2 and s["trace_window_steps"] == 2.0
        for key in ("kernel_busy_ratio", "idle_ratio", "memcpy_ratio", "idle_host_wait_ratio", "short_kernel_ratio"):
            assert 0.0 <= s[key] <= 1.0, key
        assert s["idle_host_wait_ratio"] <= s["idle_ratio"] + 1e-9
        assert s["kernels_per_step"] > 50
        assert 0.0 < s["launch_delay_seconds"] < 0.1
        assert "comm_overlap_ratio" not in s  # no NCCL kernels on one GPU: absent, not zero


def test_window_without_marks_reduces_to_nothing():
    assert reduce_window(events_from_chrome({"traceEvents": []})) is None


def test_fragmentation_of_a_recorded_snapshot_matches_the_allocator_counters():
    snap = _load("snapshot_fragmented.json.gz")
    frag = fragmentation_from_snapshot(snap["segments"], device=0)
    stats = snap["memory_stats"]
    # Free blocks of the snapshot are exactly what the allocator reserves but no tensor holds.
    assert frag["free_bytes"] == stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    assert frag["fragmentation_ratio"] == pytest.approx(1 - frag["largest_free_bytes"] / frag["free_bytes"])
    assert frag["fragmentation_ratio"] > 0.5  # the planted pattern left free memory in pieces
    assert frag["free_blocks"] >= stats["inactive_split.all.current"]
    assert fragmentation_from_snapshot(snap["segments"], device=1) is None  # another GPU: nothing


def test_fragmentation_edge_cases():
    one_free = [
        {"device": 0, "blocks": [{"size": 512, "state": "inactive"}, {"size": 512, "state": "active_allocated"}]}
    ]
    assert fragmentation_from_snapshot(one_free)["fragmentation_ratio"] == 0.0
    assert fragmentation_from_snapshot([{"device": 0, "blocks": [{"size": 8, "state": "active_allocated"}]}]) is None
    halves = [{"device": 0, "blocks": [{"size": 100, "state": "inactive"}, {"size": 100, "state": "inactive"}]}]
    assert fragmentation_from_snapshot(halves)["fragmentation_ratio"] == 0.5


def test_nvml_index_mapping():
    uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]
    assert nvml_index_for(0, "bbbb-2222", uuids, None) == 1  # torch's UUID has no "GPU-" prefix
    assert nvml_index_for(0, None, uuids, "2,0") == 2  # CUDA index 0 is the first visible device
    assert nvml_index_for(1, None, uuids, "2,0") == 0
    assert nvml_index_for(0, None, uuids, "GPU-cccc") == 2  # visible devices given by UUID prefix
    assert nvml_index_for(1, None, uuids, None) == 1


@pytest.fixture()
def monitor(tmp_path, monkeypatch):
    import ranksight

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    mon = ranksight.init(run_dir=str(tmp_path), job="gpu-cpu", run_id="cpu", flush_interval_s=0.2)
    yield mon
    mon.close()


def _read(run_path: str, kind: str) -> list[dict]:
    import pyarrow.parquet as pq

    folder = os.path.join(run_path, kind)
    if not os.path.isdir(folder):
        return []
    return [
        r
        for n in sorted(os.listdir(folder))
        if n.endswith(".parquet")
        for r in pq.read_table(os.path.join(folder, n)).to_pylist()
    ]


def test_nvml_absent_without_a_driver_warns_once(monitor):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("NVML works here; this test is for machines without it")
    except pynvml.NVMLError:
        pass
    from ranksight.agent._nvml import NvmlSampler

    sampler = NvmlSampler(monitor, 0)
    assert sampler() == [] and sampler() == []
    monitor.close()
    warnings = [e for e in _read(monitor.run_path, "events") if e["component"] == "nvml"]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"


def test_cpu_job_has_gpu_signals_absent_not_zero(monitor):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor.watch(model, optimizer=opt)
    for _ in range(5):
        with monitor.step():
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
    monitor.close()
    steps = _read(monitor.run_path, "steps")
    assert len(steps) == 5
    assert all(r["gpu_step_s"] is None and r["gpu_compute_s"] is None and r["h2d_s"] is None for r in steps)
    assert monitor._gpu is None and monitor.errors == {}
    from ranksight.format.schema import SAMPLE_NAMES

    gpu_names = {n for n in SAMPLE_NAMES if n.startswith(("gpu_", "memory_", "kernel", "h2d", "idle"))}
    assert not any(s["name"] in gpu_names for s in _read(monitor.run_path, "samples"))


def test_trace_window_state_machine_on_cpu(monitor):
    """The window starts when due, stops after its steps, backs off under a user's profiler, and reduces."""
    torch = pytest.importorskip("torch")
    from ranksight.agent._events import EV_GPU
    from ranksight.agent._trace_window import TraceWindow, events_from_kineto

    w = TraceWindow(monitor, steps=2, every_steps=6, every_s=0, first_step=2, use_cuda=False)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
    x = torch.randn(8, 64)
    payloads = []

    def run(steps):
        for step in range(steps):
            with monitor.step():
                if w.due(step, time.perf_counter_ns()):
                    w.begin(step)
                model(x).sum().backward()
                if w.state:
                    w.end(step)
            payloads.extend(e[2] for e in list(monitor._events) if e[0] == EV_GPU and e[2] not in payloads)

    run(15)
    # Prepared at step 2, traced 3-4 (+ step 5 while it stops, 6 to measure its cost); 6 steps after the stop
    # prepared at 11, traced 12-13 (+ 14).
    assert w.windows_done == 2
    assert not torch._C._autograd._profiler_enabled()
    _, result, first, last, stop_ns, cost_ns = payloads[0]
    assert (first, last) == (3, 5) and 0 < stop_ns <= cost_ns
    assert events_from_kineto(result) == events_from_kineto(result, use_activity_type=False)
    rows = {r["name"]: r["value"] for r in w.reduce(payloads[0])}
    assert rows["trace_window_steps"] == 2.0 and rows["host_syncs_per_step"] == 0.0
    assert rows["trace_window_cost_seconds"] == cost_ns / 1e9 and rows["trace_window_stop_seconds"] == stop_ns / 1e9
    assert rows["trace_window_reduce_seconds"] > 0
    assert "kernel_busy_ratio" not in rows  # no GPU in the trace: absent, not zero
    assert "trace_window_no_gpu" not in monitor._reporter.reported  # a CPU model: nothing was expected
    w.use_cuda = True  # as if the model were on a GPU whose activity the profiler missed
    w.reduce(payloads[0])
    assert "trace_window_no_gpu" in monitor._reporter.reported  # said once, as a warning event
    w.use_cuda = False

    w.next_step = 0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        run(3)
    assert w.windows_done == 2  # backed off
    assert "trace_window_backoff" in monitor._reporter.reported

    w.next_step = 0
    w.begin(0)
    assert w.state == w.WARMING and not torch._C._autograd._profiler_enabled()
    w.abort()  # prepared only
    assert not torch._C._autograd._profiler_enabled()
    w.next_step = 0
    w.begin(0)
    w.begin(1)
    assert w.state == w.TRACING and torch._C._autograd._profiler_enabled()
    w.abort()  # mid-window
    assert w.state == w.IDLE and not torch._C._autograd._profiler_enabled()
    w.next_step = 0
    w.begin(0)  # prepared; then the user starts a profiler before the window's first step
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        w.begin(1)
        assert w.state == w.IDLE and w._record is None  # backed off, nothing of ours left open
    assert monitor.errors == {}

    # The user's profiler starting mid-window, inside a traced step: ours is dropped first, theirs records.
    # (A CUDA build of torch raised "Can't disable Kineto profiler when it's not running" into their code.)
    w.next_step = 0
    w.begin(0)
    w.begin(1)
    assert w.state == w.TRACING and w._record is not None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        assert w.state == w.IDLE and w._record is None
        model(x).sum().backward()
    w.end(1)  # the step's end after theirs started: nothing of ours left to close
    assert any(e.key.startswith("aten::") for e in theirs.key_averages())
    w.next_step = 0
    w.begin(0)
    w.begin(1)
    with torch.autograd.profiler.profile() as legacy:  # the older API starts the same way
        model(x).sum()
    assert w.state == w.IDLE and len(legacy.function_events) > 0
    assert not torch._C._autograd._profiler_enabled()
    assert w.windows_done == 2 and monitor.errors == {}


def test_a_windows_measured_cost_spaces_the_next_one(monitor):
    """The window measures what it cost the training thread (its steps' time less as many untraced steps)
    and, under a budget, the next window waits until that cost is the budget's share of the time since;
    without a budget only the step and time floors space them."""
    torch = pytest.importorskip("torch")
    from ranksight.agent._events import EV_GPU
    from ranksight.agent._trace_window import TraceWindow

    model = torch.nn.Linear(32, 32)
    x = torch.randn(4, 32)
    extra_s = 0.1  # planted in each traced step, as a profiler slows the steps it records

    def run(w, steps):
        for step in range(steps):
            with monitor.step():
                if w.due(step, time.perf_counter_ns()):
                    w.begin(step)
                model(x).sum().backward()
                time.sleep(0.002 + (extra_s if w.state == w.TRACING else 0.0))
                if w.state:
                    w.end(step)

    spaced = TraceWindow(monitor, steps=2, every_steps=4, every_s=0, first_step=1, use_cuda=False, budget=0.01)
    run(spaced, 7)  # prepared at 1, traced 2-3, stopped at 4, its cost measured at 5
    assert spaced.windows_done == 1 and spaced.state == spaced.IDLE
    assert spaced.last_cost_ns >= 0.5 * 2 * extra_s * 1e9  # the two traced steps' extra time, at least half
    assert spaced.next_ns - time.perf_counter_ns() >= 0.9 * spaced.last_cost_ns / 0.01 - 1e9  # ~20 s away
    run(spaced, 12)
    assert spaced.windows_done == 1  # the step floor passed, the budget's wait did not
    (payload,) = [e[2] for e in list(monitor._events) if e[0] == EV_GPU and e[2][0] == "w"]
    waited_until = spaced.next_ns
    rows = {r["name"]: r["value"] for r in spaced.reduce(payload)}
    # the agent thread's reduction holds the GIL the training thread needs: it counts in the spacing too
    reduce_ns = rows["trace_window_reduce_seconds"] * 1e9
    assert reduce_ns > 0 and spaced.next_ns >= waited_until
    assert spaced.next_ns - time.perf_counter_ns() >= 0.9 * (spaced.last_cost_ns + reduce_ns) / 0.01 - 1e9

    unspaced = TraceWindow(monitor, steps=2, every_steps=4, every_s=0, first_step=1, use_cuda=False)
    run(unspaced, 12)
    assert unspaced.windows_done == 2 and unspaced.last_cost_ns > 0
    assert monitor.errors == {}


def test_the_first_window_waits_for_its_seconds_as_well_as_its_step(monitor):
    """A job shorter than ``first_s`` pays no window: the first one needs both its step and its seconds."""
    pytest.importorskip("torch")
    from ranksight.agent._trace_window import TraceWindow

    now = time.perf_counter_ns()
    waiting = TraceWindow(monitor, first_step=3, first_s=60.0, use_cuda=False)
    assert not waiting.due(3, now) and not waiting.due(10**6, now + 59 * 10**9)
    assert not waiting.due(2, now + 61 * 10**9) and waiting.due(3, now + 61 * 10**9)
    at_step = TraceWindow(monitor, first_step=3, first_s=0.0, use_cuda=False)
    assert not at_step.due(2, now) and at_step.due(3, now)


def test_chrome_events_normalise_times_and_kinds(tmp_path):
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2.0, "tid": 7, "args": {"correlation": 3}},
            {"ph": "X", "cat": "gpu_user_annotation", "name": "ranksight#window", "ts": 0, "dur": 9, "tid": 7},
            {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},
        ]
    }
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(trace, f)
    with gzip.open(p, "rt") as f:
        (ev,) = events_from_chrome(json.load(f))
    assert (ev.kind, ev.start_ns, ev.end_ns, ev.lane, ev.corr) == ("kernel", 1500, 3500, 7, 3)


def test_collate_in_the_main_process_is_input_work_not_cpu_ops():
    """Ops on CPU tensors between traced steps, or inside the DataLoader's next(), are not layers left on the
    CPU: only an op inside a step and outside the loader counts as cpu_op (it read 26 % critical before)."""
    from ranksight.agent._trace_reduce import AFTER_MARK, LOADER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 100 * us, 1, 0),
        Ev("op", "aten::stack", 110 * us, 140 * us, 1, 0),  # collate between the two steps
        Ev("ann", WINDOW_MARK, 150 * us, 250 * us, 1, 0),
        Ev("ann", LOADER_MARK + "#_SingleProcessDataLoaderIter.__next__", 155 * us, 185 * us, 1, 0),
        Ev("op", "aten::stack", 160 * us, 180 * us, 1, 0),  # a fetch inside the step: still the loader's
        Ev("op", "aten::layer_norm", 200 * us, 210 * us, 1, 0),  # a layer left on the CPU
        Ev("op", "aten::mm", 220 * us, 230 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 221 * us, 222 * us, 1, 7),  # launched a kernel: a GPU op
        Ev("kernel", "gemm", 225 * us, 240 * us, 9, 7),
        Ev("ann", AFTER_MARK, 260 * us, 261 * us, 1, 0),
    ]
    red = reduce_window(events, model_on_gpu=True)
    assert red.samples["cpu_op_ratio"] == pytest.approx(10 / 200)  # layer_norm only, over the two steps
    assert red.samples["loader_cpu_op_ratio"] == pytest.approx(20 / 200)
    assert [name for name, _ in red.cpu_ops_top] == ["aten::layer_norm"]


def test_blocking_and_allocator_calls_are_timed_on_the_host(windows):
    """The host's time blocked in syncs and in the allocator's device calls, over the traced steps: a
    recorded `.item()` window has sync time and no allocator call; a synthetic window with a cudaFree and a
    cudaMalloc in each of its two steps has both, at their durations."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    assert windows["baseline"].samples["host_sync_wait_share"] == 0.0
    assert windows["item"].samples["host_sync_wait_share"] > 0.0
    assert windows["item"].samples["alloc_calls_per_step"] == 0.0
    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 100 * us, 1, 0),
        Ev("rt", "cudaFree", 10 * us, 30 * us, 1, 0),
        Ev("rt", "cudaMalloc", 30 * us, 35 * us, 1, 0),
        Ev("ann", WINDOW_MARK, 100 * us, 200 * us, 1, 0),
        Ev("rt", "cudaFree", 110 * us, 130 * us, 1, 0),
        Ev("rt", "cudaMalloc", 130 * us, 135 * us, 1, 0),
        Ev("rt", "cudaStreamSynchronize", 150 * us, 160 * us, 1, 0),
        Ev("ann", AFTER_MARK, 200 * us, 201 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    assert got["alloc_calls_per_step"] == 2.0
    assert got["alloc_call_share"] == pytest.approx(50 / 200)
    assert got["host_sync_wait_share"] == pytest.approx(10 / 200)


def test_a_sync_inside_a_compiled_frame_is_a_graph_breaks_sync():
    """A blocking call inside "Torch-Compiled Region" (the eager code at a break) counts as a compiled
    sync; one outside (logging after the step) does not."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 100 * us, 1, 0),
        Ev("ann", "Torch-Compiled Region: 0/0", 5 * us, 60 * us, 1, 0),
        Ev("rt", "cudaStreamSynchronize", 20 * us, 25 * us, 1, 0),  # `if logits.abs().max() > 1e4:`
        Ev("rt", "cudaStreamSynchronize", 80 * us, 85 * us, 1, 0),  # loss.item() after the step
        Ev("rt", "cudaStreamSynchronize", 30 * us, 31 * us, 2, 0),  # another thread: not inside it
        Ev("ann", AFTER_MARK, 100 * us, 101 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    assert got["host_syncs_per_step"] == 3.0
    assert got["compiled_syncs_per_step"] == 1.0


def test_the_window_tells_a_batch_copys_sync_and_pageable_staging_from_an_item():
    """A blocking ``x.to(device)`` from pageable memory (aten::to around an HtoD copy and its sync) is a copy
    sync, and its host time is pageable staging; an ``.item()`` (aten::item around a DtoH copy and a sync) is
    neither. The aten ops that synced hold 30 + 12 of the 200 µs (not the compiled frame around the item)."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 200 * us, 1, 0),
        Ev("op", "aten::to", 10 * us, 40 * us, 1, 0),
        Ev("rt", "cudaMemcpyAsync", 11 * us, 35 * us, 1, 7),
        Ev("memcpy", "Memcpy HtoD (Pageable -> Device)", 20 * us, 34 * us, 7, 7),
        Ev("rt", "cudaStreamSynchronize", 35 * us, 39 * us, 1, 0),
        Ev("kernel", "gemm", 40 * us, 120 * us, 7, 8),
        Ev("rt", "cudaLaunchKernel", 41 * us, 43 * us, 1, 8),
        Ev("op", "Torch-Compiled Region: 0/0", 90 * us, 150 * us, 1, 0),
        Ev("op", "aten::item", 100 * us, 112 * us, 1, 0),
        Ev("rt", "cudaMemcpyAsync", 101 * us, 103 * us, 1, 9),
        Ev("memcpy", "Memcpy DtoH (Device -> Pageable)", 121 * us, 122 * us, 7, 9),
        Ev("rt", "cudaStreamSynchronize", 103 * us, 111 * us, 1, 0),
        Ev("ann", AFTER_MARK, 200 * us, 201 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    assert got["host_syncs_per_step"] == 2.0
    assert got["copy_syncs_per_step"] == 1.0
    assert got["pageable_copy_host_share"] == pytest.approx(24 / 200)
    assert got["sync_op_share"] == pytest.approx((30 + 12) / 200)


def test_the_window_times_the_gpu_idle_after_a_sync_that_drained_its_queue():
    """A sync called while the GPU runs a 50 µs kernel drains the queue: the GPU then idles 20 µs until the
    next launch reaches it. A second sync, made while the GPU is already idle, drains nothing."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 200 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 1 * us, 3 * us, 1, 1),
        Ev("kernel", "gemm", 10 * us, 60 * us, 7, 1),
        Ev("rt", "cudaStreamSynchronize", 20 * us, 61 * us, 1, 0),  # waits for the gemm
        Ev("rt", "cudaLaunchKernel", 70 * us, 75 * us, 1, 2),
        Ev("kernel", "relu", 80 * us, 90 * us, 7, 2),
        Ev("rt", "cudaStreamSynchronize", 120 * us, 121 * us, 1, 0),  # the GPU idle since 90 µs
        Ev("rt", "cudaLaunchKernel", 130 * us, 132 * us, 1, 3),
        Ev("kernel", "add", 140 * us, 150 * us, 7, 3),
        Ev("ann", AFTER_MARK, 200 * us, 201 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    span = 150 - 10  # the GPU span: first activity to the last
    assert got["sync_drain_idle_share"] == pytest.approx((80 - 60) / span)


def test_an_item_drains_into_the_gap_after_its_own_copy_back():
    """``.item()`` waits for the step's kernels, then for its copy back: the gap it leaves is the one after
    the copy, which lasts until the host launches the next step's first kernel."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 200 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 1 * us, 3 * us, 1, 1),
        Ev("kernel", "gemm", 10 * us, 60 * us, 7, 1),
        Ev("rt", "cudaMemcpyAsync", 20 * us, 21 * us, 1, 2),
        Ev("memcpy", "Memcpy DtoH (Device -> Pageable)", 62 * us, 63 * us, 7, 2),
        Ev("rt", "cudaStreamSynchronize", 21 * us, 64 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 100 * us, 102 * us, 1, 3),
        Ev("kernel", "add", 110 * us, 150 * us, 7, 3),
        Ev("ann", AFTER_MARK, 200 * us, 201 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    assert got["sync_drain_idle_share"] == pytest.approx((110 - 63) / (150 - 10))


def test_an_item_into_pageable_memory_drains_though_its_stream_sync_finds_the_gpu_idle():
    """A pageable ``.item()`` waits inside its copy call; the stream sync after it finds the GPU idle. The
    op around both began while the GPU ran, so the gap after the copy back is the sync's drain. A sync
    whose op began after the GPU went idle drains nothing."""
    from ranksight.agent._trace_reduce import AFTER_MARK, WINDOW_MARK, Ev

    us = 1000
    events = [
        Ev("ann", WINDOW_MARK, 0, 300 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 1 * us, 3 * us, 1, 1),
        Ev("kernel", "gemm", 10 * us, 60 * us, 7, 1),
        Ev("op", "aten::item", 20 * us, 70 * us, 1, 0),
        Ev("rt", "cudaMemcpyAsync", 21 * us, 64 * us, 1, 2),  # blocks: pageable destination
        Ev("memcpy", "Memcpy DtoH (Device -> Pageable)", 62 * us, 63 * us, 7, 2),
        Ev("rt", "cudaStreamSynchronize", 65 * us, 66 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 100 * us, 102 * us, 1, 3),
        Ev("kernel", "add", 110 * us, 150 * us, 7, 3),
        Ev("op", "aten::item", 160 * us, 170 * us, 1, 0),  # the GPU idle since 150 µs
        Ev("rt", "cudaStreamSynchronize", 161 * us, 162 * us, 1, 0),
        Ev("rt", "cudaLaunchKernel", 180 * us, 182 * us, 1, 4),
        Ev("kernel", "mul", 190 * us, 200 * us, 7, 4),
        Ev("ann", AFTER_MARK, 300 * us, 301 * us, 1, 0),
    ]
    got = reduce_window(events, model_on_gpu=True).samples
    assert got["sync_drain_idle_share"] == pytest.approx((110 - 63) / (200 - 10))
