"""The framework callbacks on one GPU: do they measure what a torch.profiler trace of the same steps shows, and
what do they cost a ~15-20 s job?

    python benchmarks/callback_parity.py --part parity --out DIR           # ~2-3 min on one H100
    python benchmarks/callback_parity.py --part cost-hf --out DIR          # ~3.5 min: rounds 0-2, callback vs none
    python benchmarks/callback_parity.py --part cost-hf --first-round 3 --out DIR   # rounds 3-5
    python benchmarks/callback_parity.py --part cost-lightning --out DIR   # the same for Lightning (twice)
    python benchmarks/callback_parity.py --part cost-summary --out DIR     # every cost file's rounds, merged
    python benchmarks/callback_parity.py --part parity --device cpu --tiny --out DIR   # a CPU smoke test

``parity``: four healthy jobs, each in a fresh process -- Lightning on one device with ``training_step`` calling
``self(x)`` and ``self.net(x)`` (a ResNet-style CNN, bf16-mixed), the Hugging Face Trainer (GPT-2 small's shape from
a config, bf16; ``--hf-model``) and an Accelerate loop (the CNN, bf16) -- each with ranksight's callback and a
``torch.profiler`` over steps 39-46 (``prof.step()`` at each step's end, so ProfilerStep#k is the agent's step k).
The trace goes through ``ranksight import`` and both runs' phase shares over those steps are read with the same SQL
(the breakdown's, on the GPU's clock). Per job: the "other" share, whether compute and optimizer were attributed
(steps with ``gpu_compute_s`` / ``gpu_optimizer_s``), NVML utilization rows, and the largest phase difference from
the trace (pass: at most 5 pp).

``cost-*``: one discarded warm-up launch (which also sets the step count for ``--job-s`` seconds), then
``--rounds`` rounds of fresh launches with the callback and without it (``--arms ... traceml`` adds TraceML where
``traceml_ai`` imports; then run 2 rounds an invocation), in rotated order; ``cost-summary`` merges the rounds
of several invocations. Each launch times its steps from step 20 to the last on the host after a CUDA
synchronise at both ends (the same timing callback in every arm); the figure is the median over rounds of the
per-round ratio to the unmonitored launch.

Writes ``DIR/<part>.json``; needs torch, lightning, transformers, accelerate, ranksight and duckdb.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

PROFILED = (39, 46)  # the steps the torch.profiler records (wait 38, warm-up 1, active 8)
PHASES = ("data_wait_s", "h2d_s", "compute_s", "comm_exposed_s", "optimizer_s", "other_s")
TIMED_FROM = 20  # the cost arms time steps from here to the last


# ----------------------------------------------------------------------------------------- the workloads
def cnn(width: int):
    """A ResNet-style stack of conv-BN-ReLU blocks (torchvision is not needed)."""
    from torch import nn

    def block(cin: int, cout: int, stride: int):
        conv = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    w = width
    return nn.Sequential(
        block(3, w, 1), block(w, w, 1), block(w, 2 * w, 2), block(2 * w, 2 * w, 1), block(2 * w, 4 * w, 2),
        block(4 * w, 4 * w, 1), block(4 * w, 8 * w, 2), block(8 * w, 8 * w, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 100),
    )  # fmt: skip


def image_loader(n: int, size: int, batch: int, workers: int, pin: bool):
    """Synthetic images decoded in ``__getitem__`` (a random uint8 image scaled to float), a healthy loader."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            img = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g).float().div_(255)
            return img, i % 100

    return DataLoader(Images(), batch_size=batch, num_workers=workers, pin_memory=pin, shuffle=False,
                      persistent_workers=workers > 0, drop_last=True)  # fmt: skip


HF_MODELS = {
    "gpt2": {"gpt_layers": 12, "gpt_embd": 768, "seq": 512, "gpt_batch": 16, "vocab": 50257},
    "small": {"gpt_layers": 6, "gpt_embd": 512, "seq": 256, "gpt_batch": 16, "vocab": 8192},
}
"""The Trainer's model: ``gpt2`` is GPT-2 small's shape (124 M parameters; GPU-bound on one H100, as a user's
GPT-2-class fine-tune is); ``small`` a 6-layer one whose ~14 ms step is bound by the host's Python."""


def sizes(tiny: bool, hf_model: str = "gpt2") -> dict:
    if tiny:
        return {"width": 8, "image": 32, "batch": 8, "workers": 0, "gpt_layers": 2, "gpt_embd": 64, "seq": 32,
                "gpt_batch": 4, "vocab": 512}  # fmt: skip
    return {"width": 64, "image": 96, "batch": 128, "workers": 4, **HF_MODELS[hf_model]}


def thread_cpu() -> dict:
    """CPU seconds of each of this process's threads so far, by Python thread name (``main`` for the training
    thread, ``other`` for threads Python did not start: CUDA's, DataLoader pin-memory threads are Python's)."""
    import threading

    names = {t.native_id: ("main" if t is threading.main_thread() else t.name) for t in threading.enumerate()}
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class Timing:
    """The same step timing in every arm: a CUDA synchronise and a clock read at the end of step ``TIMED_FROM``
    and of the last step; with ``stop_after_s``, asks the framework to stop once that much time has passed.
    Each thread's CPU over the same span says where an arm's extra time went (``thread_cpu_s``); the GPU's SM
    clock, read every 10th timed step, says whether a launch was slower because the card ran slower (NVML's
    device 0: the benchmark runs on a machine of one GPU)."""

    def __init__(self, steps: int, cuda: bool, stop_after_s: float = 0.0) -> None:
        self.steps, self.cuda, self.stop_after_s = steps, cuda, stop_after_s
        self.t0 = self.t1 = 0.0
        self.done = 0
        self.cpu0: dict = {}
        self.cpu1: dict = {}
        self.clocks: list = []
        self.nvml = None

    def step_end(self) -> bool:
        """After each step; True when the job should stop (``stop_after_s`` passed)."""
        self.done += 1
        if self.cuda and self.done > TIMED_FROM and self.done % 10 == 0 and not self.cpu1:
            self.clocks.append(self.sm_clock())
        if self.done == TIMED_FROM or self.done == self.steps or (self.stop_after_s and self.done > TIMED_FROM):
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            now = time.perf_counter()
            if self.done == TIMED_FROM:
                self.t0, self.cpu0 = now, thread_cpu()
            else:
                self.t1 = now
                if self.done == self.steps or self.t1 - self.t0 >= self.stop_after_s > 0:
                    self.cpu1 = thread_cpu()
        return bool(self.stop_after_s and self.t0 and self.t1 - self.t0 >= self.stop_after_s)

    def sm_clock(self) -> float | None:
        try:
            import pynvml

            if self.nvml is None:
                pynvml.nvmlInit()
                self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
            return float(pynvml.nvmlDeviceGetClockInfo(self.nvml, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def figures(self) -> dict:
        timed = self.done - TIMED_FROM
        clocks = [c for c in self.clocks if c is not None]
        cpu = {k: round(v - self.cpu0.get(k, 0.0), 3) for k, v in self.cpu1.items() if v - self.cpu0.get(k, 0.0) > 0}
        return {"steps": self.done, "timed_steps": timed, "timed_s": self.t1 - self.t0,
                "step_s": (self.t1 - self.t0) / timed if timed > 0 else None, "thread_cpu_s": cpu,
                "sm_clock_mhz": statistics.mean(clocks) if clocks else None}  # fmt: skip


def profiler(trace_path: str, cuda: bool):
    """The user's torch.profiler over ``PROFILED`` steps, exported as a Chrome trace."""
    from torch.profiler import ProfilerActivity, profile, schedule

    first, last = PROFILED
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(
        activities=acts,
        schedule=schedule(wait=first - 1, warmup=1, active=last - first + 1, repeat=1),
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(trace_path),
    )


ARMS = ["ranksight", "ranksight-nowindow", "ranksight-window50", "none", "traceml"]
"""``ranksight-nowindow``: the callback without the sampled kernel window; ``ranksight-window50``: its first window
at step 50 whatever the time (``trace_first_s=0``, the default before): what the window costs a short job."""


def ranksight_options(args) -> dict:
    run_id = f"{args.job}-{args.arm}-{args.tag}"
    options = {"run_dir": os.path.join(args.out, "runs"), "run_id": run_id, "job": args.job}
    gpu = {"ranksight-nowindow": {"trace_window": False}, "ranksight-window50": {"trace_first_s": 0.0}}.get(args.arm)
    return {**options, "gpu": gpu} if gpu else options


def traceml_start(args, model_hook):
    """TraceML's documented path for a script it does not launch (``traceml serve`` beside the job,
    ``traceml.init(mode="auto")``, ``trace_step(model)`` around each step); returns (enter, exit, stop)."""
    import socket

    import traceml_ai as traceml

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = os.path.join(args.out, "traceml")
    session = f"{args.job}-{args.tag}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai.launcher.cli", "serve", "--mode", "summary", "--logs-dir", logs,
         "--run-name", session, "--nproc-per-node", "1", "--aggregator-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    time.sleep(3.0)
    traceml.init(mode="auto", session_id=session, aggregator_port=port, logs_dir=logs, on_missing_aggregator="raise")
    box: list = []

    def enter():
        cm = traceml.trace_step(model_hook())
        cm.__enter__()
        box.append(cm)

    def leave():
        if box:
            box.pop().__exit__(None, None, None)

    def stop():
        import signal

        serve.send_signal(signal.SIGINT)
        try:  # its summary is not read here: the launch's timing ended before this
            serve.wait(timeout=5)
        except subprocess.TimeoutExpired:
            serve.kill()

    return enter, leave, stop


def run_lightning(args, style: str) -> dict:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer
    from torch import nn

    s, cuda = sizes(args.tiny), args.device == "cuda"
    torch.manual_seed(0)

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = cnn(s["width"])

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x) if style == "self" else self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    timing = Timing(args.steps, cuda, args.seconds)
    tm = None

    class Marks(Callback):
        def on_train_start(self, trainer, pl_module):
            if prof is not None:
                prof.start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if tm is not None:
                tm[0]()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if tm is not None:
                tm[1]()
            if prof is not None:
                prof.step()
            if timing.step_end():
                trainer.should_stop = True

    callbacks: list = []
    if args.arm.startswith("ranksight"):
        from ranksight.integrations.lightning import RanksightCallback

        callbacks.append(RanksightCallback(**ranksight_options(args)))
    module = Module()
    if args.arm == "traceml":
        tm = traceml_start(args, lambda: module)
    prof = profiler(os.path.join(args.out, f"{args.job}-{args.tag}.trace.json"), cuda) if args.profile else None
    callbacks.append(Marks())
    trainer = Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, precision="bf16-mixed" if cuda else "32-true",
        max_steps=args.steps if not args.seconds else 10**6, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(prefix="rs-parity-"),
    )  # fmt: skip
    n = s["batch"] * (args.steps if not args.seconds else 100_000)
    trainer.fit(module, image_loader(n, s["image"], s["batch"], s["workers"], cuda))
    if prof is not None:
        prof.stop()
    if tm is not None:
        tm[2]()
    return timing.figures()


def run_transformers(args) -> dict:
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    s, cuda = sizes(args.tiny, args.hf_model), args.device == "cuda"
    torch.manual_seed(0)

    class Tokens(Dataset):
        def __len__(self) -> int:
            return 10**7

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, s["vocab"], (s["seq"],), generator=g)
            return {"input_ids": ids, "labels": ids}

    config = GPT2Config(vocab_size=s["vocab"], n_positions=s["seq"], n_embd=s["gpt_embd"], n_layer=s["gpt_layers"],
                        n_head=max(1, s["gpt_embd"] // 64))  # fmt: skip
    model = GPT2LMHeadModel(config)
    timing = Timing(args.steps, cuda, args.seconds)
    tm = traceml_start(args, lambda: model) if args.arm == "traceml" else None
    prof = profiler(os.path.join(args.out, f"{args.job}-{args.tag}.trace.json"), cuda) if args.profile else None

    class Marks(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            if prof is not None:
                prof.start()

        def on_step_begin(self, a, state, control, **kw):
            if tm is not None:
                tm[0]()

        def on_step_end(self, a, state, control, **kw):
            if tm is not None:
                tm[1]()
            if prof is not None:
                prof.step()
            if timing.step_end():
                control.should_training_stop = True

    callbacks: list = []
    if args.arm.startswith("ranksight"):
        from ranksight.integrations.transformers import RanksightCallback

        callbacks.append(RanksightCallback(**ranksight_options(args)))
    callbacks.append(Marks())
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="rs-parity-hf-"), per_device_train_batch_size=s["gpt_batch"],
        max_steps=args.steps if not args.seconds else 10**6, bf16=cuda, use_cpu=not cuda,
        dataloader_num_workers=min(2, s["workers"]), dataloader_pin_memory=cuda, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, learning_rate=1e-4,
    )  # fmt: skip
    Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=callbacks).train()
    if prof is not None:
        prof.stop()
    if tm is not None:
        tm[2]()
    return timing.figures()


def run_accelerate(args) -> dict:
    import torch
    from accelerate import Accelerator
    from torch import nn

    s, cuda = sizes(args.tiny), args.device == "cuda"
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    model = cnn(s["width"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = image_loader(s["batch"] * (args.steps + 8), s["image"], s["batch"], s["workers"], cuda)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    timing = Timing(args.steps, cuda, 0.0)
    prof = profiler(os.path.join(args.out, f"{args.job}-{args.tag}.trace.json"), cuda) if args.profile else None
    tracker = None
    if args.arm.startswith("ranksight"):
        from ranksight.integrations.accelerate import attach

        tracker = attach(accelerator, model, opt, **ranksight_options(args))
    batches = tracker.loader(loader) if tracker is not None else loader
    if prof is not None:
        prof.start()
    for i, (x, y) in enumerate(batches):
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if prof is not None:
            prof.step()
        timing.step_end()
        if i + 1 >= args.steps:
            break
    if prof is not None:
        prof.stop()
    if tracker is not None:
        tracker.close()
    return timing.figures()


JOBS = {
    "lightning-self": lambda a: run_lightning(a, "self"),
    "lightning-net": lambda a: run_lightning(a, "net"),
    "transformers": run_transformers,
    "accelerate": run_accelerate,
}


def child(argv: list[str]) -> None:
    """One job in this process; its figures as the last stdout line."""
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True, choices=list(JOBS))
    p.add_argument("--arm", default="ranksight", choices=ARMS)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seconds", type=float, default=0.0, help="run until this long past step 20 (calibration)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--tag", default="0")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--hf-model", default="gpt2", choices=list(HF_MODELS))
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    figures = JOBS[a.job](a)
    figures.update(job=a.job, arm=a.arm, tag=a.tag)
    print(json.dumps(figures))


def launch(args, job: str, arm: str, tag: str, steps: int, profile: bool = False, seconds: float = 0.0) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--job", job, "--arm", arm, "--steps", str(steps),
           "--tag", tag, "--device", args.device, "--out", args.out]  # fmt: skip
    cmd += (["--profile"] if profile else []) + (["--tiny"] if args.tiny else []) + ["--hf-model", args.hf_model]
    cmd += ["--seconds", str(seconds)] if seconds else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.update(NCCL_NVLS_ENABLE="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"job": job, "arm": arm, "tag": tag, "error": proc.stderr[-2500:], "launch_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["launch_s"] = wall
    return out


# ----------------------------------------------------------------------------------------- reading the runs
def phase_shares(run_path: str, first: int, last: int) -> dict:
    """Each phase's share of the period over steps ``first..last`` (rank 0), as the breakdown sums them."""
    from ranksight.collectors import open_run
    from ranksight.collectors._queries import steps_source
    from ranksight.format.phases import PERIOD_SQL, PHASE_SQL

    con = open_run(run_path)
    cols = ", ".join(f"sum({PHASE_SQL[p]}) / sum(period_s)" for p in PHASES)
    sql = f"""SELECT count(*), {cols} FROM (SELECT *, {PERIOD_SQL} AS period_s FROM {steps_source()})
              WHERE rank = 0 AND step BETWEEN ? AND ?"""
    n, *values = con.execute(sql, [first, last]).fetchone()
    return {"steps": n, **{p[:-2]: v for p, v in zip(PHASES, values)}}


def run_facts(run_path: str) -> dict:
    """Whether compute and the optimizer were attributed on every step, and NVML's rows."""
    from ranksight.collectors import open_run

    con = open_run(run_path)
    n, comp, opt, gcomp, gopt, h2d = con.execute(
        "SELECT count(*), count(compute_s), count(optimizer_s), count(gpu_compute_s), count(gpu_optimizer_s), "
        "count(h2d_s) FROM steps WHERE rank = 0 AND step >= 5"
    ).fetchone()
    nvml = con.execute("SELECT count(*) FROM samples WHERE name = 'gpu_utilization_ratio'").fetchone()[0]
    window = dict(
        con.execute(
            "SELECT name, max(value) FROM samples WHERE name IN ('trace_window_reduce_seconds', "
            "'trace_window_cost_seconds', 'trace_window_stop_seconds', 'kernel_busy_ratio') GROUP BY name"
        ).fetchall()
    )
    try:
        import pynvml  # noqa: F401

        nvml_importable = True
    except ImportError:
        nvml_importable = False
    return {"steps": n, "compute_attributed": comp, "optimizer_attributed": opt, "gpu_compute_attributed": gcomp,
            "gpu_optimizer_attributed": gopt, "h2d_attributed": h2d, "nvml_rows": nvml,
            "pynvml_importable": nvml_importable, "kernel_window": window}  # fmt: skip


def split_closure(trace_path: str) -> str:
    """The trace with each ``Optimizer.step#`` span starting where the last backward op inside it ended.

    Why: Lightning runs forward and backward inside ``optimizer.step(closure)``, so the importer, which takes
    that span as the optimizer's, would read the whole step as optimizer. The closure's end is the last
    autograd op inside the span (as the callback's ``on_before_optimizer_step`` marks it)."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X"]
    # Any thread: on a GPU, autograd runs backward on its own device thread, not the caller's.
    backward = sorted(
        float(e["ts"]) + float(e.get("dur", 0))
        for e in events
        if str(e.get("name", "")).startswith("autograd::engine::evaluate_function")
    )
    for e in events:
        if not str(e.get("name", "")).startswith("Optimizer.step#"):
            continue
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        inside = [t for t in backward if start <= t <= end]
        if inside:
            e["ts"], e["dur"] = max(inside), end - max(inside)
    out = trace_path.replace(".trace.json", ".split.trace.json")
    with open(out, "w") as f:
        json.dump(trace, f)
    return out


def part_parity(args) -> dict:
    from ranksight.importer import import_traces

    first, last = PROFILED
    jobs = {}
    for job in args.jobs or JOBS:
        res = launch(args, job, "ranksight", "parity", steps=last + 24, profile=True)
        if "error" in res:
            jobs[job] = res
            print(f"{job}: FAILED\n{res['error']}", flush=True)
            continue
        run = os.path.join(args.out, "runs", f"{job}-ranksight-parity")
        trace = os.path.join(args.out, f"{job}-parity.trace.json")
        if job.startswith("lightning"):
            trace = split_closure(trace)
        imported = import_traces([trace], os.path.join(args.out, "imported"), run_id=f"{job}-trace", job="trace")
        agent, traced = phase_shares(run, first, last), phase_shares(imported.run_path, first, last)
        diffs = {p: abs((agent[p] or 0) - (traced[p] or 0)) for p in (k[:-2] for k in PHASES)}
        facts = run_facts(run)
        jobs[job] = {"agent": agent, "trace": traced, "diff_pp": {p: d * 100 for p, d in diffs.items()},
                     "max_diff_pp": max(diffs.values()) * 100, "within_5pp": max(diffs.values()) <= 0.05,
                     "other_share": agent["other"], **facts, "figures": res,
                     "import_problems": imported.problems[:5]}  # fmt: skip
        print(f"{job}: other {agent['other'] or 0:.3f}, compute {agent['compute'] or 0:.3f} "
              f"(trace {traced['compute'] or 0:.3f}), optimizer {agent['optimizer'] or 0:.3f} "
              f"(trace {traced['optimizer'] or 0:.3f}), max diff {max(diffs.values()) * 100:.1f} pp, "
              f"GPU compute on {facts['gpu_compute_attributed']}/{facts['steps']} steps, "
              f"NVML rows {facts['nvml_rows']}",
              flush=True)  # fmt: skip
    return {"profiled_steps": PROFILED, "jobs": jobs}


def part_cost(args, job: str, save=lambda figures: None) -> dict:
    """The cost rounds; ``save`` gets the figures so far after each round (a call cut short keeps its rounds)."""
    from benchmarks._harness import rotated

    arms = list(args.arms)
    if "traceml" in arms:
        try:
            import traceml_ai  # noqa: F401
        except ImportError:
            arms.remove("traceml")
            print("traceml_ai does not import: its arm is left out", flush=True)
    warm = launch(args, job, "none", "warm", steps=10**6, seconds=args.job_s / 2)
    rate = 1.0 / warm["step_s"] if warm.get("step_s") else None
    steps = int(TIMED_FROM + args.job_s * rate) if rate else 400
    print(f"warm-up: {warm.get('step_s')} s a step -> {steps} steps a launch", flush=True)
    rounds: list = []
    for r in range(args.first_round, args.first_round + args.rounds):
        got = {}
        for arm in rotated(arms, r):
            got[arm] = launch(args, job, arm, f"r{r}", steps=steps)
            if arm.startswith("ranksight") and "error" not in got[arm]:  # what the kernel window cost this launch
                try:
                    got[arm]["agent"] = run_facts(os.path.join(args.out, "runs", f"{job}-{arm}-r{r}"))["kernel_window"]
                except Exception as exc:  # a figure missing from the results, not a lost round
                    got[arm]["agent"] = {"error": str(exc)}
            print(f"round {r} {arm}: {got[arm].get('step_s')} s a step, SM {got[arm].get('sm_clock_mhz')} MHz, "
                  f"launch {got[arm]['launch_s']:.1f} s"
                  + (" FAILED" if "error" in got[arm] else ""), flush=True)  # fmt: skip
        base = got["none"].get("step_s")
        ratios = {arm: (got[arm]["step_s"] / base if base and got[arm].get("step_s") else None) for arm in arms}
        rounds.append({"round": r, "order": rotated(arms, r), "launches": got, "ratio": ratios})
        save({"job": job, "steps": steps, "warm": warm, "arms": arms, "rounds": rounds})
    summary = {
        arm: statistics.median([x["ratio"][arm] for x in rounds if x["ratio"][arm] is not None] or [float("nan")])
        for arm in arms
    }
    print("median ratio to none:", json.dumps(summary), flush=True)
    return {"job": job, "hf_model": args.hf_model, "steps": steps, "warm": warm, "arms": arms, "rounds": rounds,
            "median_ratio": summary}  # fmt: skip


def median_interval(values: list, draws: int = 4000) -> list:
    """A 95 % bootstrap interval of the median of ``values`` (the rounds' ratios): how finely the rounds resolve it."""
    import random

    if len(values) < 2:
        return [float("nan"), float("nan")]
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return [meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]]


def part_summary(args) -> dict:
    """The cost parts' rounds merged per job (several invocations, each with its own warm-up launch)."""
    merged: dict = {}
    for name in sorted(os.listdir(args.out)):
        if not (name.startswith("cost-") and name.endswith(".json")):
            continue
        with open(os.path.join(args.out, name)) as f:
            part = json.load(f)
        job = merged.setdefault(part["job"], {"files": [], "rounds": []})
        job["files"].append(name)
        job["rounds"].extend(part["rounds"])
    for job in merged.values():
        arms = sorted({a for r in job["rounds"] for a in r["ratio"]})
        job["median_ratio"] = {
            a: statistics.median([r["ratio"][a] for r in job["rounds"] if r["ratio"].get(a) is not None] or [0.0])
            for a in arms
        }
        job["ratios"] = {a: [r["ratio"].get(a) for r in job["rounds"]] for a in arms}
        job["median_interval_95"] = {a: median_interval([x for x in job["ratios"][a] if x is not None]) for a in arms}
        print(f"{job['files']}: {len(job['rounds'])} rounds, median ratio to none {json.dumps(job['median_ratio'])}")
    return {"jobs": merged}


def main() -> None:
    if "--child" in sys.argv:
        child([a for a in sys.argv[1:] if a != "--child"])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", required=True, choices=["parity", "cost-hf", "cost-lightning", "cost-summary"])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="small models (a CPU smoke test)")
    p.add_argument("--hf-model", default="gpt2", choices=list(HF_MODELS), help="the Trainer's model (HF_MODELS)")
    p.add_argument("--rounds", type=int, default=3, help="cost: rounds in this invocation")
    p.add_argument("--first-round", type=int, default=0, help="cost: the first round's number (sets the rotation)")
    p.add_argument("--arms", nargs="+", default=["ranksight", "none"], choices=ARMS)
    p.add_argument("--job-s", type=float, default=15.0, help="seconds of timed steps a cost launch runs")
    p.add_argument("--jobs", nargs="*", choices=list(JOBS), help="parity: these jobs only (default: all)")
    args = p.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    name = args.part
    if args.part == "parity":
        figures = part_parity(args)
    elif args.part == "cost-summary":
        figures = part_summary(args)
    else:
        name = f"{args.part}-r{args.first_round}"
        job = "transformers" if args.part == "cost-hf" else "lightning-net"
        figures = part_cost(args, job, save=lambda so_far: write(args.out, name, so_far))
    figures["wall_s"] = time.perf_counter() - t0
    write(args.out, name, figures)


def write(out: str, name: str, figures: dict) -> None:
    try:
        from benchmarks._harness import header

        figures["header"] = header()
    except Exception:
        pass
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(figures, f, indent=1, default=str)
    print(f"wrote {os.path.join(out, name + '.json')} ({figures.get('wall_s', 0):.0f} s)", flush=True)


if __name__ == "__main__":
    main()
