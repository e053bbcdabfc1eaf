"""FSDP2 diagnosed: the demo's planted exposed-all-gather fault and a healthy FSDP2 job (real 2-rank gloo
jobs, ``ranksight demo --fault fsdp-no-prefetch`` / ``--fault fsdp``), and the FSDP rules on feature frames."""

from __future__ import annotations

import pytest

from ranksight.collectors import FEATURES
from ranksight.rules import evaluate, load_rules

FSDP_RULES = {"exposed-all-gather", "fsdp-reshard-after-forward", "fsdp-units-too-small", "fsdp-units-too-large",
              "fsdp-reduce-in-fp32"}  # fmt: skip


def frame(**per_rank) -> dict[int, dict]:
    out = {}
    for key, values in per_rank.items():
        f = dict.fromkeys(FEATURES)
        f.update(rank=int(key[1:]), steps=40, ranks_reporting=len(per_rank), world_size=len(per_rank))
        f.update(values)
        out[int(key[1:])] = f
    return out


FSDP_JOB = dict(
    fsdp=1, ddp=0, step_median_s=0.3, fsdp_units=5, fsdp_reshard_units=4, fsdp_forward_prefetch_units=0,
    fsdp_backward_prefetch_units=0, fsdp_unshard_async=0, fsdp_param_bits=16, fsdp_reduce_bits=16,
    fsdp_all_gathers_per_step=9, fsdp_all_gather_bytes_per_call=4e6, fsdp_largest_unit_share=0.25,
    fsdp_param_bytes=16e6, fsdp_backward_all_gather_ratio=0.8, fsdp_all_gather_floor_share=0.01,
    fsdp_all_gather_forward_floor_share=0.005, fsdp_all_gather_backward_floor_share=0.005,
    fsdp_reduce_scatter_floor_share=0.01, fsdp_comm_floor_share=0.02, fsdp_all_gather_wire_s=0.03,
    fsdp_all_gather_latency_s=0.002,
)  # fmt: skip


def _findings(**changes) -> dict:
    job = {**FSDP_JOB, **changes}
    return {f["rule"]: f for f in evaluate(load_rules().rules, frame(r0=job, r1=job))}


def test_fsdp_rules_stay_silent_on_a_job_that_hides_its_communication():
    assert not FSDP_RULES & set(_findings())


def test_backward_all_gathers_of_resharded_units_suggest_keeping_the_last_ones():
    f = _findings(fsdp_all_gather_backward_floor_share=0.12, fsdp_all_gather_floor_share=0.13)
    reshard = f["fsdp-reshard-after-forward"]
    assert reshard["severity"] == "warning" and reshard["cost_share"] == pytest.approx(0.12)
    assert "reshard_after_forward=i < len(blocks) - 1" in reshard["fix"]["snippet"]


def test_many_tiny_all_gathers_are_units_too_small():
    f = _findings(
        fsdp_all_gathers_per_step=64, fsdp_all_gather_bytes_per_call=20e3, fsdp_all_gather_wire_s=0.0006,
        fsdp_all_gather_latency_s=0.016, fsdp_comm_floor_share=0.4, fsdp_all_gather_floor_share=0.3,
    )  # fmt: skip
    small = f["fsdp-units-too-small"]
    assert small["cost_basis"] == "estimate" and small["severity"] in ("warning", "critical")
    assert "fully_shard(layers[i : i + 2])" in small["fix"]["snippet"]


def test_one_unit_holding_the_model_is_too_large_and_explains_the_exposed_all_gather():
    found = evaluate(load_rules().rules, frame(r0={**FSDP_JOB, "fsdp_largest_unit_share": 0.9, "fsdp_units": 2,
                                             "fsdp_all_gather_floor_share": 0.3}))  # fmt: skip
    rules = [f["rule"] for f in found]
    assert rules.index("fsdp-units-too-large") < rules.index("exposed-all-gather")
    assert next(f for f in found if f["rule"] == "exposed-all-gather")["explained_by"] == "fsdp-units-too-large"


def test_an_fp32_reduce_scatter_under_a_bf16_policy_says_drop_reduce_dtype():
    rs = _findings(fsdp_reduce_bits=32, fsdp_reduce_scatter_floor_share=0.3)["fsdp-reduce-in-fp32"]
    assert rs["cost_share"] == pytest.approx(0.15) and "was float32" in rs["fix"]["snippet"]
    no_policy = _findings(fsdp_param_bits=32, fsdp_reduce_bits=32, fsdp_reduce_scatter_floor_share=0.3)
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16" in no_policy["fsdp-reduce-in-fp32"]["fix"]["snippet"]


def test_replicated_model_state_fix_is_fsdp2_code_fitted_to_the_framework():
    job = dict(ddp=1, model_on_gpu=1, model_state_share=0.6, model_state_bytes=84e9, parameter_bytes=21e9,
               device_memory_bytes=141e9)  # fmt: skip
    rules, features = load_rules().rules, frame(r0=job, r1=job)
    f = next(f for f in evaluate(rules, features) if f["rule"] == "replicated-model-state")
    assert "fully_shard(block" in f["fix"]["snippet"] and "MixedPrecisionPolicy" in f["fix"]["snippet"]
    ctx = {r: {"framework": "lightning"} for r in (0, 1)}
    f = next(f for f in evaluate(rules, features, ctx) if f["rule"] == "replicated-model-state")
    assert "ModelParallelStrategy" in f["fix"]["snippet"]


def _cpu_scenario(tmp_path, fault: str, steps: int) -> dict:
    """The demo job on 2 CPU ranks (gloo), also on a machine with GPUs (test_fsdp_gpu.py runs it there)."""
    from ranksight.commands.demo_job import DemoConfig, run_demo
    from ranksight.rules import diagnose

    cfg = DemoConfig(fault=fault, ranks=2, steps=steps, run_dir=str(tmp_path), flush_interval_s=0.5,
                     extra_env=(("CUDA_VISIBLE_DEVICES", ""),))  # fmt: skip
    return diagnose(run_demo(cfg))


@pytest.mark.slow
def test_fsdp_without_prefetching_is_exposed_all_gather_first(tmp_path):
    pytest.importorskip("torch")
    from ._scenarios import describe

    result = _cpu_scenario(tmp_path, "fsdp-no-prefetch", steps=30)
    first = result["findings"][0]
    assert (first["axis"], first["rule"]) == ("sync", "exposed-all-gather"), describe(result)
    assert first["ranks"] == [0, 1] and first["severity"] in ("warning", "critical")
    ev = first["evidence"]
    assert ev["fsdp_all_gather_floor_share"] >= 0.1 and ev["fsdp_all_gathers_per_step"] == 9
    assert ev["fsdp_all_gather_forward_floor_share"] > 0 and ev["fsdp_all_gather_backward_floor_share"] > 0
    assert "_set_unshard_async_op(False)" in first["fix"]["snippet"]
    assert "set_modules_to_forward_prefetch" in first["fix"]["snippet"]
    # FSDP2's own collectives are judged by the FSDP rules, not again as blocking collectives.
    assert "blocking-collectives" not in [f["rule"] for f in result["findings"]], describe(result)


@pytest.mark.slow
def test_a_healthy_fsdp2_job_is_silent(tmp_path):
    pytest.importorskip("torch")
    from ._scenarios import describe

    # 60 steps, not 24: on a VM whose cores change speed from moment to moment, one rank's thread can read
    # more CPU time for the same work over a few seconds, which the straggler rule rightly takes as a
    # slower rank; a longer run averages those moments out.
    result = _cpu_scenario(tmp_path, "fsdp", steps=60)
    loud = [f for f in result["findings"] if f["severity"] in ("warning", "critical")]
    assert loud == [], describe(result)
    # On a loaded shared host each collective costs a scheduler slice or so: FSDP findings stay info at most.
    assert all(f["severity"] == "info" for f in result["findings"] if f["rule"] in FSDP_RULES), describe(result)


def _tiny_units_main(rank: int, port: int, run_dir: str) -> None:
    """16 blocks of 64x64 (16 KB each), one fully_shard unit per block, prefetching one ahead: 33
    all-gathers per step of a few KB, whose round trips cost more than their bytes."""
    import os

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    mon = ranksight.init(run_dir=run_dir, job="fsdp", run_id="tiny-units", flush_interval_s=0.3)
    blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(16)]
    model = nn.Sequential(*blocks, nn.Linear(64, 1))
    mesh = init_device_mesh("cpu", (2,))  # else fully_shard picks CUDA wherever CUDA is available
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 2])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(512, 64), torch.randn(512, 1)
    for _ in range(25):
        with mon.step():
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_many_tiny_units_are_named_too_small(tmp_path):
    pytest.importorskip("torch")
    import os

    import torch.multiprocessing as mp

    from ranksight.rules import diagnose

    from ._jobs import free_port
    from ._scenarios import describe

    run_dir = str(tmp_path / "runs")
    mp.start_processes(_tiny_units_main, args=(free_port(), run_dir), nprocs=2, start_method="spawn", join=True)
    result = diagnose(os.path.join(run_dir, "tiny-units"))
    found = {f["rule"]: f for f in result["findings"]}
    small = found.get("fsdp-units-too-small")
    assert small is not None and small["severity"] in ("warning", "critical"), describe(result)
    assert small["evidence"]["fsdp_all_gathers_per_step"] == 33
    assert small["evidence"]["fsdp_all_gather_wire_s"] < small["evidence"]["fsdp_all_gather_latency_s"]
    # Prefetching is on and cannot hide 33 round trips a step: exposed-all-gather says to make units larger.
    exposed = found["exposed-all-gather"]
    assert "make the units larger" in exposed["fix"]["text"], exposed["fix"]["text"]
