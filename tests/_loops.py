"""Training loops the way real scripts write them, run as real gloo jobs for the measurement tests.

Each rank times what the agent should see with its own clock (``time.perf_counter`` around the fetch
and around the whole iteration) and writes it to ``<out>/truth-rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass

from ._jobs import free_port


@dataclass
class Loop:
    """One small job. ``kind``: ``nanogpt`` (no DataLoader, get_batch + accumulation), ``fsdp2``,
    ``rebuild`` (DDP whose buckets are rebuilt after the first step)."""

    run_dir: str
    out_dir: str
    kind: str = "nanogpt"
    run_id: str = "loop"
    ranks: int = 2
    steps: int = 30
    fetch_s: float = 0.008  # get_batch cost before the step
    prefetch_s: float = 0.012  # nanoGPT's prefetch of the next micro-batch, right after forward
    accum: int = 2
    mark_data: bool = True  # wrap get_batch in mon.data()
    metrics: bool = False  # all_reduce the loss for logging and barrier, every step
    end: str = "close"  # close | raise | sigterm


def _rank_main(rank: int, loop_dict: dict, port: int) -> None:
    loop = Loop(**loop_dict)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(loop.ranks), LOCAL_WORLD_SIZE=str(loop.ranks),
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=loop.ranks)
    torch.manual_seed(0)
    mon = ranksight.init(run_dir=loop.run_dir, job="loops", run_id=loop.run_id, flush_interval_s=0.3)
    truth = {"fetch_s": [], "iter_s": []}

    if loop.kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # A CPU mesh, explicitly: without one fully_shard builds its mesh on the accelerator whenever CUDA
        # is available and moves the parameters there, and a gloo job's CPU batches no longer match them.
        mesh = init_device_mesh("cpu", (loop.ranks,))
        model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    width = 256 if loop.kind == "fsdp2" else 32

    data = torch.randn(4096, width + 1)

    def get_batch():
        time.sleep(loop.fetch_s)
        idx = torch.randint(0, data.shape[0], (64,))
        return data[idx, :width], data[idx, width:]

    def prefetch_next():
        time.sleep(loop.prefetch_s)

    def fetch(fn):
        begin = time.perf_counter()
        if loop.mark_data:
            with mon.data():
                batch = fn()
        else:
            batch = fn()
        truth["fetch_s"][-1] += time.perf_counter() - begin
        return batch

    for step in range(loop.steps):
        t0 = time.perf_counter()
        truth["fetch_s"].append(0.0)
        x, y = fetch(get_batch)
        with mon.step():
            for micro in range(loop.accum):
                if loop.kind != "fsdp2":  # nanoGPT: all-reduce only on the last micro-step
                    model.require_backward_grad_sync = micro == loop.accum - 1
                out = model(x)
                if micro == 0 and loop.prefetch_s:
                    fetch(prefetch_next)  # nanoGPT fetches the next batch while the GPU runs forward
                loss = nn.functional.mse_loss(out[:, :1], y) / loop.accum
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if loop.metrics:
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                dist.barrier()
        truth["iter_s"].append(time.perf_counter() - t0)
        if loop.end == "raise" and step == loop.steps - 1:
            with open(os.path.join(loop.out_dir, f"truth-rank{rank}.json"), "w") as f:
                json.dump(truth, f)
            raise RuntimeError("planted failure at the last step")
        if loop.end == "sigterm" and step == loop.steps - 1:
            with open(os.path.join(loop.out_dir, f"truth-rank{rank}.json"), "w") as f:
                json.dump(truth, f)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the default action ends the process; never reached
    mon.close()
    with open(os.path.join(loop.out_dir, f"truth-rank{rank}.json"), "w") as f:
        json.dump(truth, f)
    dist.barrier()
    dist.destroy_process_group()


def run(loop: Loop, timeout_s: float = 240) -> tuple[str, list[int]]:
    """Run the loop as ``loop.ranks`` real processes (``python -c``, so an uncaught exception and a
    signal end a process the way they end a user's script); return the run folder."""
    import subprocess
    import sys

    os.makedirs(loop.out_dir, exist_ok=True)
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"import sys, json; sys.path.insert(0, {root!r}); from tests._loops import _rank_main; "
        "_rank_main(int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("RANKSIGHT_")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), json.dumps(asdict(loop)), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(loop.ranks)
    ]
    outs = [p.communicate(timeout=timeout_s) for p in procs]
    codes = [p.returncode for p in procs]
    if loop.end == "close":
        assert codes == [0] * loop.ranks, f"exit codes {codes}\n" + "\n".join(o[1][-3000:] for o in outs)
    return os.path.join(loop.run_dir, loop.run_id), codes


def truth(out_dir: str, rank: int) -> dict:
    """What rank ``rank`` timed itself: ``fetch_s`` and ``iter_s`` per step."""
    with open(os.path.join(out_dir, f"truth-rank{rank}.json")) as f:
        return json.load(f)


def backward_marks_main(rank: int, port: int, out_dir: str) -> None:
    """A 2-rank gloo DDP job whose rank 1 is 50 ms late into backward; rank 0 records when the agent's
    end-of-backward and all-reduce-done marks fire (the GPU path's hooks, with host clocks as marks)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    from ranksight.agent._gpu_hooks import _hook_backward_end

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
    )
    seen: dict = {}

    class Marks:  # stands for GpuMarks: the same two calls, timed on the host
        def backward_done(self):
            seen["ready"] = time.perf_counter()

        def sync_done(self):
            seen["done"] = time.perf_counter()

    class Monitor:
        _hook_handles: list = []

        def _fail(self, component, exc):
            raise exc

        def _warn_once(self, key, message):
            raise AssertionError(message)

    _hook_backward_end(Monitor(), model, Marks())
    waits = []
    for _ in range(5):
        out = model(torch.randn(8, 64))
        if rank == 1:
            time.sleep(0.05)
        begin = time.perf_counter()
        out.sum().backward()
        waits.append((seen["ready"] - begin, seen["done"] - begin, time.perf_counter() - begin))
    with open(os.path.join(out_dir, f"marks-rank{rank}.json"), "w") as f:
        json.dump(waits, f)
    # Both ranks past their last collective before the group goes: destroyed while the other rank's last
    # all-reduce was still in gloo's hands, rank 0 aborted in about one run in three ("terminate called
    # without an active exception").
    dist.barrier()
    dist.destroy_process_group()
