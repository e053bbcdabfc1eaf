"""Real multi-process training jobs for the tests (gloo on CPU, started with torch.multiprocessing).

Each rank also times its own loop iterations with an independent clock and writes them to
``<out>/loop-rank<r>.json``, so tests can compare the agent's figures with ground truth.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field


@dataclass
class Job:
    """One small DDP training job."""

    run_dir: str
    out_dir: str
    run_id: str = "test-run"
    ranks: int = 2
    steps: int = 20
    width: int = 64
    depth: int = 2
    batch: int = 256
    slow_item_s: float = 0.0  # sleep per batch in the dataset: an input-bound loader
    flush_interval_s: float = 0.5
    kill_rank: int = -1  # SIGKILL this rank...
    kill_at_step: int = -1  # ...after this many steps (and a pause long enough for a flush)
    bucket_cap_mb: float = 25.0
    slow_rank: int = -1  # this rank is slower every step...
    slow_by: str = "work"  # ...by 6 extra forward passes ("work") or a 25-ms sleep inside the step ("sleep")
    comm_hook: bool = False  # the per-bucket comm hook (Config.comm_hook) instead of one sync mark per step
    env: dict = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, job_dict: dict, port: int) -> None:
    job = Job(**job_dict)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(job.ranks),
        RANKSIGHT_RUN_ID=job.run_id,
        **job.env,
    )
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=job.ranks)
    torch.manual_seed(0)
    mon = ranksight.init(
        run_dir=job.run_dir, job="tests", flush_interval_s=job.flush_interval_s, comm_hook=job.comm_hook
    )

    layers: list = [nn.Linear(16, job.width), nn.ReLU()]
    for _ in range(job.depth):
        layers += [nn.Linear(job.width, job.width), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(job.width, 1)), bucket_cap_mb=job.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i):
            if job.slow_item_s:
                time.sleep(job.slow_item_s)
            return torch.randn(job.batch, 16), torch.randn(job.batch, 1)

    loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0)
    loop_s = []
    t_iter = time.perf_counter()
    for step, (x, y) in enumerate(mon.loader(loader)):
        with mon.step():
            if rank == job.slow_rank:
                if job.slow_by == "sleep":
                    time.sleep(0.025)  # blocked, not working: what a rank waiting on its own I/O looks like
                else:
                    with torch.no_grad():
                        for _ in range(6):
                            model.module(x)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        now = time.perf_counter()
        loop_s.append(now - t_iter)
        if rank == job.kill_rank and step + 1 == job.kill_at_step:
            time.sleep(job.flush_interval_s * 3)
            os.kill(os.getpid(), 9)
        if step + 1 >= job.steps:
            break
        t_iter = time.perf_counter()
    mon.close()
    with open(os.path.join(job.out_dir, f"loop-rank{rank}.json"), "w") as f:
        json.dump({"loop_s": loop_s}, f)
    dist.barrier()
    dist.destroy_process_group()


def run(job: Job) -> str:
    """Run the job to completion (or until a rank dies) and return the run folder."""
    import torch.multiprocessing as mp

    os.makedirs(job.out_dir, exist_ok=True)
    try:
        mp.start_processes(_rank_main, args=(asdict(job), free_port()), nprocs=job.ranks, start_method="spawn")
    except mp.ProcessExitedException:
        if job.kill_rank < 0:
            raise
    return os.path.join(job.run_dir, job.run_id)
