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
    # The fastest step of each run: a busy host only adds time, so the least compute of 22 steps is the one
    # least stretched by the machine's other work (the medians of two runs read 1.04x apart at load 5).
    q = "SELECT min(compute_s), count(*) FILTER (WHERE buckets IS NULL OR optimizer_s IS NULL) FROM steps"
    slow_compute, slow_missing = slow.execute(q + " WHERE step >= 1").fetchone()
    acc_compute, acc_missing = healthy.execute(q + " WHERE step >= 1").fetchone()
    assert slow_missing == 0 and acc_missing == 0
    # Two micro-batches of forward/backward per accumulated step: clearly more compute than one. Not twice:
    # the all-reduce after the last backward and the hooks come once a step, and a loaded host squeezes the
    # ratio further; one micro-batch's compute against itself would read 1.0x.
    assert acc_compute > 1.25 * slow_compute, (acc_compute, slow_compute)


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
