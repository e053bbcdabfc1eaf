"""The agent in one process: phase arithmetic, identity, disabled mode, degradation, graph breaks."""

from __future__ import annotations

import logging
import os
import re
import threading

import pytest

import ranksight
from ranksight.agent import Config
from ranksight.agent._assemble import Assembler
from ranksight.agent._events import EV_BUCKET_DONE, EV_BUCKET_READY, EV_GRAD_SYNC, EV_STEP
from ranksight.agent._identity import derive_run_id, resolve
from ranksight.collectors import open_run, read_rank_meta

MS = 1_000_000  # ns


# ----------------------------------------------------------------- phase arithmetic (pure)
def _step(step, begin, end, fetch=(0, 0), fwd=0, opt=(0, 0)):
    return (EV_STEP, step, begin, end, fetch[0], fetch[1], fwd, opt[0], opt[1], 0 if fetch[1] else -1, 0, 0, 0, -1)


def test_phases_partition_the_step():
    a = Assembler(wall_offset_ns=0)
    # data 0-10, step 10-100: forward at 15, buckets ready 40/60, done 70/80, optimizer 85-95.
    a.add((EV_BUCKET_READY, 0, 0, 100, 40 * MS, False))
    a.add((EV_BUCKET_READY, 0, 1, 200, 60 * MS, True))
    a.add((EV_BUCKET_DONE, 0, 1, 80 * MS))  # out of order: the last bucket finishes first
    a.add((EV_BUCKET_DONE, 0, 0, 70 * MS))
    a.add(_step(0, 10 * MS, 100 * MS, fetch=(0, 10 * MS), fwd=15 * MS, opt=(85 * MS, 95 * MS)))
    (row,), buckets, _ = a.drain()
    assert row["step_s"] == pytest.approx(0.100)
    assert row["data_wait_s"] == pytest.approx(0.010)
    assert row["compute_s"] == pytest.approx(0.045)  # forward start -> last bucket ready
    assert row["comm_exposed_s"] == pytest.approx(0.020)  # last ready (60) -> last done (80)
    assert row["allreduce_s"] == pytest.approx(0.030 + 0.020)
    assert row["optimizer_s"] == pytest.approx(0.010)
    assert row["other_s"] == pytest.approx(0.015)  # 10-15 and 80-85 and 95-100
    assert [b["bucket"] for b in buckets] == [0, 1]
    assert buckets[1]["ready_s"] == pytest.approx(0.060) and buckets[1]["is_last"]


def test_one_sync_mark_pair_a_step_times_the_exposed_all_reduce():
    """gloo without the per-bucket hook: backward's end (60) to DDP's wait returned (80), capped at the
    optimizer; DDP's own bucket count and the gradient bytes; one ddp collectives row; no bucket rows."""
    a = Assembler(wall_offset_ns=0)
    a.grad_bytes, a.bucket_count = 300, 2
    a.add((EV_GRAD_SYNC, 0, 60 * MS, 80 * MS))
    a.add(_step(0, 10 * MS, 100 * MS, fetch=(0, 10 * MS), fwd=15 * MS, opt=(85 * MS, 95 * MS)))
    a.add((EV_GRAD_SYNC, 1, 150 * MS, 190 * MS))  # done after the optimizer began (180): capped there
    a.add(_step(1, 100 * MS, 200 * MS, fwd=110 * MS, opt=(180 * MS, 190 * MS)))
    a.add(_step(2, 200 * MS, 300 * MS, fwd=210 * MS, opt=(280 * MS, 290 * MS)))  # no synced backward
    rows, buckets, collectives = a.drain()
    assert rows[0]["compute_s"] == pytest.approx(0.045) and rows[0]["comm_exposed_s"] == pytest.approx(0.020)
    assert rows[0]["other_s"] == pytest.approx(0.015)
    assert rows[0]["allreduce_s"] is None and rows[0]["buckets"] == 2 and rows[0]["bucket_bytes"] == 300
    assert rows[1]["comm_exposed_s"] == pytest.approx(0.030)
    assert rows[2]["comm_exposed_s"] is None and rows[2]["buckets"] is None
    assert rows[2]["compute_s"] == pytest.approx(0.070)  # to the optimizer, as without DDP
    assert buckets == []
    assert [(c["step"], c["origin"], c["count"], c["bytes"]) for c in collectives] == [
        (0, "ddp", 2, 300),
        (1, "ddp", 2, 300),
    ]


def test_step_waits_for_a_late_bucket_done_then_gives_up_after_one_drain():
    a = Assembler(wall_offset_ns=0)
    a.add((EV_BUCKET_READY, 0, 0, 100, 40 * MS, True))
    a.add(_step(0, 0, 100 * MS, fwd=1 * MS, opt=(90 * MS, 95 * MS)))
    assert a.drain() == ([], [], [])  # done mark not here yet
    a.add((EV_BUCKET_DONE, 0, 0, 85 * MS))
    (row,), _, _ = a.drain()
    assert row["comm_exposed_s"] == pytest.approx(0.045)
    b = Assembler(wall_offset_ns=0)
    b.add((EV_BUCKET_READY, 3, 0, 100, 40 * MS, True))
    b.add(_step(3, 0, 100 * MS, fwd=1 * MS))
    b.drain()
    (row,), (bucket,), _ = b.drain()  # second drain: emitted without the lost done mark
    assert bucket["allreduce_s"] is None and row["step"] == 3


def test_without_watch_or_loader_only_step_time_is_known():
    a = Assembler(wall_offset_ns=5)
    a.add(_step(0, 10, 10 + 20 * MS))
    (row,), buckets, _ = a.drain()
    assert row["step_s"] == pytest.approx(0.020) and row["time_ns"] == 10 + 20 * MS + 5
    assert row["data_wait_s"] is None and row["compute_s"] is None and row["comm_exposed_s"] is None
    assert buckets == []


# ----------------------------------------------------------------- identity
def test_identity_from_torchrun_and_slurm(monkeypatch):
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_JOB_ID",
        "TORCHELASTIC_RUN_ID",
        "GROUP_RANK",
        "RANKSIGHT_NODE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("GROUP_RANK", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-42")
    ident = resolve("job", None)
    # A rendezvous id the user chose (multi-node): the nodes share no clock, so no start time in the id.
    assert (ident.rank, ident.world_size, ident.local_rank, ident.node_rank, ident.run) == (5, 8, 1, 2, "job-rdzv-42")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "3")
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "991")
    monkeypatch.setenv("RANKSIGHT_NODE", "gpu-a")
    monkeypatch.delenv("SLURM_JOB_START_TIME", raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    ident = resolve("job", None)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.run, ident.node) == (3, 4, 3, "job-slurm991", "gpu-a")
    monkeypatch.setenv("SLURM_JOB_START_TIME", "1764547200")
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    run = resolve("my job", None).run  # the job name is made safe for a folder name
    assert re.fullmatch(r"my-job-\d{8}-\d{6}-slurm991\.2", run), run


def test_run_id_is_shared_by_sibling_processes(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    multi = derive_run_id(world_size=4, job="exp")
    # <job>-<launcher start>-<launcher pid>: siblings share the launcher, so every local rank derives it
    assert re.fullmatch(rf"exp-\d{{8}}-\d{{6}}-{os.getppid()}", multi), multi
    assert derive_run_id(world_size=1, job="exp").endswith(f"-{os.getpid()}")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "0c1f9a2e-7d4b-4c1e-9f00-1234567890ab")  # torchrun --standalone
    assert re.fullmatch(r"exp-\d{8}-\d{6}-0c1f9a", derive_run_id(world_size=2, job="exp"))


@pytest.mark.parametrize("bad", ["../escape", "/abs/path", ".hidden", "a/b", "x?y", "", "a" * 201])
def test_unsafe_run_ids_are_refused_at_init(tmp_path, bad):
    with pytest.raises(ValueError, match="run_id"):
        ranksight.init(run_dir=str(tmp_path), run_id=bad)
    assert os.listdir(tmp_path) == []  # nothing written anywhere


# ----------------------------------------------------------------- monitor in-process
def _tiny_training(mon, steps=5, compiled_fn=None):
    import torch

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(steps)]
    for x, y in mon.loader(data):
        with mon.step():
            if compiled_fn is not None:
                x = compiled_fn(x)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


@pytest.fixture
def single_process(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "RANKSIGHT_DISABLED"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def test_a_marked_fetch_nested_in_another_counts_once_and_whole(tmp_path, single_process):
    """mon.data() around a get_batch() that marks itself too: the outer block times the whole fetch
    (an inner exit used to end it early and drop the outer's time)."""
    import time

    mon = ranksight.init(run_dir=str(tmp_path), job="unit", run_id="nested", flush_interval_s=0.2)
    for _ in range(3):
        with mon.step():
            with mon.data():
                time.sleep(0.02)
                with mon.data():  # the helper's own mark
                    time.sleep(0.02)
            time.sleep(0.005)
    mon.close()
    waits = [r[0] for r in open_run(str(tmp_path / "nested")).execute("SELECT data_wait_s FROM steps").fetchall()]
    assert len(waits) == 3 and all(0.04 <= w < 0.1 for w in waits), waits


def test_single_process_run_records_phases(tmp_path, single_process):
    mon = ranksight.init(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2)
    _tiny_training(mon, steps=6)
    mon.close()
    con = open_run(str(tmp_path / "r1"))
    rows = con.execute("SELECT step, data_wait_s, compute_s, optimizer_s, comm_exposed_s FROM steps ORDER BY step")
    rows = rows.fetchall()
    assert [r[0] for r in rows] == list(range(6))
    assert all(r[1] is not None and r[2] > 0 and r[3] > 0 for r in rows)
    assert all(r[4] is None for r in rows)  # no DDP: exposed comm is absent, not zero
    (meta,) = read_rank_meta(str(tmp_path / "r1"))
    assert meta.status == "finished" and meta.data["model"]["parameters"] == 9
    assert meta.data["optimizer"] == {"class": "SGD", "states_per_param": 0}  # no momentum: no state


def test_optimizer_state_per_parameter_feeds_the_model_state_features(tmp_path, single_process):
    import torch

    from ._golden import run_features

    mon = ranksight.init(run_dir=str(tmp_path), job="unit", run_id="adam", flush_interval_s=0.2)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    mon.watch(model, optimizer=opt)
    with mon.step():
        model(torch.randn(2, 64)).sum().backward()
        opt.step()
    mon.close()
    (f,) = run_features(str(tmp_path / "adam")).values()
    assert f["parameter_bytes"] == (64 * 64 + 64) * 4
    assert f["model_state_bytes"] == f["parameter_bytes"] * 4  # weights, grads, two Adam moments
    assert f["device_memory_bytes"] is None and f["model_state_share"] is None  # a CPU model: no GPU to fill
    momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert ranksight.agent._attach._optimizer_facts(momentum)["states_per_param"] == 1
    assert ranksight.agent._attach._optimizer_facts(torch.optim.LBFGS(model.parameters()))["states_per_param"] is None


def test_public_marks_record_a_step_from_framework_callbacks(tmp_path, single_process):
    """The mark API the integrations use: a step opened from a callback, with each phase marked."""
    import time

    mon = ranksight.init(run_dir=str(tmp_path), job="unit", run_id="marks", flush_interval_s=0.2)
    for _ in range(3):
        waited = mon.now_ns()
        time.sleep(0.004)  # the batch wait
        mon.step_begin(waited)
        assert mon.in_step
        time.sleep(0.002)
        mon.forward_begin()
        time.sleep(0.006)  # forward + backward
        assert not mon.optimizer_end()  # no optimizer step began: nothing to close
        mon.optimizer_begin()
        time.sleep(0.003)
        assert mon.optimizer_end()
        mon.step_end()
    mon.step_begin(mon.now_ns())  # an evaluation loop opened a step, then ran out
    mon.discard_step()
    assert not mon.in_step
    mon.close()
    rows = (
        open_run(str(tmp_path / "marks"))
        .execute("SELECT data_wait_s, compute_s, optimizer_s, step_s FROM steps ORDER BY step")
        .fetchall()
    )
    assert len(rows) == 3  # the discarded step left no row
    for wait, compute, opt, step in rows:
        assert 0.004 <= wait < 0.05 and 0.006 <= compute < 0.05 and 0.003 <= opt < 0.05
        assert step >= wait + compute + opt
    off = ranksight.init(enabled=False)
    off.step_begin(off.now_ns())
    off.forward_begin(), off.optimizer_begin(), off.discard_step()
    assert not off.in_step and off.optimizer_end() is False


def test_disabled_adds_no_files_no_threads_no_hooks(tmp_path, monkeypatch, single_process):
    monkeypatch.setenv("RANKSIGHT_DISABLED", "1")
    threads = threading.active_count()
    data = [1, 2, 3]
    mon = ranksight.init(run_dir=str(tmp_path / "runs"), job="off")
    assert not mon.enabled and mon.loader(data) is data
    model = _tiny_training(mon, steps=3)
    assert not model._forward_pre_hooks
    mon.close()
    assert threading.active_count() == threads
    assert not (tmp_path / "runs").exists()
    assert isinstance(ranksight.init(enabled=False), ranksight.agent.NoopMonitor)


def test_unwritable_run_dir_warns_once_and_training_goes_on(tmp_path, caplog, single_process):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        mon = ranksight.init(run_dir=str(blocker / "runs"), job="ro", run_id="x", flush_interval_s=0.1)
        _tiny_training(mon, steps=4)
        mon.close()
    spool_warnings = [r for r in caplog.records if "cannot write the run directory" in r.getMessage()]
    assert len(spool_warnings) == 1
    assert mon.steps_recorded == 4


def test_a_failing_part_is_counted_switched_off_and_never_raises(tmp_path, caplog, single_process):
    class Broken:
        def step_begin(self, step):
            raise RuntimeError("boom")

        def step_end(self, step):
            raise RuntimeError("boom")

    mon = ranksight.init(run_dir=str(tmp_path), job="err", run_id="e", flush_interval_s=0.1)
    mon._gpu = Broken()
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        _tiny_training(mon, steps=3)  # must not raise
    mon.close()
    assert mon.errors == {"gpu": 1} and mon._gpu is None  # only the failing part is off
    assert mon.steps_recorded == 3
    assert sum("gpu failed and is switched off" in r.getMessage() for r in caplog.records) == 1
    (meta,) = read_rank_meta(str(tmp_path / "e"))
    assert meta.data["counters"]["agent_errors_total"] >= 1
    events = open_run(str(tmp_path / "e")).execute("SELECT level, component FROM events").fetchall()
    assert ("error", "gpu") in events
    assert open_run(str(tmp_path / "e")).execute("SELECT count(*) FROM steps").fetchone()[0] == 3


def test_user_exception_inside_step_propagates_unchanged(tmp_path, single_process):
    mon = ranksight.init(run_dir=str(tmp_path), job="exc", run_id="u", flush_interval_s=0.1)
    with pytest.raises(KeyError, match="mine"):
        with mon.step():
            raise KeyError("mine")
    mon.close()
    assert mon.errors == {}


def test_bad_config_fails_fast_before_training():
    with pytest.raises(ValueError, match="flush_interval_s"):
        Config(flush_interval_s=0)
    with pytest.raises(ValueError, match="prometheus_port"):
        Config(prometheus_port=70000)


def test_graph_breaks_from_print_and_data_dependent_branch_are_counted(tmp_path, single_process):
    import torch

    torch._dynamo.reset()

    def body(x):
        x = x * 2
        print("inside compiled code")  # graph break: builtin print
        if x.sum() > 0:  # graph break: data-dependent branch (lands in counters["unimplemented"])
            return x + 1
        return x - 1

    compiled = torch.compile(body, backend="eager")
    mon = ranksight.init(run_dir=str(tmp_path), job="gb", run_id="g", flush_interval_s=0.1)
    _tiny_training(mon, steps=4, compiled_fn=compiled)
    compiled(torch.randn(7, 8))  # a new shape: a recompile
    mon.close()
    con = open_run(str(tmp_path / "g"))
    breaks = con.execute("SELECT reason, sum(count) FROM compile WHERE kind = 'graph_break' GROUP BY reason")
    reasons = " | ".join(r for r, _ in breaks.fetchall()).lower()
    assert "print" in reasons or "builtin" in reasons
    assert "data-dependent" in reasons or "jump" in reasons
    recompiles = con.execute("SELECT count(*) FROM compile WHERE kind = 'recompile'").fetchone()[0]
    assert recompiles >= 1
    (meta,) = read_rank_meta(str(tmp_path / "g"))
    assert meta.data["counters"]["graph_breaks_total"] >= 2


def test_a_full_buffer_drops_the_oldest_steps_and_counts_them(tmp_path, single_process):
    mon = ranksight.init(run_dir=str(tmp_path), job="drop", run_id="d", flush_interval_s=3600, max_buffered_events=1000)
    for _ in mon.loader(range(2500)):
        with mon.step():
            pass
    mon.close()  # the only flush: the deque kept the newest 1000 marks
    steps = [s for (s,) in open_run(str(tmp_path / "d")).execute("SELECT step FROM steps ORDER BY step").fetchall()]
    assert steps == list(range(1500, 2500))
    (meta,) = read_rank_meta(str(tmp_path / "d"))
    assert meta.data["counters"]["records_dropped_total"] == 1500


def test_users_own_comm_hook_is_kept_and_timing_degrades_with_one_warning(tmp_path, caplog, single_process):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from ._jobs import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        calls = []

        def users_hook(state, bucket):
            calls.append(bucket.index())
            return allreduce_hook(None, bucket)

        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        ddp.register_comm_hook(None, users_hook)
        # By default the agent registers no comm hook: the user's is never in the way, and nothing is warned.
        for run_id, comm_hook, warnings in (("default", False, 0), ("h", True, 1)):
            mon = ranksight.init(
                run_dir=str(tmp_path), job="hook", run_id=run_id, flush_interval_s=0.1, comm_hook=comm_hook
            )
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="ranksight"):
                _tiny_training_with(mon, ddp, steps=3)
            mon.close()
            assert calls  # the user's hook still runs
            assert sum("could not register a comm hook" in r.getMessage() for r in caplog.records) == warnings
            con = open_run(str(tmp_path / run_id))
            assert con.execute("SELECT count(*), count(compute_s) FROM steps").fetchone() == (3, 3)
    finally:
        dist.destroy_process_group()


def _tiny_training_with(mon, model, steps):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)
    for x, y in mon.loader([(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(steps)]):
        with mon.step():
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
