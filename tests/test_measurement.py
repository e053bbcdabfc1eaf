"""What the agent sees on loops the way real scripts write them: no DataLoader, gradient accumulation,
metric collectives, FSDP2, a crash and a SIGTERM. Real gloo jobs; the truth is each rank's own clock."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ranksight.collectors import open_run, read_rank_meta

from ._loops import Loop, run, truth

pytestmark = pytest.mark.slow
WARMUP = 3


def _sums(con, rank: int) -> dict:
    row = con.execute(
        """SELECT sum(step_s), sum(data_wait_s), count(data_wait_s), sum(comm_blocked_s), sum(collectives),
                  sum(compute_s), count(*)
           FROM steps WHERE rank = ? AND step >= ?""",
        [rank, WARMUP],
    ).fetchone()
    keys = ("step_s", "data_wait_s", "data_rows", "comm_blocked_s", "collectives", "compute_s", "rows")
    return dict(zip(keys, row))


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory):
    """The same no-DataLoader loop, fetches marked with mon.data() and not; with metric collectives."""
    tmp = tmp_path_factory.mktemp("loops")
    marked, _ = run(Loop(str(tmp / "runs"), str(tmp / "marked"), run_id="marked", metrics=True))
    unmarked, _ = run(Loop(str(tmp / "runs"), str(tmp / "unmarked"), run_id="unmarked", mark_data=False))
    return {"marked": (marked, str(tmp / "marked")), "unmarked": (unmarked, str(tmp / "unmarked"))}


def test_marked_fetches_give_the_data_share_the_wall_clock_gives(nanogpt):
    path, out = nanogpt["marked"]
    con = open_run(path)
    for rank in (0, 1):
        agent = _sums(con, rank)
        t = truth(out, rank)
        true_share = sum(t["fetch_s"][WARMUP:]) / sum(t["iter_s"][WARMUP:])
        share = agent["data_wait_s"] / agent["step_s"]
        assert agent["data_rows"] == agent["rows"] == 30 - WARMUP
        assert share == pytest.approx(true_share, abs=0.03), (rank, share, true_share)
        assert true_share > 0.15  # the planted fetch is a real part of the step


def test_a_prefetch_inside_the_step_is_data_not_compute(nanogpt):
    path, _ = nanogpt["marked"]
    con = open_run(path)
    # Forward 2x + backward of a tiny MLP (a few ms on a loaded 2-core machine) is well under the 12 ms
    # prefetch that ran inside forward/backward: were the prefetch counted, compute would exceed it.
    median_compute = con.execute("SELECT median(compute_s) FROM steps WHERE step >= ?", [WARMUP]).fetchone()[0]
    assert median_compute < Loop.prefetch_s, median_compute


def test_unmarked_input_is_not_measured_rather_than_zero(nanogpt):
    path, _ = nanogpt["unmarked"]
    con = open_run(path)
    for rank in (0, 1):
        agent = _sums(con, rank)
        assert agent["rows"] == 30 - WARMUP and agent["data_rows"] == 0  # NULL in every row, never 0.0
    meta = {m.rank: m.data for m in read_rank_meta(path)}
    assert all("data_source" not in d for d in meta.values())
    from ranksight.collectors._queries import step_breakdown

    for row in step_breakdown(con, warmup_steps=WARMUP):
        assert row["data_wait_share"] is None, row


def test_metric_all_reduce_and_barrier_are_timed_per_step(nanogpt):
    path, _ = nanogpt["marked"]
    con = open_run(path)
    ops = dict(
        con.execute("SELECT op, sum(count) FROM collectives WHERE rank = 0 AND origin = 'user' GROUP BY op").fetchall()
    )
    assert ops == {"all_reduce": 30, "barrier": 30}
    for rank in (0, 1):
        agent = _sums(con, rank)
        assert agent["collectives"] == 2 * (30 - WARMUP)
        assert agent["comm_blocked_s"] > 0
    # DDP's own bucket all-reduces are in the same table, once per step (the last micro-step syncs).
    ddp = con.execute("SELECT count(*), min(count) FROM collectives WHERE rank = 0 AND origin = 'ddp'").fetchone()
    assert ddp[0] == 30 and ddp[1] >= 1
    unmarked = open_run(nanogpt["unmarked"][0])
    assert unmarked.execute("SELECT count(*) FROM collectives WHERE origin = 'user'").fetchone()[0] == 0


def test_ddp_bucket_bytes_equal_the_gradient_bytes_after_the_rebuild(nanogpt):
    path, _ = nanogpt["marked"]
    con = open_run(path)
    grad_bytes = {m.rank: m.data["ddp"]["grad_bytes"] for m in read_rank_meta(path)}
    per_step = con.execute("SELECT rank, min(bucket_bytes), max(bucket_bytes) FROM steps GROUP BY rank").fetchall()
    for rank, low, high in per_step:
        # DDP rebuilds its buckets after the first step; every step, before and after, sends the gradients once.
        assert low == pytest.approx(grad_bytes[rank], rel=0.01) and high == pytest.approx(grad_bytes[rank], rel=0.01)


def test_fsdp2_all_gather_and_reduce_scatter_are_timed(tmp_path):
    path, _ = run(Loop(str(tmp_path / "runs"), str(tmp_path / "out"), kind="fsdp2", run_id="fsdp", steps=12))
    con = open_run(path)
    ops = {
        op: (n, size, held)
        for op, n, size, held in con.execute(
            "SELECT op, sum(count), sum(bytes), sum(blocked_s) FROM collectives "
            "WHERE rank = 0 AND origin = 'fsdp' AND step >= ? GROUP BY op",
            [WARMUP],
        ).fetchall()
    }
    # torch 2.13 names them *_single, earlier releases all_gather_into_tensor / reduce_scatter_tensor; on gloo
    # some releases reduce gradients with all_reduce.
    gathers = [op for op in ops if op.startswith("all_gather")]
    reduces = [op for op in ops if op.startswith(("reduce_scatter", "all_reduce"))]
    assert gathers and reduces, ops
    for n, size, held in ops.values():
        assert n >= 12 - WARMUP and size > 0 and held > 0
    agent = _sums(con, 0)
    assert agent["comm_blocked_s"] / agent["step_s"] > 0.05  # all-gathers hold every forward and backward
    meta = {m.rank: m.data for m in read_rank_meta(path)}
    assert meta[0]["parallelism"] == "fsdp2" and meta[0]["fsdp"]["units"] == 5


@pytest.mark.parametrize("end, status", [("raise", "crashed"), ("sigterm", "terminated")])
def test_a_rank_that_raised_or_was_signalled_says_so_and_keeps_its_steps(tmp_path, end, status):
    path, codes = run(Loop(str(tmp_path / "runs"), str(tmp_path / "out"), run_id=end, steps=15, end=end))
    if end == "sigterm":
        assert codes == [-signal.SIGTERM] * 2  # the signal still ended the process
    else:
        assert codes == [1, 1]
    con = open_run(path)
    assert dict(con.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall()) == {0: 15, 1: 15}
    assert sorted(m.status for m in read_rank_meta(path)) == [status, status]


def test_framework_work_between_batches_is_not_data_wait(tmp_path):
    """Lightning (one process): data wait is the DataLoader's own __next__, not the callback work between
    batches (a 6 ms on_train_batch_end here, standing for logging)."""
    pl = pytest.importorskip("lightning.pytorch", reason="install the extra: pip install 'ranksight[lightning]'")
    import time

    import torch

    from ranksight.integrations.lightning import RanksightCallback

    fetched = []

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            t = time.perf_counter()
            time.sleep(0.0005)
            fetched.append(time.perf_counter() - t)
            return torch.randn(8), torch.randn(1)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Logging(pl.Callback):
        def on_train_batch_end(self, *args):
            time.sleep(0.006)

    cb = RanksightCallback(run_dir=str(tmp_path / "runs"), job="lt", run_id="lt", flush_interval_s=0.3)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=25, callbacks=[cb, Logging()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Net(), torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=0))
    con = open_run(str(tmp_path / "runs" / "lt"))
    (wait,) = con.execute("SELECT median(data_wait_s) FROM steps WHERE step >= ?", [WARMUP]).fetchone()
    per_batch = 8 * sorted(fetched)[len(fetched) // 2]
    assert wait == pytest.approx(per_batch, rel=0.3), (wait, per_batch)  # getitem x 8 plus collate
    assert wait < per_batch + 0.003  # the 6 ms of callback work between batches is not counted
    (meta,) = read_rank_meta(str(tmp_path / "runs" / "lt"))
    assert meta.data["framework"] == "lightning" and meta.data["data_source"] == "framework"


def test_warnings_reported_during_the_final_flush_are_written(tmp_path):
    import ranksight

    mon = ranksight.init(run_dir=str(tmp_path), job="t", run_id="final", flush_interval_s=60)
    calls = []

    def sampler():
        calls.append(1)
        mon.report_failure("late_sampler", RuntimeError("reported while the last flush ran"))
        return []

    mon.add_sampler(sampler)
    with mon.step():
        pass
    mon.close()
    assert calls  # it ran at the final flush (the interval never came)
    con = open_run(os.path.join(str(tmp_path), "final"))
    messages = [m for (m,) in con.execute("SELECT message FROM events WHERE component = 'late_sampler'").fetchall()]
    assert messages == ["RuntimeError: reported while the last flush ran"]
    with open(os.path.join(str(tmp_path), "final", "ranks", "rank-00000.json")) as f:
        assert json.load(f)["counters"]["agent_errors"] == {"late_sampler": len(calls)}


def test_the_all_reduce_done_mark_fires_after_ddp_waited_for_its_buckets(tmp_path):
    """The NCCL path's marks (one post-accumulate hook, one autograd final callback) on a gloo job whose
    peer is 50 ms late: "done" must come after DDP's wait for the all-reduce, not at the end of backward."""
    import torch.multiprocessing as mp

    from ._jobs import free_port
    from ._loops import backward_marks_main

    mp.start_processes(backward_marks_main, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    with open(tmp_path / "marks-rank0.json") as f:
        marks = json.load(f)[2:]  # after DDP's bucket rebuild
    for ready, done, backward in marks:
        assert ready < 0.02  # backward itself is short
        assert done - ready > 0.03  # the wait for the late peer lies between the two marks
        assert done <= backward


def test_time_outside_every_phase_gets_a_name(tmp_path):
    """A step whose 'other' time is a logging helper (after optimizer.step()): the sampled stack window
    names it, and data waits inside mon.data() are not counted as 'other'."""
    import time

    import torch

    import ranksight
    from ranksight.agent._stack_window import StackWindow

    mon = ranksight.init(run_dir=str(tmp_path), job="t", run_id="other", flush_interval_s=0.2, stack_window=False)
    window = StackWindow(mon, first_after_s=0.0, window_s=0.8, hz=200)
    mon.add_sampler(window)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, optimizer=opt)

    def log_metrics_slowly():
        time.sleep(0.008)  # stands for formatting and writing logs every step

    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        with mon.data():
            time.sleep(0.004)
            x = torch.randn(4, 8)
        with mon.step():
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            log_metrics_slowly()
    mon.close()
    meta = read_rank_meta(os.path.join(str(tmp_path), "other"))[0].data
    top = meta["host_other_top"]
    assert top["other_samples"] > 20 and top["phases"]["data"] > 10
    assert top["top"][0]["where"].startswith("log_metrics_slowly (test_measurement.py:")
    assert top["top"][0]["share"] > 0.8
    from ranksight.rules import diagnose

    result = diagnose(os.path.join(str(tmp_path), "other"))
    (finding,) = [f for f in result["findings"] if f["rule"] == "unexplained-host-time"]
    # 64 % of the step outside every phase: past a fifth, the run is never called healthy (a warning).
    assert "log_metrics_slowly" in finding["summary"] and finding["severity"] == "warning"
    assert result["other_time"][0]["top"][0]["where"].startswith("log_metrics_slowly")
