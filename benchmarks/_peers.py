"""The peers benchmarked beside ranksight, attached to one 2-rank gloo DDP loop (shared by the CPU benchmarks).

One *arm* is one way a user watches the job:

- ``baseline``: nothing attached.
- ``ranksight``: ``ranksight.init`` + ``watch`` + ``loader`` + ``step`` (the documented three lines).
- ``profiler``: ``torch.profiler.profile`` left on with a repeating schedule, CPU activities and a
  Chrome trace written by ``on_trace_ready`` each cycle (what people do to "keep an eye" on a job).
- ``traceml``: TraceML 0.5.0 (``traceml-ai``) through its documented serve path: ``traceml serve`` (the
  aggregator, one process per job) and ``traceml.init(mode="auto")`` + ``traceml.trace_step(model)`` in
  each rank. Auto mode patches the DataLoader, forward, backward and H2D copies.
- ``poller``: a daemon thread reading process/system stats every second with psutil, the CPU-only
  analogue of the NVML/system-metrics pollers of W&B and Lightning's ``DeviceStatsMonitor`` (there is
  no NVML on a CPU machine).

Each rank times every loop iteration (batch fetch + step) with its own ``perf_counter`` and writes
``<out>/arm-rank<r>.json``; RSS is read from ``/proc/self/status`` after the timed steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from _harness import alternating, free_port

ARMS = ("baseline", "ranksight", "profiler", "traceml", "poller")
# A fork server with torch imported once: each launch then forks a warm interpreter instead of paying
# a fresh torch import per rank (seconds on a loaded machine). Tools are attached after the fork.
START_METHOD = "forkserver"


@dataclass
class Workload:
    """One training job: an MLP over a synthetic in-memory data set, ``ranks`` gloo ranks."""

    width: int = 256
    depth: int = 3
    batch: int = 256
    ranks: int = 2
    """gloo ranks, one process each."""
    steps: int = 200
    warmup_steps: int = 20
    warmup_min_s: float = 3.0
    """Warm up for at least this long too (the ranks agree on when), so that start-up work such as the
    agent's first flush (2 s in; it imports pyarrow) is over before timing starts."""
    item_sleep_s: float = 0.0
    """Sleep per item in ``__getitem__`` (an input-bound loader); 0 for the overhead runs."""
    straggler_factor: int = 1
    """The last rank repeats each hidden layer this many times (a compute straggler)."""
    sync_bucket_cap_mb: float = 25.0


@dataclass
class Launch:
    """One launch of the workload with one arm attached."""

    arm: str
    workload: Workload
    out_dir: str
    run_dir: str
    run_id: str
    profiler_schedule: tuple = (1, 1, 3)
    """(wait, warmup, active) of the profiler schedule; repeat=0 (until the end of the run)."""
    traceml_port: int = 0
    traceml_session: str = ""
    traceml_logs: str = ""
    env: dict = field(default_factory=dict)


def versions() -> dict:
    """Python's, torch's and TraceML's versions (None where TraceML is not installed): what the peers ran on."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        traceml = version("traceml-ai")
    except PackageNotFoundError:
        traceml = None
    return {"python": sys.version.split()[0], "torch": torch.__version__, "traceml-ai": traceml}


def rss_bytes() -> tuple[int, int]:
    """Return (VmRSS, VmHWM) of this process in bytes, from /proc/self/status."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, kb, _ = line.split()
                values[key[:-1]] = int(kb) * 1024
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) used so far by each thread of this process, by native thread id."""
    import psutil

    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


class Poller:
    """A 1 s system-metrics poller thread, as experiment trackers run beside training."""

    def __init__(self, interval_s: float = 1.0) -> None:
        import psutil

        self._proc = psutil.Process()
        self._psutil = psutil
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.samples: list[dict] = []
        self._thread = threading.Thread(target=self._loop, name="poller", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append(
                {
                    "time": time.time(),
                    "cpu_percent": self._psutil.cpu_percent(),
                    "proc_cpu_percent": self._proc.cpu_percent(),
                    "rss": self._proc.memory_info().rss,
                    "mem_percent": self._psutil.virtual_memory().percent,
                    "threads": self._proc.num_threads(),
                }
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def mlp(in_features: int, width: int, depth: int, slow: int = 1):
    """The peers' job and ``import_trace.py``'s: an MLP of ``depth`` hidden layers, each run ``slow`` times (a
    compute straggler; the extra passes leave the result unchanged)."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(in_features, width)
            self.body = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.out = nn.Linear(width, 1)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for layer in self.body:
                h = torch.relu(layer(h))
                for _ in range(slow - 1):
                    h = h + 0.0 * torch.relu(layer(h))
            return self.out(h)

    return Net()


def _build(workload: Workload, rank: int):
    import torch

    slow = workload.straggler_factor if rank == workload.ranks - 1 else 1

    n_items = workload.batch * 64

    class Synthetic(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(rank)
            self.x = torch.randn(n_items, 32, generator=g)
            self.y = self.x.sum(dim=1, keepdim=True) * 0.1

        def __len__(self) -> int:
            return n_items

        def __getitem__(self, idx):
            if workload.item_sleep_s:
                time.sleep(workload.item_sleep_s * len(idx))
            return self.x[idx[0] : idx[-1] + 1], self.y[idx[0] : idx[-1] + 1]

    sampler = torch.utils.data.BatchSampler(range(n_items), workload.batch, drop_last=True)
    loader = torch.utils.data.DataLoader(Synthetic(), sampler=sampler, batch_size=None, num_workers=0)
    return mlp(32, workload.width, workload.depth, slow), loader


def _batches(loader, total: int):
    """Yield ``total`` batches, cycling over the loader's epochs."""
    n = 0
    while True:
        for batch in loader:
            yield batch
            n += 1
            if n >= total:
                return


def _all_ranks_past(t_start: float, work: Workload) -> bool:
    """True once every rank has warmed up for ``work.warmup_min_s`` (one tiny all-reduce, warmup only)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if time.perf_counter() - t_start >= work.warmup_min_s else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag[0] == 1.0)


def init_rank(rank: int, ranks: int, port: int, **env: str) -> None:
    """Join a ``ranks``-rank gloo group on the loopback as ``rank`` (torchrun's variables set, ``env`` too), one
    torch thread per rank as on a shared 2-core machine."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks), **env)  # fmt: skip
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)


def train_step(model, opt, loss_fn, x, y) -> None:
    """One plain training step: forward, loss, backward, optimizer."""
    loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def rank_main(rank: int, launch_dict: dict, port: int) -> None:
    """Body of one rank: build the job, attach the arm's tool, time every iteration."""
    launch = Launch(**{**launch_dict, "workload": Workload(**launch_dict["workload"])})
    work = launch.workload
    init_rank(rank, work.ranks, port, RANKSIGHT_RUN_ID=launch.run_id, **launch.env)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    rss_start, _ = rss_bytes()

    arm = launch.arm
    mon = prof = poller = traceml = None
    if arm == "traceml":
        import traceml_ai as traceml

        traceml.init(
            mode="auto",
            session_id=launch.traceml_session,
            aggregator_port=launch.traceml_port,
            logs_dir=launch.traceml_logs,
            on_missing_aggregator="raise",
        )
    model, loader = _build(work, rank)
    model = DDP(model, bucket_cap_mb=work.sync_bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()

    batches = _batches(loader, 10**12)  # the loop below decides when to stop
    if arm == "ranksight":
        import ranksight

        mon = ranksight.init(run_dir=launch.run_dir, job="bench", flush_interval_s=2.0)
        mon.watch(model, optimizer=opt)
        batches = mon.loader(batches)
    elif arm == "profiler":
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        wait, warmup, active = launch.profiler_schedule
        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=0),
            on_trace_ready=tensorboard_trace_handler(os.path.join(launch.out_dir, "profiler", f"rank{rank}")),
        )
        prof.start()
    elif arm == "poller":
        poller = Poller(1.0)

    loop_s: list[float] = []
    warmup_s: list[float] = []
    cpu_begin = cpu_thread_begin = 0.0
    threads_begin: dict = {}
    step = timed = 0
    timing = False
    t_start = t_iter = time.perf_counter()
    for x, y in batches:
        if not timing and step >= work.warmup_steps and step % 10 == 0 and _all_ranks_past(t_start, work):
            timing = True
            # CPU time of the whole process (training thread + the tool's threads) and of this thread alone:
            # unlike wall time, it barely moves when other jobs share the cores.
            cpu_begin, cpu_thread_begin = time.process_time(), time.thread_time()
            threads_begin = thread_cpu()
            t_iter = time.perf_counter()
        with mon.step() if mon is not None else traceml.trace_step(model) if traceml else contextlib.nullcontext():
            train_step(model, opt, loss_fn, x, y)
        if prof is not None:
            prof.step()
        now = time.perf_counter()
        (loop_s if timing else warmup_s).append(now - t_iter)
        step += 1
        t_iter = now
        if timing:
            timed += 1
            if timed >= work.steps:
                break
    cpu_s, cpu_thread_s = time.process_time() - cpu_begin, time.thread_time() - cpu_thread_begin
    threads_end = thread_cpu()
    main_tid = threading.get_native_id()
    # CPU of every thread but the training thread over the timed window: gloo's and DDP's own threads in
    # every arm, plus the tool's threads (agent, poller, TraceML's runtime, profiler) where there is one.
    other_threads_cpu_s = sum(cpu - threads_begin.get(tid, 0.0) for tid, cpu in threads_end.items() if tid != main_tid)
    # The same, by Python thread name (the tool's own threads); threads Python did not start are "native".
    names = {t.native_id: t.name for t in threading.enumerate()}
    named_threads_cpu_s: dict = {}
    for tid, cpu in threads_end.items():
        if tid != main_tid:
            name = names.get(tid, "native")
            named_threads_cpu_s[name] = named_threads_cpu_s.get(name, 0.0) + cpu - threads_begin.get(tid, 0.0)
    rss_end, hwm = rss_bytes()

    if prof is not None:
        prof.stop()
    if poller is not None:
        poller.close()
    if mon is not None:
        mon.close()
    with open(os.path.join(launch.out_dir, f"{arm}-rank{rank}.json"), "w") as f:
        json.dump(
            {
                "loop_s": loop_s,
                "warmup_s": warmup_s,
                "cpu_s": cpu_s,
                "cpu_thread_s": cpu_thread_s,
                "other_threads_cpu_s": other_threads_cpu_s,
                "named_threads_cpu_s": named_threads_cpu_s,
                "imported": {m: m in sys.modules for m in ("pyarrow", "pandas", "duckdb")},
                "rss_start": rss_start,
                "rss_end": rss_end,
                "rss_hwm": hwm,
            },
            f,
        )
    dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def traceml_aggregator(ranks: int, port: int, session: str, logs: str, log_path: str, timeout_s: float = 120.0):
    """``traceml serve`` (summary mode) for one launch while the block runs; then Ctrl+C, on which it finalises
    and writes ``final_summary.{json,txt}`` under ``logs/session``; its own output goes to ``log_path``."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "traceml"), "serve", "--mode", "summary", "--logs-dir", logs,
           "--run-name", session, "--nproc-per-node", str(ranks), "--aggregator-port", str(port)]  # fmt: skip
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def start_ranks(fn, args: tuple, ranks: int, out_dir: str) -> None:
    """``fn(rank, *args)`` in ``ranks`` processes forked from a server that imported torch once, until all end."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel", "_peers"])
    os.makedirs(out_dir, exist_ok=True)
    mp.start_processes(fn, args=args, nprocs=ranks, start_method=START_METHOD)


def _tree_usage(pid: int) -> tuple[int, float]:
    """(RSS bytes, CPU seconds so far) of a process and its children; zeros when it is gone."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
        cpu = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        return sum(p.memory_info().rss for p in procs), cpu
    except psutil.Error:
        return 0, 0.0


def run_launch(launch: Launch, aggregator_timeout_s: float = 120.0) -> dict:
    """Run one launch to completion; return each rank's timings and RSS, and the aggregator's RSS (TraceML)."""
    aggregator_rss, aggregator_cpu_s = 0, 0.0
    aggregator = contextlib.nullcontext()
    if launch.arm == "traceml":
        launch.traceml_port = launch.traceml_port or free_port()
        launch.traceml_logs = launch.traceml_logs or os.path.join(launch.out_dir, "traceml-logs")
        launch.traceml_session = launch.traceml_session or launch.run_id
        aggregator = traceml_aggregator(launch.workload.ranks, launch.traceml_port, launch.traceml_session,
                                        launch.traceml_logs, os.path.join(launch.out_dir, "traceml-serve.log"),
                                        aggregator_timeout_s)  # fmt: skip
    with aggregator as proc:
        try:
            start_ranks(rank_main, (asdict(launch), free_port()), launch.workload.ranks, launch.out_dir)
        finally:
            if proc is not None:  # measured before Ctrl+C: what it held through the run
                aggregator_rss, aggregator_cpu_s = _tree_usage(proc.pid)
    result: dict = {"aggregator_rss": aggregator_rss, "aggregator_cpu_s": aggregator_cpu_s}
    for r in range(launch.workload.ranks):
        with open(os.path.join(launch.out_dir, f"{launch.arm}-rank{r}.json")) as f:
            result[f"rank{r}"] = json.load(f)
    return result


# --- In-process A/B: the same DDP job with and without ranksight, alternating blocks in one process ---


def ab_rank_main(
    rank: int, work_dict: dict, port: int, out_dir: str, run_dir: str, blocks: int, block_steps: int, options: dict
):
    """Two identical DDP models in one process group, one watched by ranksight; blocks alternate A-B-B-A.

    Machine noise hits both models alike (same process, seconds apart), so the ratio resolves a few
    percent even on a loaded machine. The agent thread runs through both kinds of block: this isolates
    what ranksight adds to the training thread (marks, forward/optimizer hooks, DDP comm hook); the agent
    thread's own CPU is measured per thread in the cross-process runs.
    """
    work = Workload(**work_dict)
    init_rank(rank, work.ranks, port, RANKSIGHT_RUN_ID="ab")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight

    models, loaders, opts = [], [], []
    for _ in range(2):
        torch.manual_seed(0)
        net, loader = _build(work, rank)
        model = DDP(net, bucket_cap_mb=work.sync_bucket_cap_mb)
        models.append(model)
        loaders.append(loader)
        opts.append(torch.optim.SGD(model.parameters(), lr=1e-3))
    options = dict(options)
    if options.pop("plain_python_hook", False):
        # Give the plain model PyTorch's own Python all-reduce hook: separates the cost of running DDP
        # through a Python comm hook at all from what ranksight's hook adds on top of it.
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        models[0].register_comm_hook(state=None, hook=allreduce_hook)
    mon = ranksight.init(run_dir=run_dir, job="bench-ab", flush_interval_s=2.0, **options)
    mon.watch(models[1], optimizer=opts[1])
    loss_fn = torch.nn.MSELoss()
    total = 10**12
    streams = [_batches(loaders[0], total), iter(mon.loader(_batches(loaders[1], total)))]

    def block(i: int) -> None:
        model, opt, stream = models[i], opts[i], streams[i]
        for _ in range(block_steps):
            x, y = next(stream)
            with mon.step() if i else contextlib.nullcontext():
                train_step(model, opt, loss_fn, x, y)

    # Warm both paths (first hooks, DDP's bucket rebuild) and get past the agent's first flush.
    t_start = time.perf_counter()
    while True:
        block(0)
        block(1)
        if _all_ranks_past(t_start, work):
            break
    pairs = alternating(lambda: block(0), lambda: block(1), blocks)
    mon.close()
    per_step = {f"{side}{kind}": [p[i][j] / block_steps for p in pairs]
                for i, side in enumerate(("plain", "watched")) for j, kind in enumerate(("_s", "_cpu_s"))}  # fmt: skip
    with open(os.path.join(out_dir, f"ab-rank{rank}.json"), "w") as f:
        json.dump(per_step, f)
    dist.barrier()
    dist.destroy_process_group()


def run_ab(workload: Workload, out_dir: str, blocks: int, block_steps: int, options: dict | None = None) -> dict:
    """Run the in-process A/B job; return rank 0's per-block step times for both models.

    ``options`` go to ``ranksight.init`` (e.g. ``comm_hook=False`` to see what the DDP comm hook costs).
    """
    runs = os.path.join(out_dir, "runs")
    start_ranks(ab_rank_main, (asdict(workload), free_port(), out_dir, runs, blocks, block_steps, options or {}),
                workload.ranks, out_dir)  # fmt: skip
    with open(os.path.join(out_dir, "ab-rank0.json")) as f:
        return json.load(f)
