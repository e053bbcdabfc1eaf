"""Collective GPU time from the flight recorder (``agent/_nccl_timing.py``): the matching of its entries
to the calls and steps the agent recorded, on CPU.

The end-to-end test runs a real 2-rank gloo DDP job with the agent and reads PyTorch's real flight
recorder (gloo keeps one too, with the same ``time_created_ns`` clock as NCCL's). Gloo has no GPU, so
its entries carry no ``duration_ms``: the test gives every entry 1 ms, which makes the expected
``gpu_s`` of each row its count of collectives, and so checks that each entry landed in the right row.
The NCCL run against torch.profiler was ``benchmarks/gpu_collectives.py``, at commit e40e411 (docs/gpu-validation.md).
"""

from __future__ import annotations

import os
import pickle

import pytest

from ranksight.agent._nccl_timing import entry_bytes, fill_gpu_times, op_name

MS = 1_000_000


def _entry(record_id: int, created: int, name: str = "nccl:all_reduce", duration=1.0, **kw) -> dict:
    e = {"record_id": record_id, "time_created_ns": created, "profiling_name": name, "duration_ms": duration,
         "input_sizes": [[256]], "input_dtypes": ["Float"], "process_group": ("0", "default_pg")}  # fmt: skip
    e.update(kw)
    return e


def _call(op: str, origin: str, begin_ns: int, end_ns: int, wall_ns) -> tuple:
    return (op, origin, "default", 4, begin_ns, end_ns, end_ns - begin_ns, *(() if wall_ns is None else (wall_ns,)))


def _row(step: int, op: str, origin: str) -> dict:
    return {"step": step, "op": op, "origin": origin, "process_group": "default", "count": 1, "bytes": 4,
            "blocked_s": 0.001, "busy_s": None, "gpu_s": None}  # fmt: skip


def test_entries_inside_a_call_go_to_its_row_the_others_to_ddp():
    """Wall clock = monotonic + 1e12 here. Step 3 runs 0-10 ms: two bucket all-reduces at 2 and 3 ms
    (from autograd, inside no call), a metric all_reduce call at 6-6.2 ms and a barrier at 7-8 ms."""
    off = 10**12
    calls = [_call("all_reduce", "user", 6 * MS, 6 * MS + 200_000, off + 6 * MS),
             _call("barrier", "user", 7 * MS, 8 * MS, off + 7 * MS)]  # fmt: skip
    rows = [_row(3, "all_reduce", "user"), _row(3, "barrier", "user")]
    entries = [
        _entry(4, off - 1 * MS),  # the previous step's: the ring reaches back past this step's start
        _entry(5, off + 2 * MS, duration=1.5),
        _entry(6, off + 3 * MS, duration=0.5),
        _entry(7, off + 6 * MS + 50_000, duration=0.25),
        _entry(8, off + 7 * MS + 10_000, "nccl:all_reduce_barrier", duration=0.01, input_sizes=[[1]]),
        _entry(9, off + 12 * MS),  # the next step's: not this one's
    ]
    stats: dict = {}
    added = fill_gpu_times([(3, 0, 10 * MS, calls, rows)], entries, off, ddp=True, stats=stats)
    assert rows[0]["gpu_s"] == pytest.approx(0.25e-3) and rows[1]["gpu_s"] == pytest.approx(0.01e-3)
    assert [(r["op"], r["origin"], r["count"], r["bytes"]) for r in added] == [("all_reduce", "ddp", 2, 2 * 1024)]
    assert added[0]["gpu_s"] == pytest.approx(2e-3) and added[0]["blocked_s"] is None
    assert stats == {"timed": 1}


def test_a_step_the_ring_lost_or_the_gpu_has_not_finished_stays_unknown():
    """Never a partial sum: the ring already overwrote the step's first collective (the oldest entry kept
    is not record 0 and was created after the step began), or one collective has no duration yet."""
    off = 0
    rows = [_row(1, "all_reduce", "user")]
    calls = [_call("all_reduce", "user", 5 * MS, 6 * MS, 5 * MS)]
    wrapped = [_entry(900, 4 * MS), _entry(901, 5 * MS + 1)]  # the ring starts inside step 1 (0-10 ms)
    stats: dict = {}
    assert fill_gpu_times([(1, 0, 10 * MS, calls, rows)], wrapped, off, ddp=False, stats=stats) == []
    assert rows[0]["gpu_s"] is None and stats == {"not_covered": 1}
    running = [_entry(0, 1 * MS), _entry(1, 5 * MS + 1, duration=None)]
    assert fill_gpu_times([(1, 0, 10 * MS, calls, rows)], running, off, ddp=False, stats=stats) == []
    assert rows[0]["gpu_s"] is None and stats["incomplete"] == 1


def test_a_call_without_a_wall_stamp_is_matched_with_the_clock_offset():
    """Rows from another recorder (FSDP2's per-unit hooks) carry monotonic times only."""
    off = 5 * 10**9
    rows = [_row(2, "all_gather_forward", "fsdp")]
    calls = [("all_gather_forward", "fsdp", "default", 4, 3 * MS, 3 * MS + 80_000, 80_000)]
    entries = [_entry(0, off + 3 * MS + 150_000, "nccl:_allgather_base", duration=0.4)]  # 70 µs late: clock skew
    assert fill_gpu_times([(2, 0, 10 * MS, calls, rows)], entries, off, ddp=False) == []
    assert rows[0]["gpu_s"] == pytest.approx(0.4e-3)


def test_an_entry_inside_two_calls_goes_to_the_one_that_started_last():
    """An FSDP2 all-gather recorded from its issue (1 ms) to its wait (9 ms) holds a reduce-scatter
    issued at 4 ms; the reduce-scatter's own call (4-4.1 ms) was recorded first (it ended first)."""
    off = 0
    calls = [_call("reduce_scatter", "fsdp", 4 * MS, 4 * MS + 100_000, 4 * MS),
             _call("all_gather_backward", "fsdp", 1 * MS, 9 * MS, 1 * MS)]  # fmt: skip
    rows = [_row(0, "reduce_scatter", "fsdp"), _row(0, "all_gather_backward", "fsdp")]
    entries = [_entry(0, 1 * MS + 1000, "nccl:_allgather_base", duration=2.0),
               _entry(1, 4 * MS + 1000, "nccl:_reduce_scatter_base", duration=0.5)]  # fmt: skip
    fill_gpu_times([(0, 0, 10 * MS, calls, rows)], entries, off, ddp=False)
    assert rows[0]["gpu_s"] == pytest.approx(0.5e-3) and rows[1]["gpu_s"] == pytest.approx(2e-3)


def test_profiling_names_and_bytes():
    assert op_name("nccl:_allgather_base") == "all_gather_into_tensor"
    assert op_name("nccl:_reduce_scatter_base") == "reduce_scatter_tensor"
    assert op_name("nccl:all_reduce_barrier") == "barrier"
    assert op_name("nccl:broadcast") == "broadcast"
    assert entry_bytes({"input_sizes": [[2, 3], [4]], "input_dtypes": ["BFloat16", "Float"]}) == 12 + 16


# ------------------------------------------------------------------ a real gloo job and its recorder
def _rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn

    import ranksight
    from ranksight.agent._nccl_timing import NcclTimes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dump_fr = torch._C._distributed_c10d._dump_fr_trace

    def dump_with_durations() -> bytes:
        """Gloo's real recorder; each entry given the 1 ms a GPU would have measured."""
        trace = pickle.loads(dump_fr(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        for e in trace.get("entries", []):
            e["duration_ms"] = 1.0
        return pickle.dumps(trace)

    mon = ranksight.init(run_dir=os.path.join(out_dir, "runs"), job="fr", run_id="fr", flush_interval_s=0.2)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)), bucket_cap_mb=0.005
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, optimizer=opt)
    mon._worker._assembler.collective_gpu = NcclTimes(mon, dump_with_durations, every_s=0, ddp=True)
    for _ in range(8):
        with mon.step():
            loss = model(torch.randn(16, 32)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            dist.barrier()
    mon.close()
    dist.destroy_process_group()


def test_a_real_recorder_s_entries_land_in_the_rows_of_their_calls(tmp_path):
    import torch

    if not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
        pytest.skip("this torch keeps no flight recorder for gloo (torch < 2.8)")
    import torch.multiprocessing as mp

    from ranksight.collectors import open_run

    from ._jobs import free_port

    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    con = open_run(str(tmp_path / "runs" / "fr"))
    rows = con.execute(
        "SELECT op, origin, count, gpu_s FROM collectives WHERE rank = 0 AND step >= 2 ORDER BY step, op, origin"
    ).fetchall()
    by_key: dict = {}
    for op, origin, count, gpu_s in rows:
        by_key.setdefault((op, origin), []).append((count, gpu_s))
    # One entry per call, 1 ms each: a row's gpu_s is its count in ms, on every timed step.
    for key in (("all_reduce", "user"), ("barrier", "user"), ("all_reduce", "ddp")):
        timed = [(n, g) for n, g in by_key[key] if g is not None]
        assert len(timed) >= 4, (key, by_key[key])
        assert all(g == pytest.approx(n * 1e-3) for n, g in timed), (key, timed)
