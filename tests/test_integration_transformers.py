"""Hugging Face Trainer: the docs' example (tiny GPT-2 from a config, nothing downloaded) under torchrun
with 2 CPU processes, with a slow and a healthy dataset."""

from __future__ import annotations

import os
import sys
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

pytest.importorskip("transformers", reason="install the extra: pip install 'ranksight[transformers]'")
pytestmark = pytest.mark.slow

STEPS = 10
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # prove: no download


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("transformers")
    cmd = TORCHRUN + [example("transformers_train.py"), "--run-dir", str(tmp / "runs"), "--steps", str(STEPS)]
    run_job(cmd + ["--slow-data"], cwd=str(tmp), run_id="hf-slow", env=OFFLINE)
    run_job(cmd, cwd=str(tmp), run_id="hf-healthy", env=OFFLINE)
    return {"slow": str(tmp / "runs" / "hf-slow"), "healthy": str(tmp / "runs" / "hf-healthy")}


def test_both_ranks_record_every_optimizer_step(runs):
    for path in runs.values():
        assert_two_ranks_recorded(path, STEPS)


def test_data_wait_dominates_only_with_the_slow_dataset(runs):
    assert_input_bound_vs_healthy(breakdown(runs["slow"]), breakdown(runs["healthy"]))
    assert_diagnosis(runs["slow"], runs["healthy"])


def test_the_trainers_ddp_model_is_found_and_timed(runs):
    from ranksight.collectors import open_run, read_rank_meta

    con = open_run(runs["healthy"])
    missing = con.execute(
        "SELECT count(*) FROM steps WHERE step >= 1 AND (compute_s IS NULL OR optimizer_s IS NULL OR buckets IS NULL)"
    ).fetchone()[0]
    assert missing == 0
    assert all(
        m.data.get("model", {}).get("class") == "DistributedDataParallel" for m in read_rank_meta(runs["healthy"])
    )


def test_disabled_callback_adds_no_work(tmp_path, monkeypatch):
    """With RANKSIGHT_DISABLED=1: no agent thread, no files, no hook on the model."""
    from transformers import Trainer, TrainingArguments

    from ranksight.agent import NoopMonitor
    from ranksight.integrations.transformers import RanksightCallback

    sys.path.insert(0, os.path.dirname(example("transformers_train.py")))
    try:
        from transformers_train import Tokens
    finally:
        sys.path.pop(0)
    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setenv("RANKSIGHT_DISABLED", "1")
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=16, vocab_size=64))
    callback = RanksightCallback(run_dir=str(tmp_path / "runs"))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=Tokens(16, 16, 64, 0.0), callbacks=[callback]).train()
    assert isinstance(callback.monitor, NoopMonitor)
    assert not any(t.name == "ranksight-agent" for t in threading.enumerate())
    assert not (tmp_path / "runs").exists()
    assert not model._forward_pre_hooks
