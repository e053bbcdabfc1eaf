"""Shared pieces of the integration tests (running the docs' examples, reading their records), and the
in-process tests of the implicit step marks that Accelerate and ``ranksight run`` use."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import ranksight
from ranksight.collectors import open_run, read_rank_meta
from ranksight.collectors._queries import step_breakdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "docs", "integrations", "examples")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
WARMUP = 3  # leading steps per rank left out of shares (process group and allocator warm-up)


def example(name: str) -> str:
    """Path of a docs example: the tests run exactly the files the docs show."""
    return os.path.join(EXAMPLES, name)


def run_job(cmd: list[str], cwd: str, run_id: str | None, env: dict | None = None, timeout_s: float = 240) -> None:
    """Run a job to completion in a subprocess; fail with its output tail if it fails.

    ``run_id=None`` leaves the run id to the integration (no ``RANKSIGHT_*`` variable reaches the job).
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    full_env.update(OMP_NUM_THREADS="1", **(env or {}))
    if run_id is not None:
        full_env.update(RANKSIGHT_RUN_ID=run_id, RANKSIGHT_FLUSH_INTERVAL_S="0.5")
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def breakdown(run_path: str) -> dict[int, dict]:
    """Per-rank step breakdown of a finished run, keyed by rank."""
    return {r["rank"]: r for r in step_breakdown(open_run(run_path), warmup_steps=WARMUP)}


def assert_two_ranks_recorded(run_path: str, steps: int) -> None:
    """Both ranks wrote every step under one run id, and finished cleanly."""
    con = open_run(run_path)
    per_rank = dict(con.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall())
    assert per_rank == {0: steps, 1: steps}
    assert con.execute("SELECT DISTINCT run, world_size FROM steps").fetchall() == [(os.path.basename(run_path), 2)]
    metas = read_rank_meta(run_path)
    assert sorted(m.rank for m in metas) == [0, 1]
    assert all(m.status == "finished" for m in metas)


def assert_input_bound_vs_healthy(slow: dict[int, dict], healthy: dict[int, dict]) -> None:
    """Data wait dominates every rank of the slow-loader job and stays small in the healthy one."""
    phases = ("data_wait", "compute", "comm_exposed", "optimizer", "other")
    for rank in (0, 1):
        s, h = slow[rank], healthy[rank]
        top = max(phases, key=lambda p: s[f"{p}_share"] or 0)
        assert top == "data_wait" and s["data_wait_share"] >= 0.4, (rank, s)
        assert h["data_wait_share"] <= 0.2, (rank, h)
        assert s["data_wait_share"] >= 3 * max(h["data_wait_share"], 0.01), (rank, s, h)
        assert h["compute_share"] > h["data_wait_share"], (rank, h)


def assert_diagnosis(slow_path: str, healthy_path: str) -> None:
    """``ranksight diagnose`` names input-bound first for the slow job, and not as critical for the healthy one."""
    from ranksight.rules import diagnose

    slow = diagnose(slow_path)["findings"]
    assert slow and slow[0]["rule"] == "input-bound" and sorted(slow[0]["ranks"]) == [0, 1], slow[:1]
    healthy = diagnose(healthy_path)["findings"]
    assert not [f for f in healthy if f["rule"] == "input-bound" and f["severity"] == "critical"], healthy


# ----------------------------------------------------------------- implicit step marks, in process
@pytest.fixture
def monitor(tmp_path):
    mon = ranksight.init(run_dir=str(tmp_path), job="implicit", run_id="implicit", flush_interval_s=30)
    yield mon
    mon.close()


def test_a_step_opens_at_a_batch_and_closes_at_the_optimizer_step(monitor, tmp_path):
    import torch

    from ranksight.integrations._common import ImplicitSteps, TimedLoader

    steps = ImplicitSteps(monitor)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_pre_hook(steps.optimizer_pre)
    opt.register_step_post_hook(steps.optimizer_post)

    class SlowList(list):
        pass

    batches = SlowList(torch.randn(2, 4) for _ in range(8))
    batches.marker = "passes through"
    loader = TimedLoader(batches, steps, monitor._clock)
    assert loader.marker == "passes through" and len(loader) == 8

    def slow_iter():
        for b in batches:
            time.sleep(0.01)
            yield b

    timed = TimedLoader(slow_iter(), steps, monitor._clock)
    for i, x in enumerate(timed):
        model(x).sum().backward()
        if i % 2 == 1:  # gradient accumulation over two batches: 4 optimizer steps
            opt.step()
            opt.zero_grad()
    for x in TimedLoader(batches[:3], steps, monitor._clock):  # an evaluation loop: no optimizer step
        model(x)
    monitor.close()
    rows = (
        open_run(str(tmp_path / "implicit"))
        .execute("SELECT step, step_s, data_wait_s, optimizer_s FROM steps ORDER BY step")
        .fetchall()
    )
    assert [r[0] for r in rows] == [0, 1, 2, 3]  # the evaluation loop's step was dropped
    for _, step_s, wait_s, opt_s in rows:
        assert 0.009 <= wait_s < step_s  # the first batch's wait of each step
        assert opt_s is not None and 0 < opt_s < step_s
        assert step_s >= 0.019  # two batches of 10 ms each


def test_timed_iterator_never_raises_into_the_loop_when_marks_fail(monitor):
    from ranksight.integrations._common import ImplicitSteps, TimedIterator

    class Broken(ImplicitSteps):
        def fetched(self, source, begin_ns):
            raise RuntimeError("boom")

    assert list(TimedIterator(iter([1, 2, 3]), Broken(monitor), monitor._clock)) == [1, 2, 3]
    assert monitor.errors == {"loader_marks": 3}  # counted, not swallowed; reported once


def test_disabled_start_monitor_starts_nothing(tmp_path, monkeypatch):
    from ranksight.agent import NoopMonitor
    from ranksight.integrations._common import start_monitor

    monkeypatch.setenv("RANKSIGHT_DISABLED", "1")
    before = {t.name for t in threading.enumerate()}
    mon = start_monitor({"run_dir": str(tmp_path / "runs"), "job": "off"})
    assert isinstance(mon, NoopMonitor)
    assert {t.name for t in threading.enumerate()} == before
    assert not (tmp_path / "runs").exists()
