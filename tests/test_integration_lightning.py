"""Lightning: the docs' example on a real 2-process DDP job (gloo), with a slow and a healthy loader."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from .test_integration_support import (
    assert_diagnosis,
    assert_input_bound_vs_healthy,
    assert_two_ranks_recorded,
    breakdown,
    example,
    run_job,
)

pytest.importorskip("lightning", reason="install the extra: pip install 'ranksight[lightning]'")
pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    runs_dir = tmp / "runs"
    cmd = [sys.executable, example("lightning_train.py"), "--run-dir", str(runs_dir), "--steps", str(STEPS)]
    run_job(cmd + ["--slow-data"], cwd=str(tmp), run_id="lightning-slow")
    # No run id from the environment: Lightning's launcher re-runs the script for rank 1 as a child of
    # rank 0, and the callback must still put both ranks in one run.
    run_job(cmd, cwd=str(tmp), run_id=None)
    (healthy,) = [d for d in os.listdir(runs_dir) if d != "lightning-slow"]
    return {"slow": str(runs_dir / "lightning-slow"), "healthy": str(runs_dir / healthy)}


def test_both_ranks_record_every_batch_under_one_run(runs):
    for path in runs.values():
        assert_two_ranks_recorded(path, STEPS)


def test_data_wait_dominates_only_with_the_slow_loader(runs):
    assert_input_bound_vs_healthy(breakdown(runs["slow"]), breakdown(runs["healthy"]))
    assert_diagnosis(runs["slow"], runs["healthy"])


def test_ddp_model_phases_are_measured(runs):
    from ranksight.collectors import open_run

    con = open_run(runs["healthy"])
    # Forward pre-hook on the strategy's DDP module, DDP's sync marks (exposed all-reduce, its bucket count),
    # optimizer from the hooks. No per-bucket rows: the comm hook is opt-in (Config.comm_hook).
    missing = con.execute(
        "SELECT count(*) FROM steps WHERE step >= 1 AND (compute_s IS NULL OR optimizer_s IS NULL OR buckets IS NULL "
        "OR comm_exposed_s IS NULL)"
    ).fetchone()[0]
    assert missing == 0
    assert con.execute("SELECT count(DISTINCT rank) FROM steps WHERE buckets >= 1").fetchone()[0] == 2


def test_disabled_callback_adds_no_work(tmp_path, monkeypatch):
    """With RANKSIGHT_DISABLED=1: no agent thread, no files, no hook on the model or the optimizer."""
    import torch
    from lightning.pytorch import Trainer

    from ranksight.agent import NoopMonitor
    from ranksight.integrations.lightning import RanksightCallback

    sys.path.insert(0, os.path.dirname(example("lightning_train.py")))
    try:
        from lightning_train import Regressor, Samples
    finally:
        sys.path.pop(0)

    monkeypatch.setenv("RANKSIGHT_DISABLED", "1")
    model = Regressor(width=16, depth=1)
    seen_optimizers = []

    class Spy(RanksightCallback):
        def on_train_end(self, trainer, pl_module):
            seen_optimizers.extend(trainer.optimizers)

    callback = Spy(run_dir=str(tmp_path / "runs"))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, torch.utils.data.DataLoader(Samples(48, 0.0), batch_size=16))
    assert isinstance(callback.monitor, NoopMonitor)
    assert not any(t.name == "ranksight-agent" for t in threading.enumerate())
    assert not (tmp_path / "runs").exists()
    assert not model._forward_pre_hooks
    assert seen_optimizers and all(not opt._optimizer_step_post_hooks for opt in seen_optimizers)
