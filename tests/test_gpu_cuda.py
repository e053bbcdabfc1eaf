"""GPU signals on a real CUDA device: sync-free hot path, GPU columns, the sampled window, back-off.

Skipped without CUDA (CPU CI); run on the H200 via the device tools (see docs/gpu-validation.md).
"""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.requires_cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256)
    ).cuda()


def _read(run_path, kind):
    import pyarrow.parquet as pq

    folder = os.path.join(run_path, kind)
    rows = []
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".parquet"):
                rows.extend(pq.read_table(os.path.join(folder, name)).to_pylist())
    return rows


def _train(mon, model, opt, steps, x, y, fetch=False):
    for _ in range(steps):
        with mon.step():
            loss = torch.nn.functional.mse_loss(model(x), y)
            if fetch:  # a nanoGPT-style prefetch between forward and backward: the in-step data events
                with mon.data():
                    x = x + 0
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)


@pytest.fixture()
def monitor(tmp_path, monkeypatch):
    import ranksight

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    mons = []

    def make(**opts):
        # CUPTI kept attached (detach_cupti off) unless a test says otherwise: once a window detached it, a
        # profiler started later in this process recorded no GPU kernel (test_a_profiler_the_user_starts...)
        opts.setdefault("detach_cupti", False)
        opts.setdefault("trace_first_s", 0.0)  # the windows at the steps each test names
        mon = ranksight.init(
            run_dir=str(tmp_path), job="gpu-test", run_id=f"t{len(mons)}", flush_interval_s=0.3, gpu=opts
        )
        mons.append(mon)
        return mon

    yield make
    for m in mons:
        m.close()


def test_monitored_steps_never_sync_the_device(monitor):
    """Under sync debug mode "error", a monitored loop with a sampled window raises nothing."""
    mon = monitor(
        trace_first_step=3,
        trace_steps=2,
        trace_every_steps=10,
        trace_every_s=0,
        trace_budget=None,
        allocator_every_s=0.1,
        snapshot_every_s=0.1,
    )
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    _train(mon, model, opt, 2, x, y)  # warm-up outside the checked region (lazy init may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _train(mon, model, opt, 30, x, y, fetch=True)  # two windows: steps 3-4 and ~15-16
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert mon._gpu.window.windows_done >= 2
    mon.close()
    assert mon.errors == {}
    steps = _read(mon.run_path, "steps")
    assert len(steps) == 32
    resolved = [r for r in steps if r["gpu_step_s"] is not None]
    assert len(resolved) >= 28  # the last step or two may be dropped, never waited for
    for r in resolved:
        assert r["gpu_step_s"] > 0
        assert 0 <= r["h2d_s"] <= r["gpu_step_s"] * 1.01
        assert 0 < r["gpu_compute_s"] <= r["gpu_step_s"] * 1.01
    assert sum(r["gpu_data_idle_s"] is not None for r in resolved) >= 28 - 2  # the 2 warm-up steps fetch nothing
    names = {s["name"] for s in _read(mon.run_path, "samples")}
    assert {"kernel_busy_ratio", "idle_ratio", "kernels_per_step", "memory_reserved_bytes"} <= names


def test_window_shares_are_consistent_and_match_the_saved_trace(monitor, tmp_path):
    """The window reduced from live profiler events equals the reduction of its exported Chrome trace."""
    from ranksight.agent._trace_reduce import events_from_chrome, reduce_window

    trace_dir = tmp_path / "traces"
    mon = monitor(trace_first_step=4, trace_steps=2, trace_every_steps=1000, trace_dir=str(trace_dir))
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    host = torch.randn(256, 256).pin_memory()
    y = torch.randn(256, 256, device="cuda")
    for _ in range(12):
        with mon.step():
            x = host.to("cuda", non_blocking=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    mon.close()
    live = {s["name"]: s["value"] for s in _read(mon.run_path, "samples")}
    for k in ("kernel_busy_ratio", "compute_kernel_ratio", "memcpy_ratio", "idle_ratio", "h2d_copy_ratio"):
        assert 0.0 <= live[k] <= 1.0, k
    assert live["h2d_pageable_ratio"] == 0.0  # pinned source
    assert live["kernels_per_step"] >= 5
    (path,) = list(trace_dir.iterdir())
    with open(path) as f:
        red = reduce_window(events_from_chrome(json.load(f)))
    for k in ("kernel_busy_ratio", "idle_ratio", "h2d_copy_ratio", "kernels_per_step"):
        assert red.samples[k] == pytest.approx(live[k], rel=0.02, abs=0.005), k


def test_window_backs_off_when_the_user_profiles(monitor):
    mon = monitor(trace_first_step=2, trace_steps=1, trace_every_steps=1000)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _train(mon, model, opt, 6, x, y)
    assert mon._gpu.window.windows_done == 0
    assert any(e.name.startswith("aten::") for e in prof.events())  # the user's trace is intact
    mon.close()
    events = _read(mon.run_path, "events")
    assert any(e["component"] == "trace_window_backoff" for e in events)
    assert mon.errors == {}


def test_nvml_reports_the_rank_device(monitor):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception:
        pytest.skip("NVML not usable here")
    mon = monitor(trace_window=False)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(512, 256, device="cuda"), torch.randn(512, 256, device="cuda")
    import time

    t0 = time.time()
    while time.time() - t0 < 2.5:
        _train(mon, model, opt, 20, x, y)
    torch.cuda.synchronize()
    mon.close()
    samples = _read(mon.run_path, "samples")
    util = [s["value"] for s in samples if s["name"] == "gpu_utilization_ratio"]
    used = [s["value"] for s in samples if s["name"] == "gpu_memory_used_bytes"]
    assert util and all(0.0 <= u <= 1.0 for u in util)
    assert max(util) > 0.0  # the GPU was busy training
    assert used and min(used) >= torch.cuda.memory_reserved() * 0.5


def test_snapshot_fragmentation_matches_allocator_counters():
    """On the device: free bytes of the snapshot = reserved - active, as the allocator counts them."""
    from ranksight.agent._allocator import fragmentation_from_snapshot

    keep = [torch.empty((i % 7 + 1) << 20, dtype=torch.uint8, device="cuda") for i in range(64)]
    del keep[::2]
    torch.cuda.synchronize()
    frag = fragmentation_from_snapshot(torch.cuda.memory_snapshot(), torch.cuda.current_device())
    stats = torch.cuda.memory_stats()
    assert frag is not None
    assert frag["free_bytes"] == stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    assert 0.0 <= frag["fragmentation_ratio"] < 1.0
    del keep


def test_gpu_gap_tells_a_hidden_loader_wait_from_a_starving_one(monitor):
    """gpu_gap_s (previous step end → this step begin on the GPU) is ~0 while the host is ahead of a
    GPU-bound loop, and about the loader wait when the GPU has nothing queued during it."""
    import statistics
    import time

    a = torch.randn(4096, 4096, device="cuda")

    def slow_loader(n, wait_s):
        for _ in range(n):
            time.sleep(wait_s)  # e.g. decoding in the main process
            yield None

    def run(mon, wait_s, matmuls):
        model = torch.nn.Linear(4096, 4096, bias=False).cuda()  # watch() attaches the GPU marks to a CUDA model
        mon.watch(model)
        for _ in mon.loader(slow_loader(16, wait_s)):
            with mon.step(), torch.no_grad():
                for _ in range(matmuls):
                    model(a)
        torch.cuda.synchronize()
        mon.close()
        rows = [r for r in _read(mon.run_path, "steps") if r["step"] >= 3]
        gaps = [r["gpu_gap_s"] for r in rows if r["gpu_gap_s"] is not None]
        assert len(gaps) >= 10, rows
        return statistics.median(gaps), statistics.median(r["data_wait_s"] for r in rows)

    gap, wait = run(monitor(trace_first_step=10**9), 0.02, 1)  # 20 ms wait, well under 1 ms of GPU work
    assert wait == pytest.approx(0.02, rel=0.5)
    assert 0.8 * wait <= gap <= wait + 0.005
    gap, wait = run(monitor(trace_first_step=10**9), 0.002, 40)  # 2 ms wait behind tens of ms of matmuls
    assert wait >= 0.0015
    assert gap < 0.0005  # the host had queued the next step already: the wait cost the GPU nothing


def test_a_fetch_between_forward_and_backward_is_data_wait_not_gpu_compute(monitor):
    """nanoGPT's loop fetches the next batch after forward, before backward: the stream idles inside
    compute. Its idle is data wait (the breakdown's data share), and compute is the GPU work alone; a
    fetch the GPU was busy through costs nothing."""
    import statistics

    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown

    a = torch.randn(4096, 4096, device="cuda")

    def run(mon, wait_s, matmuls):
        model = torch.nn.Linear(4096, 4096, bias=False).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        mon.watch(model, opt)
        for _ in range(16):
            with mon.step():
                out = model(a)
                for _ in range(matmuls):
                    out = model(out) * 1e-3
                with mon.data():
                    time.sleep(wait_s)  # get_batch() on the host
                out.sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        mon.close()
        rows = [r for r in _read(mon.run_path, "steps") if r["step"] >= 3]
        assert len([r for r in rows if r["gpu_data_idle_s"] is not None]) >= 10, rows
        idle = statistics.median(r["gpu_data_idle_s"] for r in rows if r["gpu_data_idle_s"] is not None)
        compute = statistics.median(r["gpu_compute_s"] for r in rows if r["gpu_compute_s"] is not None)
        (share,) = [b["data_wait_share"] for b in step_breakdown(open_run(mon.run_path))]
        return idle, compute, share

    idle, compute, share = run(monitor(trace_first_step=10**9), 0.03, 0)  # 30 ms wait after one matmul
    assert 0.02 <= idle <= 0.036
    assert compute < 0.015  # forward and backward's three matmuls; the wait is not compute any more
    assert share > 0.6
    idle, compute, share = run(monitor(trace_first_step=10**9), 0.002, 60)  # 2 ms behind ~100 ms of matmuls
    assert idle < 0.001  # the stream was busy with queued work the whole time
    assert share < 0.05


def test_a_closure_optimizer_step_keeps_forward_and_backward_out_of_the_optimizer_span(monitor):
    """Lightning runs forward and backward inside ``optimizer.step(closure)``: the optimizer's pre-hook
    fires before forward. Its start is the framework's "before optimizer step" callback
    (``mon.optimizer_begin()``), so the GPU phases do not count forward and backward twice."""
    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown

    mon = monitor(trace_first_step=10**9)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    mon.watch(model)  # no optimizer given, as the Lightning callback does
    x = torch.randn(512, 2048, device="cuda")
    for _ in range(16):
        with mon.step():

            def closure():
                loss = model(x).square().mean()
                loss.backward()
                mon.optimizer_begin()  # Lightning's on_before_optimizer_step, after the closure's backward
                return loss

            opt.step(closure)
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    mon.close()
    rows = [r for r in _read(mon.run_path, "steps") if r["step"] >= 3 and r["gpu_optimizer_s"] is not None]
    assert len(rows) >= 10
    for r in rows:
        assert r["gpu_optimizer_s"] < r["gpu_compute_s"], r  # an SGD update, not forward + backward
        assert r["gpu_compute_s"] + r["gpu_optimizer_s"] <= r["gpu_step_s"] * 1.001, r
    (b,) = step_breakdown(open_run(mon.run_path))
    assert b["compute_share"] > b["optimizer_share"]


def test_ddp_over_nccl_gets_gpu_comm_and_optimizer_columns(monitor, tmp_path, monkeypatch):
    """One-rank NCCL DDP: exposed all-reduce is timed on the GPU (gpu_comm_exposed_s: end of backward to the end
    of DDP's wait for its buckets), with no per-bucket Python hook (NCCL completes host futures at enqueue)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        mon = monitor(trace_first_step=10**9)
        model = DDP(_model(), bucket_cap_mb=1)  # several buckets
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        mon.watch(model, optimizer=opt)
        x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
        _train(mon, model, opt, 20, x, y)
        torch.cuda.synchronize()
        mon.close()
    finally:
        dist.destroy_process_group()
    rows = [r for r in _read(mon.run_path, "steps") if r["step"] >= 3]
    timed = [r for r in rows if r["gpu_comm_exposed_s"] is not None]
    assert len(timed) >= 10, rows
    for r in timed:
        assert 0 <= r["gpu_comm_exposed_s"] <= r["gpu_step_s"]
        assert r["gpu_optimizer_s"] is not None and 0 < r["gpu_optimizer_s"] <= r["gpu_step_s"]
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert {r["bucket_bytes"] for r in rows} == {grad_bytes}  # what DDP all-reduces per step
    # No host-side bucket timing on NCCL: the host would see each collective "done" at enqueue.
    assert all(r["allreduce_s"] is None and r["buckets"] is None for r in rows)
    # What the model-state rule compares: the device's memory and the optimizer's state per parameter.
    with open(os.path.join(mon.run_path, "ranks", "rank-00000.json")) as f:
        meta = json.load(f)
    assert meta["gpu_device"]["total_memory_bytes"] == torch.cuda.get_device_properties(0).total_memory
    assert meta["optimizer"] == {"class": "AdamW", "states_per_param": 2}
    assert meta["ddp"]["backend"] == "nccl" and meta["ddp"]["comm_hook"] is False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nccl_collectives_get_their_gpu_time(monitor, tmp_path, monkeypatch):
    """One-rank NCCL DDP with a metric all_reduce per step: NCCL's own timing, read from the flight
    recorder at every flush here, gives DDP's buckets a ``ddp`` row and the metric's row its ``gpu_s``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        mon = monitor(trace_first_step=10**9, nccl_timing_every_s=0)
        model = DDP(_model(), bucket_cap_mb=1)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        mon.watch(model, optimizer=opt)
        x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
        for _ in range(30):
            with mon.step():
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                dist.all_reduce(loss.detach())
            # A step every ~50 ms, so flushes (every 0.3 s) find most steps' collectives finished and given
            # their duration by the NCCL watchdog (it looks every 100 ms); the last steps may stay NULL.
            time.sleep(0.05)
        torch.cuda.synchronize()
        mon.close()
    finally:
        dist.destroy_process_group()
    assert mon.errors == {}
    rows = [r for r in _read(mon.run_path, "collectives") if r["step"] >= 3]
    ddp = [r for r in rows if r["origin"] == "ddp" and r["gpu_s"] is not None]
    user = [r for r in rows if (r["op"], r["origin"]) == ("all_reduce", "user") and r["gpu_s"] is not None]
    assert len(ddp) >= 5 and len(user) >= 5, rows
    assert all(r["count"] >= 2 and r["gpu_s"] >= 0 and r["bytes"] > 0 for r in ddp)  # several buckets
    assert all(r["count"] == 1 and r["gpu_s"] >= 0 for r in user)


def test_events_on_one_step_in_k(monitor):
    """``events_every_steps=4`` (no full-rate start): GPU columns on the schedule's steps only, each with its
    gap (the step before marks its end too); the other steps' stay NULL and say ``gpu_sampled = false``;
    nothing synchronises the device."""
    from ranksight.agent._event_sampling import is_sampled, threshold

    mon = monitor(trace_first_step=10**9, events_every_steps=4, events_full_steps=0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        _train(mon, model, opt, 40, x, y)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    mon.close()
    assert mon.errors == {}
    rows = {r["step"]: r for r in _read(mon.run_path, "steps")}
    assert len(rows) == 40
    want = {s for s in range(40) if is_sampled(s, threshold(4))}
    assert 4 <= len(want) <= 20
    assert {s for s, r in rows.items() if r["gpu_step_s"] is not None} == want
    assert {s for s, r in rows.items() if r["gpu_sampled"]} == want
    assert all(rows[s]["gpu_sampled"] is False for s in set(range(40)) - want)
    assert all(rows[s]["gpu_gap_s"] is not None and rows[s]["gpu_compute_s"] is not None for s in want - {0})


def test_automatic_sampling_starts_at_every_step_then_follows_the_step_time(monitor):
    """The default: every step for ``events_full_steps``, then one step in N, N set from the timed cost of
    an event against the step (a ~1 ms step of a small model: sparser than every step)."""
    from ranksight.agent._event_sampling import is_sampled, threshold

    mon = monitor(trace_first_step=10**9, events_full_steps=30)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    _train(mon, model, opt, 30, x, y)
    time.sleep(1.0)  # a flush or two: the agent thread sets N from the first 30 steps
    every = mon._gpu.every
    _train(mon, model, opt, 300, x, y)
    torch.cuda.synchronize()
    mon.close()
    assert mon.errors == {}
    assert mon._gpu.record_cost_s > 0
    assert every > 1, every  # a cheap step cannot pay for its events every step at a 0.1 % budget
    rows = {r["step"]: r for r in _read(mon.run_path, "steps")}
    assert all(rows[s]["gpu_sampled"] for s in range(30))
    late = {s for s in range(30, 330) if rows[s]["gpu_sampled"]}
    # N may move a little between flushes; the schedule is nested, so the sampled steps lie between the
    # sets of the sparsest and the densest N seen.
    assert late, "no step sampled after the start"
    assert len(late) < 300 / 2
    assert late <= {s for s in range(30, 330) if is_sampled(s, threshold(2))}


def test_shares_from_sampled_steps_agree_with_every_step(monitor, tmp_path):
    """The same loop (a fixed 2 ms host wait for data on two steps of three before each ~GPU-bound step),
    with CUDA events on every step: the steps that sampling at one in 8 would keep give each phase share
    within 2 pp of every step's (``benchmarks/sampled_shares.py``'s masking, on the same steps). A second
    run records at one in 8: its rows are the schedule's steps and its shares read within 10 pp, since two
    runs of this loop differ by more than the sampling does (5.7 pp of data wait seen on one H200)."""
    import importlib.util

    from ranksight.agent._event_sampling import is_sampled, threshold
    from ranksight.collectors import PHASES, open_run
    from ranksight.collectors._queries import step_breakdown

    spec = importlib.util.spec_from_file_location(
        "sampled_shares", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sampled_shares.py")
    )
    sampled_shares = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sampled_shares)

    def run(**opts):
        mon = monitor(trace_first_step=10**9, events_full_steps=0, **opts)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        mon.watch(model, optimizer=opt)
        x = torch.randn(512, 2048, device="cuda")
        for i in range(400):
            with mon.data():
                time.sleep(0.002 if i % 3 else 0.0)
            with mon.step():
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        mon.close()
        assert mon.errors == {}
        return mon.run_path

    def breakdown(path):
        (row,) = step_breakdown(open_run(path))
        return row

    every_path = run(events_every_steps=1)
    masked_path = str(tmp_path / "masked")
    kept = sampled_shares._mask(every_path, masked_path, 8)
    every, masked = breakdown(every_path), breakdown(masked_path)
    assert 0 < masked["steps"] < every["steps"] / 4 and kept >= masked["steps"]
    for p in PHASES:
        a, b = every[f"{p[:-2]}_share"], masked[f"{p[:-2]}_share"]
        if a is None:
            assert b is None, p
            continue
        assert abs(a - b) < 0.02, (p, a, b)

    sampled_path = run(events_every_steps=8)
    rows = {r["step"]: r for r in _read(sampled_path, "steps")}
    on = {s for s, r in rows.items() if r["gpu_sampled"]}
    assert on == {s for s in rows if is_sampled(s, threshold(8))}
    assert all(rows[s]["gpu_step_s"] is None for s in rows if s not in on)
    sampled = breakdown(sampled_path)
    assert sampled["steps"] < every["steps"] / 4  # the sampled run's shares rest on its sampled steps
    for p in PHASES:
        a, b = every[f"{p[:-2]}_share"], sampled[f"{p[:-2]}_share"]
        if a is not None:
            assert b is not None and abs(a - b) < 0.10, (p, a, b)


def test_a_cuda_rank_with_a_node_spool_publishes_step_digests_the_readers_use(tmp_path, monkeypatch):
    """A CUDA rank with a node spool: its publisher (DuckDB, on the agent thread) writes each step file's
    digest while the loop runs under sync debug mode "error"; the rollup folds the digests and the
    breakdown taken from them equals the one from the rows (medians within their bound), GPU columns included."""
    import ranksight
    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown
    from ranksight.dashboard import Rollup
    from ranksight.format.digest import DIGEST_DIR

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    mon = ranksight.init(
        run_dir=str(tmp_path / "runs"),
        job="gpu-test",
        run_id="nodespool",
        flush_interval_s=0.3,
        node_spool_dir=str(tmp_path / "local"),
        gpu={"detach_cupti": False},  # CUPTI stays attached for the profiler tests that follow (see monitor)
    )
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    _train(mon, model, opt, 2, x, y)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        deadline = time.monotonic() + 2.0  # several publishes (every 0.3 s here)
        while time.monotonic() < deadline:
            _train(mon, model, opt, 20, x, y)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    mon.close()
    assert mon.errors == {}
    run = os.path.join(str(tmp_path / "runs"), "nodespool")
    files = sorted(n for n in os.listdir(os.path.join(run, "steps")) if not n.startswith("."))
    assert len(files) >= 3
    rollup = Rollup(run)
    assert rollup.digested == len(files)
    con = open_run(run, follow_spool=False)
    assert con.execute("SELECT count(gpu_step_s) FROM steps").fetchone()[0] > 0  # left half-read on purpose
    from_digests = step_breakdown(con)
    assert con.summary().read_from == ("digests",)
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    con = open_run(run, follow_spool=False)
    from_rows = step_breakdown(con)
    assert con.summary().read_from == ("rows",)
    assert from_digests[0].keys() == from_rows[0].keys()
    for key, value in from_digests[0].items():
        if isinstance(value, float):  # sums added in another order; medians exact
            assert value == pytest.approx(from_rows[0][key], rel=1e-9), key
        else:
            assert value == from_rows[0][key], key


def test_a_profiler_the_user_starts_mid_window_runs_and_the_window_steps_aside(monitor):
    """The user's ``torch.profiler.profile`` started inside a step the sampled window traces: on a CUDA build
    of torch it raised "Can't disable Kineto profiler when it's not running"; now the window is dropped
    first, the user's trace holds the GPU's kernels, and the agent records no error."""
    mon = monitor(trace_first_step=3, trace_steps=2, trace_every_steps=10**6, trace_every_s=0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    window = mon._gpu.window
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    theirs, state_at_start = None, None
    for step in range(12):
        with mon.step():
            if step == 4:  # the window's first traced step (prepared at 3)
                state_at_start = window.state
                theirs = torch.profiler.profile(activities=activities)
                theirs.__enter__()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step == 7:
            theirs.__exit__(None, None, None)
    assert state_at_start == window.TRACING
    assert window.state == window.IDLE and window.windows_done == 0
    kernels = [e for e in theirs.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels  # the user's trace saw the GPU
    mon.close()
    assert mon.errors == {}
    assert "trace_window_backoff" in mon._reporter.reported


def _gpu_phases_read(run_path: str) -> dict:
    """Every step after warm-up has its GPU compute, H2D and optimizer read; the breakdown of the run."""
    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown

    rows = [r for r in _read(run_path, "steps") if r["step"] >= 3]
    assert len(rows) >= 10
    for column in ("gpu_compute_s", "h2d_s", "gpu_optimizer_s", "compute_s", "optimizer_s"):
        missing = [r["step"] for r in rows if r[column] is None]
        assert not missing, (column, missing)
    assert all(r["gpu_compute_s"] > 0 for r in rows)
    (b,) = step_breakdown(open_run(run_path))
    assert b["compute_share"] > 0.3 and b["other_share"] < 0.3, b
    return b


@pytest.mark.parametrize("style", ["self", "net"])
def test_lightning_on_one_gpu_reads_compute_h2d_and_optimizer_whatever_the_step_calls(tmp_path, style):
    """A LightningModule whose training_step calls a submodule (``self.net(x)``) never runs its own forward:
    the callback's phases come from Lightning's hooks, so compute is read either way (it read 0 %, "other"
    91-95 %, H2D "-" on an H100)."""
    pytest.importorskip("lightning")
    from lightning.pytorch import LightningModule, Trainer

    from ranksight.integrations.lightning import RanksightCallback

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self(x) if style == "self" else self.net(x)
            return torch.nn.functional.mse_loss(out, y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    data = torch.utils.data.TensorDataset(torch.randn(256 * 40, 2048), torch.randn(256 * 40, 2048))
    loader = torch.utils.data.DataLoader(data, batch_size=256, pin_memory=True)
    callback = RanksightCallback(run_dir=str(tmp_path), run_id=f"lightning-{style}", gpu={"trace_window": False})
    trainer = Trainer(accelerator="gpu", devices=1, max_steps=30, callbacks=[callback], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Module(), loader)
    _gpu_phases_read(str(tmp_path / f"lightning-{style}"))


def test_the_hf_trainer_on_one_gpu_reads_compute_and_optimizer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from ranksight.integrations.transformers import RanksightCallback

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i):
            ids = torch.randint(0, 4096, (128,))
            return {"input_ids": ids, "labels": ids}

    model = GPT2LMHeadModel(GPT2Config(vocab_size=4096, n_positions=128, n_embd=512, n_layer=4, n_head=8))
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=16, max_steps=30, bf16=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)  # fmt: skip
    callback = RanksightCallback(run_dir=str(tmp_path), run_id="hf", gpu={"trace_window": False})
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train()
    _gpu_phases_read(str(tmp_path / "hf"))


def test_accelerate_on_one_gpu_with_accumulation_reads_compute_and_optimizer(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from ranksight.integrations.accelerate import attach

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(256 * 64, 2048), torch.randn(256 * 64, 2048))
    loader = torch.utils.data.DataLoader(data, batch_size=256, pin_memory=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    tracker = attach(accelerator, model, opt, run_dir=str(tmp_path), run_id="acc", gpu={"trace_window": False})
    for x, y in tracker.loader(loader):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
    tracker.close()
    _gpu_phases_read(str(tmp_path / "acc"))


def test_zz_a_profiler_started_after_a_detaching_window_is_warned(monitor):
    """Runs last in this file (a detached CUPTI stays so for the process). With ``detach_cupti`` on (the
    default), a window detaches CUPTI when it stops; a profiler the user starts afterwards is told so,
    once, with the option that keeps it attached, and the agent records no error."""
    mon = monitor(detach_cupti=True, trace_first_step=2, trace_steps=2, trace_every_steps=10**6, trace_every_s=0)
    model = _model()
    mon.watch(model)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    window = mon._gpu.window
    for _ in range(10):
        with mon.step():
            torch.nn.functional.mse_loss(model(x), y).backward()
    assert window.windows_done == 1 and os.environ.get("TEARDOWN_CUPTI") == "1"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]):
        torch.nn.functional.mse_loss(model(x), y).backward()
    assert "trace_window_detached_cupti" in mon._reporter.reported
    mon.close()
    assert mon.errors == {}
