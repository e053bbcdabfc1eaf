"""FSDP2 as the agent records it, against torch.profiler over the same steps: real 2-process gloo jobs.

The job has the shape of the demo's exposed-all-gather fault (4 wide blocks, one ``fully_shard`` unit
each, a small batch) with FSDP2's default all-gathers (on gloo the training thread waits for each).
Each rank runs the agent and a torch.profiler session at once. The truth is the profiler's: per step
(a ``record_function`` range inside ``mon.step()``), the time inside FSDP2's own communication
ranges (``FSDP::all_gather``, ``FSDP::post_backward_reduce``) that none of their operators but the
c10d collective ran in: the collective's dispatch and the wait for it (``Work.wait()`` is no profiler
event, so it shows as the range's self time, with a little of FSDP2's Python between its operators).
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from ranksight.collectors import open_run, read_rank_meta  # noqa: E402

from ._jobs import free_port  # noqa: E402

pytestmark = pytest.mark.slow
STEPS, WARMUP = 14, 4
WIDTH, BLOCKS, BATCH = 1024, 4, 64


def _rank_main(rank: int, port: int, run_dir: str, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import profile, record_function

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    mon = ranksight.init(run_dir=run_dir, job="fsdp", run_id="fsdp-measure", flush_interval_s=0.3)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS)]
    model = nn.Sequential(*blocks, nn.Linear(WIDTH, 1))
    mesh = init_device_mesh("cpu", (2,))  # else fully_shard picks CUDA wherever CUDA is available
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)

    def one_step():
        with mon.step():
            with record_function("fsdp_test_step"):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        one_step()
    with profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS - WARMUP):
            one_step()
    if os.environ.get("FSDP_TEST_DEBUG"):
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))
    steps, comms = [], []
    for ev in prof.events():
        r = (ev.time_range.start, ev.time_range.end)
        if ev.name == "fsdp_test_step":
            steps.append((r, ev.thread))
        elif ev.name.startswith(("FSDP::all_gather (", "FSDP::post_backward_reduce")):
            collective = sum(c.cpu_time_total for c in ev.cpu_children if c.name.startswith("c10d::"))
            comms.append((r, ev.thread, ev.self_cpu_time_total + collective))
    truth = []
    for (s0, s1), thread in sorted(steps):
        busy = sum(held for r, t, held in comms if t == thread and s0 <= r[0] and r[1] <= s1)
        truth.append({"step_us": s1 - s0, "comm_us": busy})
    mon.close()
    with open(os.path.join(out_dir, f"truth-rank{rank}.json"), "w") as f:
        json.dump(truth, f)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("fsdp")
    run_dir, out_dir = str(tmp / "runs"), str(tmp / "out")
    os.makedirs(out_dir)
    mp.start_processes(_rank_main, args=(free_port(), run_dir, out_dir), nprocs=2, start_method="spawn", join=True)
    return os.path.join(run_dir, "fsdp-measure"), out_dir


def test_fsdp_comm_share_is_within_5pp_of_the_profiler(measured):
    path, out = measured
    con = open_run(path)
    for rank in (0, 1):
        with open(os.path.join(out, f"truth-rank{rank}.json")) as f:
            truth = json.load(f)
        assert len(truth) == STEPS - WARMUP
        true_share = sum(t["comm_us"] for t in truth) / sum(t["step_us"] for t in truth)
        step_s, comm_s = con.execute(
            """SELECT sum(s.step_s), sum(c.held) FROM steps s
               JOIN (SELECT step, sum(blocked_s) AS held FROM collectives
                     WHERE rank = ? AND origin = 'fsdp' GROUP BY step) c USING (step)
               WHERE s.rank = ? AND s.step >= ?""",
            [rank, rank, WARMUP],
        ).fetchone()
        share = comm_s / step_s
        print(f"rank {rank}: FSDP2 comm share agent {share:.3f}, profiler {true_share:.3f}")
        assert share == pytest.approx(true_share, abs=0.05), (rank, share, true_share)
        assert true_share > 0.15  # the planted all-gathers are a real part of the step


def test_each_step_records_all_gathers_per_pass_and_reduce_scatters_per_unit(measured):
    path, _ = measured
    con = open_run(path)
    rows = con.execute(
        """SELECT op, count(DISTINCT process_group), sum(count), sum(bytes) FROM collectives
           WHERE rank = 0 AND origin = 'fsdp' AND step = ? GROUP BY op""",
        [WARMUP + 2],
    ).fetchall()
    ops = {op: (units, calls, size) for op, units, calls, size in rows}
    block_bytes = (WIDTH * WIDTH + WIDTH) * 4
    head_bytes = (WIDTH + 1 + 1) * 4  # the root's Linear(W, 1), padded to an even shard
    # Forward all-gathers every unit (4 blocks and the root); backward all of them but the root, which
    # FSDP2 keeps unsharded after forward; each unit reduce-scatters its gradient once.
    assert ops["all_gather_forward"][:2] == (5, 5) and ops["all_gather_backward"][:2] == (4, 4), ops
    assert ops["reduce_scatter"][:2] == (5, 5), ops
    assert ops["all_gather_forward"][2] == pytest.approx(BLOCKS * block_bytes + head_bytes, rel=0.01)
    assert ops["all_gather_backward"][2] == pytest.approx(BLOCKS * block_bytes, rel=0.01)
    assert not {"all_gather_single", "reduce_scatter_single", "wait"} & set(ops)  # nothing counted twice


def test_watch_says_what_it_attached_to_and_records_the_units(measured):
    path, _ = measured
    meta = {m.rank: m.data for m in read_rank_meta(path)}[0]
    assert meta["parallelism"] == "fsdp2"
    facts = meta["fsdp"]
    assert facts["units"] == 5 and facts["units_with_params"] == 5 and facts["backend"] == "gloo"
    assert facts["reshard_after_forward_units"] == 4 and facts["unshard_async_op"] is False
    assert facts["forward_prefetch_units"] == 0 and facts["param_dtype"] is None
    units = {u["name"]: u for u in meta["fsdp_units"]}
    assert units["0"]["all_gathers_forward"] >= STEPS and units["0"]["all_gathers_backward"] >= STEPS
    assert units["(root)"]["all_gathers_backward"] == 0
    con = open_run(path)
    events = [m for (m,) in con.execute("SELECT message FROM events WHERE component = 'watch'").fetchall()]
    assert events and all(e.startswith("FSDP2 (5 fully_shard units, 5 with parameters") for e in events), events


def _policy_main(rank: int, port: int, run_dir: str) -> None:
    """One rank: FSDP2 with a bf16 policy that reduces in fp32, the last block kept unsharded, and
    prefetching set after watch() (read again at step 1)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    mon = ranksight.init(run_dir=run_dir, job="fsdp", run_id="fsdp-policy", flush_interval_s=0.3)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = [nn.Linear(64, 64) for _ in range(3)]
    model = nn.Sequential(*blocks)
    mesh = init_device_mesh("cpu", (1,))
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < 2)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    mon.watch(model)
    blocks[0].set_modules_to_forward_prefetch([blocks[1]])  # after watch(): the facts are read again at step 1
    for _ in range(3):
        with mon.step():
            model(torch.randn(8, 64)).float().sum().backward()
    mon.close()
    dist.destroy_process_group()


def test_precision_resharding_and_late_prefetch_settings_reach_the_features(tmp_path):
    import torch.multiprocessing as mp

    from ._golden import run_features

    run_dir = str(tmp_path / "runs")
    mp.start_processes(_policy_main, args=(free_port(), run_dir), nprocs=1, start_method="spawn", join=True)
    f = run_features(os.path.join(run_dir, "fsdp-policy"), warmup_steps=0)[0]
    assert f["fsdp"] == 1 and f["fsdp_units"] == 3  # the root holds no parameter of its own
    assert (f["fsdp_param_bits"], f["fsdp_reduce_bits"]) == (16, 32)
    assert f["fsdp_reshard_units"] == 2 and f["fsdp_forward_prefetch_units"] == 1
