"""Fixes fitted to the job: templates filled from the features and context, and per-framework variants."""

from __future__ import annotations

import pytest

from ranksight.rules import evaluate, load_rules

from .test_rules_evaluate import HEALTHY, frame


@pytest.fixture(scope="module")
def rules():
    return load_rules().rules


def fix_of(rules, rule_id: str, features: dict, framework: str | None = None, ranks: int = 1) -> dict:
    feats = frame(**{f"r{r}": features for r in range(ranks)})
    context = {r: {"framework": framework} for r in feats} if framework else None
    return next(f for f in evaluate(rules, feats, context) if f["rule"] == rule_id)["fix"]


# A GPU rank with 8 cores of its own: 1 torch thread, 2 loader workers without pinning or prefetch tuning.
HUNGRY = {**HEALTHY, "data_wait_share": 0.3, "cpus_allowed": 64, "local_world_size": 8, "cpus_per_rank": 8.0}
HUNGRY.update(torch_threads=1, loader_num_workers=2, loader_prefetch_factor=2, loader_pin_memory=0)
HUNGRY.update(threads_demanded=24, oversubscription_ratio=0.375)


def test_worker_count_comes_from_the_current_loader_and_the_cores_per_rank(rules):
    fix = fix_of(rules, "input-bound", HUNGRY)
    # 2 workers now, 8 - 1 - 2 = 5 cores to spare: 2 + min(5, max(2, 2)) = 4; prefetch 2 -> 4.
    assert "4 DataLoader workers (now 2; this host leaves about 5 core(s) per rank" in fix["text"]
    assert "num_workers=4," in fix["snippet"] and "prefetch_factor=4" in fix["snippet"]
    assert fix["framework"] == "plain"
    # Few spare cores: never more workers than cores allow.
    tight = {**HUNGRY, "cpus_per_rank": 4.0}
    assert "num_workers=3," in fix_of(rules, "input-bound", tight)["snippet"]  # 2 + min(1, 2)
    # No spare core: no worker advice at all, and the numbers that say why.
    none_left = {**HUNGRY, "cpus_per_rank": 3.0}
    fix = fix_of(rules, "input-bound", none_left)
    assert fix["text"].startswith("No core to spare for loader workers: this node gives each of its 8 ranks 3.0 CPU(s)")
    assert "num_workers" not in fix["snippet"]


def test_unknown_host_still_gets_a_bounded_suggestion(rules):
    old_agent = {**HUNGRY, "cpus_per_rank": None, "cpus_allowed": None, "torch_threads": None}
    fix = fix_of(rules, "input-bound", old_agent)
    assert "num_workers=4," in fix["snippet"]  # 2 now + min(4 assumed spare, 2)


def test_transformers_gets_training_arguments(rules):
    fix = fix_of(rules, "input-bound", HUNGRY, "transformers")
    assert fix["framework"] == "transformers"
    assert "TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=True" in fix["snippet"]
    assert "dataloader_prefetch_factor=4" in fix["snippet"] and "4 dataloader workers (now 2" in fix["text"]
    scan = {**HEALTHY, "find_unused_parameters": 1, "unused_parameter_size": 0, "ddp_stats_iteration": 10}
    fix = fix_of(rules, "unused-parameter-scan", scan, "transformers")
    assert fix["snippet"].strip() == "args = TrainingArguments(..., ddp_find_unused_parameters=False)"


def test_lightning_gets_its_strategy_and_datamodule(rules):
    fix = fix_of(rules, "input-bound", HUNGRY, "lightning")
    assert "class Data(L.LightningDataModule):" in fix["snippet"] and "num_workers=4," in fix["snippet"]
    assert "from the LightningDataModule" in fix["text"]
    scan = {**HEALTHY, "find_unused_parameters": 1, "unused_parameter_size": 0, "ddp_stats_iteration": 10}
    fix = fix_of(rules, "unused-parameter-scan", scan, "lightning")
    assert "Trainer(strategy=DDPStrategy(find_unused_parameters=False))" in fix["snippet"]


def test_accelerate_and_plain_pytorch(rules):
    scan = {**HEALTHY, "find_unused_parameters": 1, "unused_parameter_size": 0, "ddp_stats_iteration": 10}
    fix = fix_of(rules, "unused-parameter-scan", scan, "accelerate")
    assert "DistributedDataParallelKwargs(find_unused_parameters=False)" in fix["snippet"]
    fix = fix_of(rules, "unused-parameter-scan", scan, "run")  # `ranksight run`: plain PyTorch code
    assert (
        fix["framework"] == "plain"
        and "DDP(model, device_ids=[local_rank], find_unused_parameters=False)" in (fix["snippet"])
    )


def test_bucket_size_is_fitted_per_framework(rules):
    sync = {**HEALTHY, "comm_floor_share": 0.3, "grad_bytes_per_step": 200 << 20, "allreduce_wire_s": 0.2}
    sync.update(bucket_cap_bytes=512 << 20, bucket_cap_mb=512.0)
    assert "DDPStrategy(bucket_cap_mb=50," in fix_of(rules, "exposed-allreduce", sync, "lightning", 2)["snippet"]
    assert "ddp_bucket_cap_mb=50)" in fix_of(rules, "exposed-allreduce", sync, "transformers", 2)["snippet"]
    assert (
        "DistributedDataParallelKwargs(bucket_cap_mb=50,"
        in (fix_of(rules, "exposed-allreduce", sync, "accelerate", 2)["snippet"])
    )
    plain = fix_of(rules, "exposed-allreduce", sync, None, 2)
    assert (
        "bucket_cap_mb=50," in plain["snippet"]
        and "200.0 MB per step go in 1 bucket(s) of up to 512 MB" in (plain["text"])
    )


def test_blocking_collectives_fix_names_what_blocks(rules):
    blocked = {**HEALTHY, "comm_blocked_floor_share": 0.2, "collectives_per_step": 2}
    feats = frame(r0=blocked, r1=blocked)
    ctx = {r: {"top_collectives": "barrier x1.0/step (user), all_reduce x1.0/step (user)"} for r in feats}
    f = next(f for f in evaluate(rules, feats, ctx) if f["rule"] == "blocking-collectives")
    assert "2 per step (barrier x1.0/step (user), all_reduce x1.0/step (user))" in f["summary"]
    assert "async_op=True" in f["fix"]["snippet"] and "every N steps" in f["fix"]["text"]
    ctx = {r: {**ctx[r], "framework": "lightning"} for r in feats}
    f = next(f for f in evaluate(rules, feats, ctx) if f["rule"] == "blocking-collectives")
    assert "sync_dist=False" in f["fix"]["snippet"]
    fsdp = {**blocked, "fsdp": 1}
    f = next(f for f in evaluate(rules, frame(r0=fsdp, r1=fsdp)) if f["rule"] == "blocking-collectives")
    assert "reshard_after_forward" in f["fix"]["snippet"]


# A GPU job whose step syncs the host 3 times besides its batch copies (the Hugging Face Trainer's loss filter).
SYNCING = {**HEALTHY, "model_on_gpu": 1, "gpu_busy_ratio": 0.7, "idle_ratio": 0.3, "idle_host_wait_ratio": 0.2}
SYNCING.update(host_syncs_per_step=5.0, copy_syncs_per_step=2.0, sync_op_share=0.05, sync_drain_idle_share=0.1)


@pytest.mark.parametrize(
    ("framework", "names"),
    [
        ("transformers", ["logging_nan_inf_filter=False"]),
        ("lightning", ["sync_dist", "log_every_n_steps"]),
        ("accelerate", ["accelerator.gather(loss.detach())", "step % 50"]),
        (None, ["set_sync_debug_mode", "step % 50"]),
    ],
)
def test_host_sync_fix_names_the_frameworks_own_setting(rules, framework, names):
    fix = fix_of(rules, "input-path-syncs", SYNCING, framework)
    assert fix["framework"] == (framework or "plain")
    assert all(name in fix["snippet"] for name in names), fix
