"""The pure evaluator over small feature frames: firing, severity, absent signals, ranking, checklist."""

from __future__ import annotations

import pytest

from ranksight.collectors import FEATURES
from ranksight.rules import evaluate, load_rules, run_checklist


@pytest.fixture(scope="module")
def ruleset():
    return load_rules()


def frame(**per_rank) -> dict[int, dict]:
    """Features per rank: every known feature absent (None) unless given."""
    out = {}
    for key, values in per_rank.items():
        rank = int(key[1:])
        f = dict.fromkeys(FEATURES)
        f.update(rank=rank, steps=40, ranks_reporting=len(per_rank), world_size=len(per_rank))
        f.update(values)
        out[rank] = f
    return out


HEALTHY = dict(
    data_wait_share=0.004,
    compute_share=0.80,
    comm_exposed_share=0.16,
    comm_to_compute=0.2,
    comm_floor_share=0.16,
    comm_floor_to_compute=0.2,
    allreduce_share=0.16,
    buckets_per_step=1,
    grad_bytes_per_step=215556,
    step_median_s=0.07,
    compute_median_s=0.055,
    straggler_score=1.0,
    slowest_step_share=0.5,
    compute_vs_median=1.0,
    graph_breaks=0,
    recompiles=0,
    recompiles_after_warmup=0,
    compiled=0,
    find_unused_parameters=0,
)


def rules_of(findings):
    return [f["rule"] for f in findings]


def test_healthy_cpu_frame_has_no_warning_and_gpu_rules_stay_silent(ruleset):
    findings = evaluate(ruleset.rules, frame(r0=HEALTHY, r1=HEALTHY))
    assert all(f["severity"] == "info" for f in findings), findings
    # Every GPU signal is absent on this frame: none of the GPU rules may fire, even at info.
    gpu_rules = {"pageable-copies", "input-path-syncs", "cpu-ops", "fragmentation", "launch-bound", "memory-imbalance"}
    gpu_rules |= {"h2d-bound", "gpu-starved", "alloc-retries"}
    assert not gpu_rules & set(rules_of(findings))


def test_input_wait_levels_follow_the_anchored_thresholds(ruleset):
    for share, expected in ((0.03, None), (0.06, "warning"), (0.25, "critical")):
        f = frame(r0={**HEALTHY, "data_wait_share": share})
        hits = [x for x in evaluate(ruleset.rules, f) if x["rule"] == "input-bound"]
        assert (hits[0]["severity"] if hits else None) == expected, share
    hit = next(x for x in evaluate(ruleset.rules, frame(r0={**HEALTHY, "data_wait_share": 0.5})))
    assert hit["evidence"]["data_wait_share"] == 0.5
    assert "50%" in hit["summary"]
    assert hit["fix"]["snippet"] and "num_workers" in hit["fix"]["snippet"]


def test_confidence_grows_with_margin_and_steps(ruleset):
    def conf(share, steps):
        f = frame(r0={**HEALTHY, "data_wait_share": share, "steps": steps})
        return next(x for x in evaluate(ruleset.rules, f) if x["rule"] == "input-bound")["confidence"]

    assert conf(0.06, 40) < conf(0.5, 40)
    assert conf(0.5, 3) < conf(0.5, 40)
    assert 0 < conf(0.06, 3) and conf(0.5, 40) <= 0.95


def test_straggler_is_named_by_rank_and_the_others_wait_is_not_called_a_sync_problem(ruleset):
    floor = {"comm_floor_share": 0.01, "comm_floor_to_compute": 0.01}  # the slow rank waits for no one
    slow = {**HEALTHY, **floor, "compute_share": 0.98, "comm_exposed_share": 0.01, "comm_to_compute": 0.01}
    slow.update(straggler_score=0.36, slowest_step_share=1.0, compute_vs_median=1.47, compute_median_s=0.36)
    waiting = {**HEALTHY, **floor, "compute_share": 0.33, "comm_exposed_share": 0.66, "comm_to_compute": 2.0}
    waiting.update(slowest_step_share=0.0, compute_vs_median=0.53, compute_median_s=0.13)
    findings = evaluate(ruleset.rules, frame(r0=waiting, r1=slow))
    assert rules_of(findings) == ["straggler"]
    assert findings[0]["ranks"] == [1] and findings[0]["severity"] == "critical"


def test_a_straggler_and_a_real_sync_cost_are_both_reported(ruleset):
    # Sync-bound even on the slow rank (which waits for no peer) and one rank slower: both are real.
    # At equal severity the straggler comes first (priority); neither is called the other's consequence.
    floor = {"comm_floor_share": 0.12, "comm_floor_to_compute": 0.6}
    slow = {**HEALTHY, **floor, "straggler_score": 0.55, "slowest_step_share": 0.95, "compute_vs_median": 1.3}
    waiting = {**HEALTHY, **floor, "comm_exposed_share": 0.5, "comm_to_compute": 1.5, "slowest_step_share": 0.05}
    findings = evaluate(ruleset.rules, frame(r0=waiting, r1=slow))
    assert rules_of(findings)[:2] == ["straggler", "exposed-allreduce"]
    assert findings[0]["severity"] == "warning" and findings[1]["severity"] == "warning"
    assert "consequence" not in findings[1]["summary"]
    # A warning straggler next to a critical sync cost: the critical one first (measured under load).
    heavy = {"comm_floor_share": 0.4, "comm_floor_to_compute": 1.0}
    slow, waiting = {**slow, **heavy}, {**waiting, **heavy}
    assert rules_of(evaluate(ruleset.rules, frame(r0=waiting, r1=slow)))[:2] == ["exposed-allreduce", "straggler"]


def test_an_info_level_straggler_does_not_displace_a_critical_sync_finding(ruleset):
    # Measured on the loaded 2-core machine: the sync fault with one rank at 0.66 of the other's speed.
    floor = {"comm_floor_share": 0.4, "comm_floor_to_compute": 1.0, "comm_exposed_share": 0.4}
    slowish = {**HEALTHY, **floor, "straggler_score": 0.66, "slowest_step_share": 1.0, "compute_vs_median": 1.2}
    findings = evaluate(ruleset.rules, frame(r0={**HEALTHY, **floor}, r1=slowish))
    assert [(f["rule"], f["severity"]) for f in findings][:2] == [
        ("exposed-allreduce", "critical"),
        ("straggler", "info"),
    ]
    assert "consequence" not in findings[0]["summary"]


def test_straggler_levels_leave_contention_sized_gaps_at_info(ruleset):
    for score, expected in ((0.8, None), (0.74, "info"), (0.58, "warning"), (0.4, "critical")):
        slow = {**HEALTHY, "straggler_score": score, "slowest_step_share": 1.0}
        hits = [f for f in evaluate(ruleset.rules, frame(r0=HEALTHY, r1=slow)) if f["rule"] == "straggler"]
        assert (hits[0]["severity"] if hits else None) == expected, score


def test_inconsistent_slowness_is_not_called_a_straggler(ruleset):
    noisy = {**HEALTHY, "straggler_score": 0.7, "slowest_step_share": 0.6, "compute_vs_median": 1.15}
    findings = evaluate(ruleset.rules, frame(r0=noisy, r1=HEALTHY))
    assert "straggler" not in rules_of(findings)
    assert [f["severity"] for f in findings if f["rule"] == "compute-imbalance"] == ["info"]


def test_a_hungry_rank_is_input_bound_and_the_others_wait_is_not_a_sync_problem(ruleset):
    floor = {"comm_floor_share": 0.02, "comm_floor_to_compute": 0.04}  # the hungry rank waits for no one
    hungry = {**HEALTHY, **floor, "data_wait_share": 0.3, "compute_share": 0.5, "comm_exposed_share": 0.02}
    waiting = {**HEALTHY, **floor, "comm_exposed_share": 0.35, "comm_to_compute": 0.9, "compute_share": 0.4}
    findings = evaluate(ruleset.rules, frame(r0=hungry, r1=waiting))
    assert rules_of(findings) == ["input-bound"]
    assert findings[0]["ranks"] == [0] and findings[0]["severity"] == "critical"


def test_sync_bound_is_told_apart_from_healthy_exposed_comm(ruleset):
    sync = {**HEALTHY, "comm_exposed_share": 0.42, "compute_share": 0.43, "comm_to_compute": 0.98}
    sync.update(comm_floor_share=0.37, comm_floor_to_compute=0.72)
    first = evaluate(ruleset.rules, frame(r0=sync, r1=sync))[0]
    assert (first["axis"], first["rule"], first["severity"]) == ("sync", "exposed-allreduce", "critical")
    healthy = evaluate(ruleset.rules, frame(r0=HEALTHY, r1=HEALTHY))
    assert rules_of(healthy) == ["comm-latency"]


def test_unused_parameter_scan_needs_ddps_own_confirmation(ruleset):
    scanning = {**HEALTHY, "find_unused_parameters": 1, "ddp_stats_iteration": 10}
    assert "unused-parameter-scan" not in rules_of(evaluate(ruleset.rules, frame(r0=scanning)))
    confirmed = {**scanning, "unused_parameter_size": 0}
    assert "unused-parameter-scan" in rules_of(evaluate(ruleset.rules, frame(r0=confirmed)))
    really_unused = {**scanning, "unused_parameter_size": 4096}
    assert "unused-parameter-scan" not in rules_of(evaluate(ruleset.rules, frame(r0=really_unused)))


def test_graph_breaks_come_before_the_recompiles_they_cause(ruleset):
    compiled = {**HEALTHY, "compiled": 1, "graph_breaks": 11, "recompiles": 9, "recompiles_after_warmup": 9}
    findings = evaluate(ruleset.rules, frame(r0=compiled, r1=compiled))
    assert rules_of(findings)[:2] == ["graph-breaks", "recompiles"]
    assert findings[0]["axis"] == "parallelism"


def test_gpu_faults_fire_their_rules_when_the_signals_exist(ruleset):
    gpu = {**HEALTHY, "model_on_gpu": 1, "gpu_utilization_ratio": 0.4, "kernel_busy_ratio": 0.3}
    cases = {
        "pageable-copies": {"h2d_copy_ratio": 0.4, "h2d_pageable_ratio": 1.0},
        "cpu-ops": {"cpu_op_ratio": 0.3},
        "input-path-syncs": {"host_syncs_per_step": 4.0},
        "fragmentation": {"memory_fragmentation_ratio": 0.7, "memory_alloc_retries_total": 3.0},
        "h2d-bound": {"h2d_share": 0.6},
        "launch-bound": {"idle_host_wait_ratio": 0.5, "short_kernel_ratio": 0.8, "kernels_per_step": 900},
    }
    for rule, signals in cases.items():
        first = evaluate(ruleset.rules, frame(r0={**gpu, **signals}))[0]
        assert first["rule"] == rule, (rule, rules_of(evaluate(ruleset.rules, frame(r0={**gpu, **signals}))))
    # Fragmentation without memory pressure (no retries, plenty of headroom) costs nothing: silent.
    relaxed = {**gpu, "memory_fragmentation_ratio": 0.5, "memory_alloc_retries_total": 0.0}
    relaxed["memory_headroom_ratio"] = 0.99
    assert "fragmentation" not in rules_of(evaluate(ruleset.rules, frame(r0=relaxed)))
    # The trace-based cause outranks the step-level symptom it explains.
    both = {**gpu, **cases["pageable-copies"], **cases["h2d-bound"]}
    assert rules_of(evaluate(ruleset.rules, frame(r0=both)))[:2] == ["pageable-copies", "h2d-bound"]
    # A CPU op that also leaves the GPU idle: the CPU op is the cause, launch-bound the symptom.
    both = {**gpu, **cases["cpu-ops"], **cases["launch-bound"]}
    assert rules_of(evaluate(ruleset.rules, frame(r0=both)))[:2] == ["cpu-ops", "launch-bound"]


def test_gpu_starved_reads_the_busiest_measure_there_is(ruleset):
    gpu = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.7}
    # Measured on the H200: a GPT-like model's 1-second run read NVML 0.24, kernels busy 84 % in the window.
    short_run = {**gpu, "gpu_utilization_ratio": 0.24, "kernel_busy_ratio": 0.84, "gpu_busy_ratio": 0.84}
    assert "gpu-starved" not in rules_of(evaluate(ruleset.rules, frame(r0=short_run)))
    starved = {**gpu, "gpu_utilization_ratio": 0.1, "kernel_busy_ratio": 0.15, "gpu_busy_ratio": 0.15}
    hit = [f for f in evaluate(ruleset.rules, frame(r0=starved)) if f["rule"] == "gpu-starved"]
    assert hit and hit[0]["severity"] == "critical" and hit[0]["evidence"]["kernel_busy_ratio"] == 0.15


def test_gloo_on_gpu_is_named_and_explains_its_syncs(ruleset):
    cpu = {**HEALTHY, "model_on_gpu": 0, "ddp_backend_gloo": 1}  # gloo is right for CPU tensors
    assert "gloo-on-gpu" not in rules_of(evaluate(ruleset.rules, frame(r0=cpu, r1=cpu)))
    nccl = {**HEALTHY, "model_on_gpu": 1, "ddp_backend_gloo": 0}
    assert "gloo-on-gpu" not in rules_of(evaluate(ruleset.rules, frame(r0=nccl, r1=nccl)))
    # Two ranks sharing one GPU through gloo, as measured on the H200: 3 host syncs per step.
    shared = {**nccl, "ddp_backend_gloo": 1, "host_syncs_per_step": 3.0, "idle_host_wait_ratio": 0.3}
    found = evaluate(ruleset.rules, frame(r0=shared, r1=shared))
    assert rules_of(found)[:2] == ["gloo-on-gpu", "input-path-syncs"]
    assert found[0]["axis"] == "sync" and found[0]["ranks"] == [0, 1] and found[0]["severity"] == "warning"


def test_replicated_model_state_is_judged_against_the_device(ruleset):
    ddp = {**HEALTHY, "ddp": 1, "model_on_gpu": 1, "parameter_bytes": 20e9, "device_memory_bytes": 141e9}

    def hit(share, **extra):
        f = {**ddp, "model_state_share": share, "model_state_bytes": share * 141e9, **extra}
        found = [x for x in evaluate(ruleset.rules, frame(r0=f, r1=f)) if x["rule"] == "replicated-model-state"]
        return found[0]["severity"] if found else None

    assert [hit(0.1), hit(0.3), hit(0.57)] == [None, "info", "warning"]  # 5 B params, AdamW fp32: 0.57
    assert hit(0.57, ddp=0) is None  # FSDP or a single model: nothing replicated by DDP
    one = {**ddp, "model_state_share": 0.9, "model_state_bytes": 1.2e11}
    assert "replicated-model-state" not in rules_of(
        evaluate(ruleset.rules, frame(r0=one))
    )  # one rank: nothing to shard over


def test_memory_imbalance_names_the_heavy_rank(ruleset):
    base = {**HEALTHY, "memory_reserved_spread": 0.5}
    heavy = {**base, "memory_reserved_excess": 0.8, "memory_reserved_bytes": 18e9}
    light = {**base, "memory_reserved_excess": 0.0, "memory_reserved_bytes": 10e9}
    hit = next(
        f for f in evaluate(ruleset.rules, frame(r0=light, r1=light, r2=heavy)) if f["rule"] == "memory-imbalance"
    )
    assert hit["ranks"] == [2] and hit["severity"] == "critical"


def test_checklist_is_na_on_cpu_and_judges_the_worst_rank(ruleset):
    cpu = run_checklist(ruleset.checklist, frame(r0=HEALTHY, r1=HEALTHY))
    assert {c["status"] for c in cpu} == {"n/a"}  # not compiled, no GPU, one bucket
    gpu = {**HEALTHY, "memory_fragmentation_ratio": 0.1, "kernel_busy_ratio": 0.95, "compiled": 1}
    gpu |= {"memory_headroom_ratio": 0.05, "memory_alloc_retries_total": 0}  # under memory pressure
    worse = {**gpu, "memory_fragmentation_ratio": 0.3, "kernel_busy_ratio": 0.4, "graph_breaks": 12}
    item = "allocator fragmentation under memory pressure (1 - largest free / total free)"
    by_item = {c["item"]: c for c in run_checklist(ruleset.checklist, frame(r0=gpu, r1=worse))}
    assert by_item[item] == {"item": item, "group": "memory planning", "status": "warn", "value": 0.3, "unit": "ratio"}
    assert by_item["allocator retries"]["unit"] == "number"
    # Plenty of free device memory: holes in the cache cost nothing, the item does not judge them.
    roomy = {**worse, "memory_headroom_ratio": 0.9, "memory_fragmentation_ratio": 0.87}
    assert {c["item"]: c for c in run_checklist(ruleset.checklist, frame(r0=roomy))}[item]["status"] == "n/a"
    assert by_item["GPU kernel busy share"]["status"] == "fail"
    assert by_item["graph breaks"]["status"] == "fail"
    assert by_item["recompiles after warm-up"]["status"] == "pass"
    assert by_item["GPU utilization (NVML)"]["status"] == "n/a"
