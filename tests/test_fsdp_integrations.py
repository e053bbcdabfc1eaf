"""FSDP2 through the frameworks: what ranksight records when Lightning's ModelParallelStrategy shards the
model (the docs' example, a real 2-process gloo job), and what it says when Accelerate cannot."""

from __future__ import annotations

import sys

import pytest

from ranksight.collectors import open_run, read_rank_meta

from .test_integration_support import example, run_job

pytestmark = pytest.mark.slow
STEPS = 10


def test_lightning_model_parallel_strategy_is_recorded_as_fsdp2_per_unit_and_pass(tmp_path):
    pytest.importorskip("lightning", reason="install the extra: pip install 'ranksight[lightning]'")
    runs = tmp_path / "runs"
    cmd = [sys.executable, example("lightning_fsdp2_train.py"), "--run-dir", str(runs), "--steps", str(STEPS),
           "--batch", "256"]  # fmt: skip
    run_job(cmd, cwd=str(tmp_path), run_id="lightning-fsdp2")
    path = str(runs / "lightning-fsdp2")
    meta = {m.rank: m.data for m in read_rank_meta(path)}
    assert sorted(meta) == [0, 1]
    for data in meta.values():
        assert data["framework"] == "lightning" and data["parallelism"] == "fsdp2"
        assert data["fsdp"]["units_with_params"] == 5 and data["fsdp"]["backend"] == "gloo"
    con = open_run(path)
    ops = dict(
        con.execute(
            "SELECT op, sum(count) FROM collectives WHERE rank = 0 AND origin = 'fsdp' AND step = 5 GROUP BY op"
        ).fetchall()
    )
    # 4 blocks and the LightningModule itself (the head's unit); the root is not resharded for backward.
    assert ops == {"all_gather_forward": 5, "all_gather_backward": 4, "reduce_scatter": 5}, ops
    watch = [m for (m,) in con.execute("SELECT message FROM events WHERE component = 'watch'").fetchall()]
    assert len(watch) == 2 and all(m.startswith("FSDP2 (5 fully_shard units") for m in watch), watch


def test_accelerate_on_cpu_wraps_ddp_instead_and_the_watch_event_says_so(tmp_path):
    """Accelerate's FSDP needs GPUs: with cpu=True it ignores the FSDP plugin and wraps DDP. The example
    on CPU shows what a user sees then: the watch event names DDP, not FSDP2."""
    pytest.importorskip("accelerate")
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", example("accelerate_fsdp2_train.py"),
           "--run-dir", str(runs), "--steps", "6", "--batch", "128", "--cpu"]  # fmt: skip
    run_job(cmd, cwd=str(tmp_path), run_id="accelerate-fsdp2-cpu")
    path = str(runs / "accelerate-fsdp2-cpu")
    assert {m.data["parallelism"] for m in read_rank_meta(path)} == {"ddp"}
    con = open_run(path)
    watch = [m for (m,) in con.execute("SELECT message FROM events WHERE component = 'watch'").fetchall()]
    assert watch and all(m.startswith("DDP:") for m in watch), watch
