"""Accelerate: the docs' example under torchrun with 2 CPU processes, a slow and a healthy loader (the
healthy one with gradient accumulation, so a step must be one optimizer step over two batches)."""

from __future__ import annotations

import threading

import pytest

from .test_integration_support import (
    TORCHRUN,
    assert_diagnosis,
    assert_input_bound_vs_healthy,
    assert_two_ranks_recorded,
    breakdown,
    example,
    run_job,
)

pytest.importorskip("accelerate", reason="install the extra: pip install 'ranksight[accelerate]'")
pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accelerate")
    cmd = TORCHRUN + [example("accelerate_train.py"), "--run-dir", str(tmp / "runs"), "--steps", str(STEPS)]
    run_job(cmd + ["--slow-data"], cwd=str(tmp), run_id="acc-slow")
    run_job(cmd + ["--accumulate", "2"], cwd=str(tmp), run_id="acc-healthy")
    return {"slow": str(tmp / "runs" / "acc-slow"), "healthy": str(tmp / "runs" / "acc-healthy")}


def test_both_ranks_record_one_step_per_optimizer_step(runs):
    for path in runs.values():
        assert_two_ranks_recorded(path, STEPS)  # with accumulation too: 2 * STEPS batches, STEPS steps


def test_data_wait_dominates_only_with_the_slow_loader(runs):
    assert_input_bound_vs_healthy(breakdown(runs["slow"]), breakdown(runs["healthy"]))
    assert_diagnosis(runs["slow"], runs["healthy"])


def test_accumulated_step_spans_two_forwards_and_one_all_reduce(runs):
    from ranksight.collectors import open_run

    slow, healthy = open_run(runs["slow"]), open_run(runs["healthy"])
    q = """SELECT median(compute_s), median(cpu_s),
                  count(*) FILTER (WHERE buckets IS NULL OR optimizer_s IS NULL) FROM steps WHERE step >= 1"""
    _, slow_cpu, slow_missing = slow.execute(q).fetchone()
    acc_compute, acc_cpu, acc_missing = healthy.execute(q).fetchone()
    assert slow_missing == 0 and acc_missing == 0  # every step has its all-reduce and its optimizer step
    # Two micro-batches of forward/backward per step: the training thread's CPU time, which a busy host does
    # not stretch, reads 1.6-1.8x one micro-batch's step (idle and beside a busy loop; 1.0x if a step were
    # one micro-batch). Wall-clock compute of two runs is no measure: beside one busy loop the fastest step of
    # each read the same.
    assert acc_cpu > 1.4 * slow_cpu, (acc_cpu, slow_cpu)
    # The compute phase spans both forwards and backwards, not the last alone: most of that work lies inside it
    # (wall time, which a busy host only lengthens; about half if compute began at the second forward).
    assert acc_compute > 0.7 * acc_cpu, (acc_compute, acc_cpu)


def test_disabled_tracker_adds_no_work(tmp_path, monkeypatch):
    import torch
    from accelerate import Accelerator

    from ranksight.agent import NoopMonitor
    from ranksight.integrations.accelerate import attach

    monkeypatch.setenv("RANKSIGHT_DISABLED", "1")
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    loader = [torch.randn(2, 4)]
    tracker = attach(accelerator, model, opt, run_dir=str(tmp_path / "runs"))
    assert isinstance(tracker.monitor, NoopMonitor)
    assert tracker.loader(loader) is loader
    assert not model._forward_pre_hooks and not opt.optimizer._optimizer_step_post_hooks
    assert not any(t.name == "ranksight-agent" for t in threading.enumerate())
    tracker.close()
    assert not (tmp_path / "runs").exists()
