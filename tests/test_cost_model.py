"""The cost model: what each finding says fixing it gives back, from feature frames, by the pure evaluator."""

from __future__ import annotations

import pytest

from ranksight.rules import evaluate, load_rules, parse_rules

from .test_rules_evaluate import HEALTHY, frame


@pytest.fixture(scope="module")
def rules():
    return load_rules().rules


def by_rule(findings: list[dict]) -> dict[str, dict]:
    return {f["rule"]: f for f in findings}


def test_cost_share_and_speedup_arithmetic(rules):
    f = by_rule(evaluate(rules, frame(r0={**HEALTHY, "data_wait_share": 0.3})))["input-bound"]
    assert f["cost_share"] == 0.3 and f["speedup"] == pytest.approx(1 / 0.7, abs=0.005)
    assert f["cost_basis"] == "measured"
    # The straggler costs the time the others wait for it, taken from the arriving-last rank's figure.
    slow = {**HEALTHY, "least_wait_step_share": 1.0, "least_wait_top_share": 1.0, "straggler_cost_share": 0.2}
    waiting = {**HEALTHY, "least_wait_step_share": 0.0, "least_wait_top_share": 1.0, "straggler_cost_share": 0.0}
    f = by_rule(evaluate(rules, frame(r0=waiting, r1=slow)))["straggler"]
    assert (f["ranks"], f["cost_share"], f["speedup"]) == ([1], 0.2, 1.25)
    # Exposed gradient all-reduce costs its exposed time on the rank that waits least.
    sync = {**HEALTHY, "comm_floor_share": 0.4, "allreduce_wire_s": 0.05, "grad_bytes_per_step": 50e6}
    f = by_rule(evaluate(rules, frame(r0=sync, r1=sync)))["exposed-allreduce"]
    assert (f["cost_share"], f["speedup"], f["severity"]) == (0.4, pytest.approx(1.67), "critical")
    # Blocking collectives cost their own blocked time (the floor across ranks).
    blocked = {**HEALTHY, "comm_blocked_floor_share": 0.12, "comm_blocked_floor_share_noise": 0.01}
    f = by_rule(evaluate(rules, frame(r0=blocked, r1=blocked)))["blocking-collectives"]
    assert (f["cost_share"], f["severity"]) == (0.12, "warning")
    # GPU: launch-bound costs the GPU idle waiting for the host; gpu-starved what the idle compute span wastes.
    gpu = {**HEALTHY, "model_on_gpu": 1, "short_kernel_ratio": 0.6, "idle_host_wait_ratio": 0.2}
    gpu.update(compute_share=0.8, gpu_busy_ratio=0.4, data_wait_share=0.0)
    found = by_rule(evaluate(rules, frame(r0=gpu)))
    assert found["gpu-starved"]["cost_share"] == pytest.approx(0.8 * 0.6)
    # launch-bound explains the starved GPU, a symptom: it ranks first with gpu-starved's severity and
    # keeps its own cost, the part of the idle it is (0.2), not the whole idle (0.48).
    assert found["launch-bound"]["cost_share"] == pytest.approx(0.2)
    assert found["launch-bound"]["severity"] == found["gpu-starved"]["severity"] == "critical"
    assert found["gpu-starved"]["explained_by"] == "launch-bound"
    assert [f["rule"] for f in evaluate(rules, frame(r0=gpu))][:2] == ["launch-bound", "gpu-starved"]
    # The GPU also idles while the host waits for the loader: that part is input-bound's, not launches'.
    found = by_rule(evaluate(rules, frame(r0={**gpu, "data_wait_share": 0.15})))
    assert found["launch-bound"]["cost_share"] == pytest.approx(0.05)


def test_estimates_say_so(rules):
    scan = {**HEALTHY, "find_unused_parameters": 1, "unused_parameter_size": 0, "ddp_stats_iteration": 10}
    f = by_rule(evaluate(rules, frame(r0=scan)))["unused-parameter-scan"]
    # 2 % of the step: hygiene, listed with its fix, never a warning (the engine's cost floors)
    assert f["cost_basis"] == "estimate" and f["cost_share"] == 0.02 and f["severity"] == "info"
    breaks = {**HEALTHY, "compiled": 1, "graph_breaks": 11}
    f = by_rule(evaluate(rules, frame(r0=breaks)))["graph-breaks"]
    assert f["cost_basis"] == "estimate" and f["cost_share"] == pytest.approx(0.13)


def test_severity_comes_from_the_cost_bands(rules):
    def severity(cost):
        found = by_rule(evaluate(rules, frame(r0={**HEALTHY, "h2d_share": cost, "model_on_gpu": 1})))
        return found["h2d-bound"]["severity"] if "h2d-bound" in found else None

    assert [severity(c) for c in (0.02, 0.05, 0.10, 0.24, 0.25)] == [None, "info", "warning", "warning", "critical"]


def test_ranking_follows_the_cost_within_a_severity(rules):
    both = {**HEALTHY, "data_wait_share": 0.12, "comm_blocked_floor_share": 0.2}
    order = [f["rule"] for f in evaluate(rules, frame(r0=both, r1=both))]
    assert order[:2] == ["blocking-collectives", "input-bound"]  # 20 % before 12 %, both warnings
    both["data_wait_share"] = 0.22
    order = [f["rule"] for f in evaluate(rules, frame(r0=both, r1=both))]
    assert order[:2] == ["input-bound", "blocking-collectives"]


def test_a_cause_takes_the_cost_and_severity_of_what_it_explains(rules):
    # A hungry rank arrives last; the others' wait for it (35 %) is what feeding it would give back.
    hungry = {**HEALTHY, "data_wait_share": 0.15, "least_wait_step_share": 1.0, "least_wait_top_share": 1.0}
    hungry["straggler_cost_share"] = 0.35
    waiting = {**HEALTHY, "least_wait_step_share": 0.0, "least_wait_top_share": 1.0}
    first, second = evaluate(rules, frame(r0=hungry, r1=waiting))[:2]
    assert (first["rule"], second["rule"]) == ("input-bound", "straggler")
    assert first["cost_share"] == 0.35 and first["severity"] == "critical" and second["explained_by"] == "input-bound"


def test_noise_keeps_an_uncertain_effect_below_its_band(rules):
    def severity(share, noise):
        f = {**HEALTHY, "comm_floor_share": share, "comm_floor_share_noise": noise}
        found = by_rule(evaluate(rules, frame(r0=f, r1=f)))
        return found["comm-latency"]["severity"] if "comm-latency" in found else None

    assert severity(0.15, 0.0) == "warning"
    assert severity(0.15, 0.06) == "info"  # 15 % +- 6 %: could be 9 %
    assert severity(0.04, 0.02) is None  # indistinguishable from 2 %
    # Confidence grows with the margin past the noise.
    f = {**HEALTHY, "comm_floor_share": 0.2}
    tight = by_rule(evaluate(rules, frame(r0={**f, "comm_floor_share_noise": 0.0})))["comm-latency"]
    loose = by_rule(evaluate(rules, frame(r0={**f, "comm_floor_share_noise": 0.05})))["comm-latency"]
    assert loose["confidence"] < tight["confidence"]


def test_oversubscribed_host_is_named_with_its_numbers(rules):
    # 8 ranks x (4 torch threads + 4 workers) = 64 busy threads on 16 CPUs.
    host = {**HEALTHY, "cpus_allowed": 16, "local_world_size": 8, "torch_threads": 4, "loader_num_workers": 4}
    host.update(cpus_per_rank=2.0, threads_demanded=64, oversubscription_ratio=4.0, host_bound_share=0.9)
    f = by_rule(evaluate(rules, frame(r0=host, r1=host)))["host-oversubscribed"]
    assert f["cost_share"] == pytest.approx(0.9 * 0.75) and f["cost_basis"] == "estimate"
    assert "8 ranks x (4 torch threads + 4 loader workers) = 64 busy threads on 16 CPUs (4.0x" in f["summary"]
    # The workers alone take the cores: fewer workers, one torch thread, never more workers than cores allow.
    assert "Use 1 worker(s) and 1 torch thread per rank" in f["fix"]["text"]
    assert "num_workers=1" in f["fix"]["snippet"] and "OMP_NUM_THREADS=1" in f["fix"]["snippet"]
    # Threads alone oversubscribe: set them to the cores per rank.
    threads = {**host, "loader_num_workers": 0, "threads_demanded": 32, "oversubscription_ratio": 2.0}
    f = by_rule(evaluate(rules, frame(r0=threads)))["host-oversubscribed"]
    assert "OMP_NUM_THREADS=2 torchrun --nproc-per-node 8" in f["fix"]["snippet"]
    # A job that fits its cores on a loaded host: not this rule, and only info for the load.
    busy = {**HEALTHY, "host_load_ratio": 3.0}
    found = by_rule(evaluate(rules, frame(r0=busy, r1=busy)))
    assert "host-oversubscribed" not in found and found["busy-host"]["severity"] == "info"


def test_input_that_was_not_measured_is_said_so_not_zero(rules):
    unmeasured = {**HEALTHY, "data_wait_share": None, "data_measured": 0, "ranks_data_measured": 0}
    found = evaluate(rules, frame(r0=unmeasured, r1=unmeasured))
    f = by_rule(found)["input-not-measured"]
    assert f["severity"] == "info" and f["ranks"] == [0, 1] and f["cost_share"] is None
    assert "mon.loader()" in f["fix"]["text"] and "with mon.data():" in f["fix"]["text"]
    assert "input-bound" not in by_rule(found)
    one_measures = {**unmeasured, "ranks_data_measured": 1}
    assert "input-not-measured" not in by_rule(evaluate(rules, frame(r0=one_measures, r1=one_measures)))


def test_a_user_rule_can_state_its_own_cost():
    text = """
rules:
  - id: slow-optimizer
    axis: parallelism
    title: Optimizer step takes long
    cost: optimizer_share / 2          # a fused optimizer halves it
    cost_basis: estimate
    suggest:
      share_pct: optimizer_share * 100
    summary: "optimizer {share_pct:.0f}% on {ranks}, {speedup}x with a fused one"
    fix: {text: "torch.optim.AdamW(..., fused=True)"}
"""
    rule = parse_rules(text, "slow.yaml").rules[0]
    assert rule.levels == (("info", 0.03), ("warning", 0.10), ("critical", 0.25))
    f = evaluate([rule], frame(r0={**HEALTHY, "optimizer_share": 0.3}))[0]
    assert (f["severity"], f["cost_share"], f["speedup"]) == ("warning", 0.15, 1.18)
    assert f["summary"] == "optimizer 30% on rank 0, 1.18x with a fused one"


def test_blocking_collectives_on_a_gpu_explain_the_host_syncs_they_cause(rules):
    # Two H200s over NCCL, the blocking fault: 9 host syncs per step, the GPU idle 52 % waiting for the host.
    gpu = {**HEALTHY, "model_on_gpu": 1, "gpu_busy_ratio": 0.42, "host_syncs_per_step": 9.0}
    gpu.update(idle_host_wait_ratio=0.52, comm_blocked_floor_share=0.21, collectives_per_step=5)
    first, second = evaluate(rules, frame(r0=gpu, r1=gpu))[:2]
    assert (first["rule"], second["rule"]) == ("blocking-collectives", "input-path-syncs")
    assert first["cost_share"] == 0.52 and first["severity"] == "critical"


def test_exposed_allreduce_explains_a_straggler_only_where_gloo_shares_the_cores(rules):
    """On gloo the buckets are summed by CPU threads: with a core or less per rank that work slows the late
    rank, so the exposed all-reduce is the cause. With cores to spare (or on GPUs) the straggler stands."""
    sync = {**HEALTHY, "comm_floor_share": 0.16, "allreduce_wire_s": 0.05, "grad_bytes_per_step": 50e6}
    sync.update(ddp_backend_gloo=1, model_on_gpu=0, least_wait_top_share=1.0)
    waiting = {**sync, "least_wait_step_share": 0.0, "straggler_cost_share": 0.0}
    late = {**sync, "least_wait_step_share": 0.9, "straggler_cost_share": 0.25, "straggler_work_explained": 0.9}
    for cpus_per_rank, cause in ((1.0, "exposed-allreduce"), (8.0, None)):
        ranks = {"r0": {**waiting, "cpus_per_rank": cpus_per_rank}, "r1": {**late, "cpus_per_rank": cpus_per_rank}}
        findings = evaluate(rules, frame(**ranks))
        found = by_rule(findings)
        assert found["straggler"]["explained_by"] == cause
        first = findings[0]
        if cause:  # the cause comes first and is worth what it explains
            assert (first["rule"], first["cost_share"]) == ("exposed-allreduce", 0.25)
        else:
            assert (first["rule"], first["cost_share"]) == ("straggler", 0.25)
            assert found["exposed-allreduce"]["cost_share"] == 0.16


def test_noise_is_the_standard_error_of_the_per_step_mean():
    """A cost share is a mean over steps: its noise is that mean's standard error, also for a straggler's
    series padded with zeros where it was not last (computed without building the padded list)."""
    import random
    import statistics

    from ranksight.collectors._queries import mean_error

    shares = [0.1, 0.2, 0.15, 0.3, 0.12]
    assert mean_error(shares) == pytest.approx(statistics.stdev(shares) / len(shares) ** 0.5)
    assert mean_error([0.1, 0.2]) is None  # fewer than 3 steps: no spread to judge by
    rng = random.Random(7)
    for _ in range(200):
        late = [rng.random() * 0.4 for _ in range(rng.randint(1, 40))]
        n = len(late) + rng.randint(0, 40)
        assert mean_error(late, n) == pytest.approx(mean_error(late + [0.0] * (n - len(late))), abs=1e-12)


def test_graph_breaks_explain_the_syncs_made_inside_the_compiled_frame(rules):
    # nanoGPT on one H200 with `if logits.abs().max() > t:` in its compiled forward: 2 breaks, 4 syncs a
    # step (one per micro-step), the GPU idle 42 % for the host. Inside the compiled frame's run the syncs
    # are the break's; outside it (a loss.item() after the step) they are the loop's own.
    job = {**HEALTHY, "model_on_gpu": 1, "compiled": 1, "graph_breaks": 2, "recompiles": 2}
    job.update(gpu_busy_ratio=0.56, idle_host_wait_ratio=0.42, idle_ratio=0.44, host_syncs_per_step=4.0)
    inside = evaluate(rules, frame(r0={**job, "compiled_syncs_per_step": 4.0}))
    outside = evaluate(rules, frame(r0={**job, "compiled_syncs_per_step": 0.0}))
    assert inside[0]["rule"] == "graph-breaks" and inside[0]["cost_share"] >= 0.4
    assert outside[0]["rule"] == "input-path-syncs"


def test_host_sync_costs_are_bounded_by_the_host_and_leave_batch_copies_to_the_copy(rules):
    """H200 figures. nanoGPT, host-bound: 9 syncs a step, the GPU idle 61 % for the host, the host 5 % of
    the step inside the ops that synced; the fix gave back 11-15 %. input-path-syncs states the host's 5 %,
    comes first as a warning (its cost allows no more), and ranks ahead of the starved GPU it explains
    without taking the starved GPU's 46 %. The DDP tutorial, healthy: its 2 syncs end blocking batch
    copies, so no finding; with 3 more (.item(), .cpu(), nonzero) the idle's copy-sync part stays out
    of the cost (3 of 5)."""
    gpt = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.74, "gpu_busy_ratio": 0.38}
    gpt.update(host_syncs_per_step=9.0, copy_syncs_per_step=0.0, idle_host_wait_ratio=0.61, idle_ratio=0.62)
    gpt.update(sync_op_share=0.05, host_sync_wait_share=0.04, data_wait_host_share=0.04)
    found = evaluate(rules, frame(r0=gpt))
    first = found[0]
    assert first["rule"] == "input-path-syncs" and first["cost_share"] == pytest.approx(0.05)
    assert first["severity"] == "warning"  # the starved GPU's critical, bounded by its own 5 %
    assert by_rule(found)["gpu-starved"]["explained_by"] == "input-path-syncs"
    ddp = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.67, "gpu_busy_ratio": 0.9, "idle_ratio": 0.05}
    ddp.update(host_syncs_per_step=2.0, copy_syncs_per_step=2.0, idle_host_wait_ratio=0.04, sync_op_share=0.42)
    assert "input-path-syncs" not in by_rule(evaluate(rules, frame(r0=ddp)))
    ddp.update(host_syncs_per_step=5.0, idle_host_wait_ratio=0.38, idle_ratio=0.4, gpu_busy_ratio=0.59)
    f = by_rule(evaluate(rules, frame(r0=ddp)))["input-path-syncs"]
    assert f["cost_share"] == pytest.approx(0.38 * 3 / 5) and f["severity"] == "warning"


def test_host_syncs_cost_the_idle_they_drained_not_the_wait_inside_them(rules):
    """H100 figures. A healthy Hugging Face Trainer job: 5 syncs a step (2 end batch copies), the host
    waiting inside them 56 % of the step for a busy GPU, which then idled 0.2 % after them: listed, not
    loud. A nanoGPT loop with a per-step NaN check and token count: the GPU idles 13 % of the step, 10 % in
    the gaps the two syncs returned into (the loop ran 10 % slower than without them): a warning at 10 %."""
    hf = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.9, "gpu_busy_ratio": 0.94, "idle_ratio": 0.09}
    hf.update(host_syncs_per_step=5.0, copy_syncs_per_step=2.0, idle_host_wait_ratio=0.06)
    hf.update(sync_op_share=0.56, host_sync_wait_share=0.558, sync_drain_idle_share=0.002)
    hf.update(data_wait_share=0.003, data_wait_host_share=0.003)  # the fetch hidden behind the busy GPU
    f = by_rule(evaluate(rules, frame(r0=hf)))["input-path-syncs"]
    assert f["severity"] == "info" and f["cost_share"] == pytest.approx(0.002)
    gpt = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.85, "gpu_busy_ratio": 0.87, "idle_ratio": 0.13}
    gpt.update(host_syncs_per_step=2.0, copy_syncs_per_step=0.0, idle_host_wait_ratio=0.03)
    gpt.update(sync_op_share=0.03, host_sync_wait_share=0.02, sync_drain_idle_share=0.10, data_wait_host_share=0.05)
    f = by_rule(evaluate(rules, frame(r0=gpt)))["input-path-syncs"]
    assert f["severity"] == "warning" and f["cost_share"] == pytest.approx(0.10)


def test_host_syncs_cost_the_fetch_they_leave_exposed_on_the_gpu(rules):
    """H100 figures. The nanoGPT loop with per-step .item() syncs: the GPU idles through 5.8 % of the step
    while the host fetches the batch (0.4 % without the syncs, the host a step ahead), though the window's
    gap after each sync is small: the exposed fetch is the syncs' doing, a warning, first. A slow loader
    whose fetch outlasts the GPU's busy time keeps the excess: the syncs cost only what a host running ahead
    would hide (the GPU's busy time), and input-bound stays first."""
    gpt = {**HEALTHY, "model_on_gpu": 1, "compute_share": 0.8, "gpu_busy_ratio": 0.85, "idle_ratio": 0.2}
    gpt.update(host_syncs_per_step=2.0, copy_syncs_per_step=0.0, idle_host_wait_ratio=0.13)
    gpt.update(sync_op_share=0.018, host_sync_wait_share=0.012, sync_drain_idle_share=0.001)
    gpt.update(data_wait_share=0.058, data_wait_host_share=0.059, data_measured=1)
    found = evaluate(rules, frame(r0=gpt))
    assert found[0]["rule"] == "input-path-syncs" and found[0]["severity"] == "warning"
    assert found[0]["cost_share"] == pytest.approx(0.058)
    slow = {**gpt, "data_wait_share": 0.75, "data_wait_host_share": 0.76, "idle_ratio": 0.75, "gpu_busy_ratio": 0.25}
    found = evaluate(rules, frame(r0=slow))
    assert found[0]["rule"] == "input-bound"
    assert by_rule(found)["input-path-syncs"]["cost_share"] == pytest.approx(0.75 - (0.76 - 0.25))


def test_allocator_churn_under_pressure_is_fragmentations_not_launch_overhead(rules):
    # nanoGPT with unpadded micro-batches on a nearly full H200: fragmented cache, no retry, the GPU idle
    # 61 % for a host that spends (here, say) 30 % of the step inside cudaFree/cudaMalloc.
    job = {**HEALTHY, "model_on_gpu": 1, "memory_headroom_ratio": 0.03, "memory_fragmentation_ratio": 0.44}
    job.update(memory_alloc_retries_total=0, short_kernel_ratio=0.36, kernels_per_step=960, kernel_busy_ratio=0.37)
    job.update(gpu_busy_ratio=0.37, idle_host_wait_ratio=0.61, idle_ratio=0.62)
    churn = evaluate(rules, frame(r0={**job, "alloc_calls_per_step": 12.0, "alloc_call_share": 0.30}))
    quiet = evaluate(rules, frame(r0={**job, "alloc_calls_per_step": 0.0, "alloc_call_share": 0.0}))
    assert [f["rule"] for f in churn][:2] == ["fragmentation", "launch-bound"]
    assert churn[0]["cost_share"] >= 0.30 and churn[0]["severity"] == "critical"
    assert quiet[0]["rule"] == "launch-bound"
    assert by_rule(quiet)["fragmentation"]["severity"] == "info"  # no churn: it costs no step time
