"""What watching a one-GPU training job costs, side by side: no tool, ranksight, ranksight disabled,
TraceML 0.5.0 and ``torch.profiler``, each arm a fresh process, the order rotated every round.

    python benchmarks/gpu_cost.py --json gpu_cost.json                    # H200: ~6 minutes
    python benchmarks/gpu_cost.py --device cpu --smoke --json /tmp/c.json  # the whole rotation on a CPU

The job: a small GPT (``benchmarks/gpu_workload.py``; bf16 autocast, AdamW) on batches already on the
GPU, at a ~3 ms and a ~10 ms step (``--sizes``; the layers and batch are found once, in a calibration
process, and then fixed for every arm). Each launch:

1. attaches its arm's tool, the way a user would: ``ranksight.init()`` with its defaults +
   ``mon.watch(model, optimizer=opt)`` + ``with mon.step():``; ``ranksight.init(enabled=False)`` with the
   same calls; TraceML's documented path for a script it does not launch (``traceml serve`` started
   beside the job, ``traceml.init(mode="auto")`` + ``with traceml.trace_step(model):``);
   ``torch.profiler.profile(schedule=schedule(wait=20, warmup=5, active=5, repeat=0))`` left on,
   ``prof.step()`` every step;
2. warms up for the same number of steps in every arm (``--warmup-s`` at the calibrated step: past the
   agent's first flush, which opens the spool and NVML, and its first kernel window at step 50);
3. times ``--timed-s`` worth of steps (about a whole number of the agent's 2-s flushes) in blocks
   between ``synchronize()``; the run's figure is the mean step over all timed steps, so every flush
   inside counts;
4. measures the host's lead: steps run one at a time between syncs, host enqueue time against the
   GPU time of CUDA events around them (a step whose enqueue is shorter than its GPU time is GPU-bound);
5. (arm ``ranksight`` only) the kernel window's one-off cost: a span of ``flush + 0.5 s`` with one window
   forced in it against the same span without, so the window's reduction on the agent thread counts.

Per round the ratio of each arm's mean step to the same round's ``none``; the figure is the median
over rounds with its min-max. Beside it: GPU utilization (NVML samples of a separate poller process,
within each launch's timed span), the CPU per step of the main thread, of the whole process and of each
tool's own threads (by thread name), the warm-up's extra time over ``none`` (the tool's start-up, first
flush and first window), and the agent's flush time. Every process gets the same CPU affinity
(``--cpus``). Launches are forked from a parent that imported torch but never touched CUDA
(``--start fork``, ~1 s per launch instead of ~6), or started as new interpreters (``--start spawn``).

Extra ranksight arms with other options: ``--extra-arm 'ranksight_k1={"gpu": {"events_every_steps": 1}}'``.
An arm that cannot run (TraceML not installed, an error) is reported as not run; the others go on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _harness import free_port, median, rotated, spread, write_results  # noqa: E402

BASE_ARMS = ["none", "ranksight", "ranksight_disabled", "traceml", "profiler"]
TRACEML_DEPS = ["traceml_ai", "msgspec", "rich", "yaml", "psutil", "numpy", "pynvml"]
WINDOW_ARM = "ranksight"
GOALS = {3.0: 1.01, 10.0: 1.005}  # target step ms -> ranksight's largest allowed ratio to no tool
MAX_BATCH = 256  # the calibration's largest batch
LEAD_STEPS = 30  # steps run one at a time between syncs: the host's lead over the GPU
WINDOW_REPS = 1  # spans with a forced kernel window against spans without (arm ``ranksight``)
PROFILER_SCHEDULE = (20, 5, 5)  # torch.profiler's wait, warmup, active (repeat=0: left on)
LAUNCH_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- pure helpers (tested)
def parse_extra_arm(text: str) -> tuple[str, dict]:
    """``NAME=JSON`` -> (name, ranksight.init options). The name must start with ``ranksight``."""
    name, sep, opts = text.partition("=")
    name = name.strip()
    if not sep or not name.startswith("ranksight") or name in BASE_ARMS:
        raise ValueError(f"--extra-arm wants ranksight_NAME=JSON (a new name), got {text!r}")
    value = json.loads(opts)
    if not isinstance(value, dict):
        raise ValueError(f"--extra-arm {name}: the options must be a JSON object")
    return name, value


def parse_cpus(text: str) -> list[int]:
    """``"2-9,12"`` -> [2..9, 12]."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def default_cpus(available: list[int]) -> list[int]:
    """Eight cores away from core 0 (interrupts, the hypervisor's housekeeping) when there are 12 or
    more; all of them otherwise."""
    return available[2:10] if len(available) >= 12 else available


def mean_in_window(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Mean value of the (time, value) samples with t0 <= time <= t1; None when there are none."""
    vals = [v for t, v in samples if t0 <= t <= t1]
    return statistics.fmean(vals) if vals else None


def round_ratios(runs: list[dict], metric: str = "mean_step_s", base: str = "none") -> dict[str, list[float]]:
    """Per arm, the ratio of each round's ``metric`` to the same round's (and size's) ``base`` run."""
    by_round: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["arm"]] = run
    out: dict[str, list[float]] = {}
    for arms in by_round.values():
        b = arms.get(base, {}).get(metric)
        for arm, run in arms.items():
            if arm != base and b and run.get(metric):
                out.setdefault(arm, []).append(run[metric] / b)
    return out


def choose_batch(trials: list[tuple[int, float]], target_s: float) -> tuple[int, float]:
    """Of the (batch, step s) tried, the one closest to the target step (on a log scale)."""
    return min(trials, key=lambda bt: abs(math.log(bt[1] / target_s)))


def steps_for(seconds: float, step_s: float, block: int) -> int:
    """A whole number of blocks lasting about ``seconds`` at ``step_s`` (at least one block)."""
    return max(1, round(seconds / step_s / block)) * block


def block_for(step_s: float, block_s: float = 0.3) -> int:
    return max(10, round(block_s / step_s))


def bound(host_ms: float | None, gpu_ms: float | None) -> str | None:
    """``GPU`` when the host enqueues a step in less than 90 % of its GPU time (it runs ahead and the
    queue stays full), ``host`` otherwise; None without GPU timings."""
    if host_ms is None or not gpu_ms:
        return None
    return "GPU" if host_ms < 0.9 * gpu_ms else "host"


def verdict(summary: dict) -> list[str]:
    """The goals: ranksight vs no tool <= 1.005 at ~10 ms and <= 1.01 at ~3 ms (median over rounds),
    and not above TraceML's in the same run."""
    lines = []
    for size, s in summary.items():
        target = s.get("target_ms")
        rs = s["arms"].get("ranksight", {}).get("ratio", {})
        tm = s["arms"].get("traceml", {}).get("ratio", {})
        if not rs:
            lines.append(f"{size}: ranksight not measured")
            continue
        goal = GOALS.get(target)
        parts = [f"{size}: ranksight {rs['median']:.4f}"]
        if goal is not None:
            parts.append(f"goal <= {goal}: {'met' if rs['median'] <= goal else 'NOT met'}")
        if tm:
            parts.append(f"TraceML {tm['median']:.4f}: {'not above' if rs['median'] <= tm['median'] else 'ABOVE'}")
        else:
            parts.append("TraceML not measured")
        lines.append("; ".join(parts))
    return lines


# ---------------------------------------------------------------- the child: one launch
def _thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every other live Python thread, by ident: (name, seconds)."""
    out = {}
    main = threading.main_thread().ident
    for t in threading.enumerate():
        if t.ident is None or t.ident == main:
            continue
        try:
            out[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, AttributeError, ValueError):
            pass
    return out


def _thread_group(name: str) -> str:
    low = name.lower()
    if low.startswith("ranksight"):
        return "ranksight"
    if "traceml" in low:
        return "traceml"
    return "other"


def child_main(cfg: dict) -> dict:
    """One launch: build the job, attach the arm, warm up, time, measure; returns the result dict."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # a world of one, where a tool looks for it
    os.environ["MASTER_PORT"] = str(cfg.get("master_port", 29500))
    t_launch = time.perf_counter()
    import torch

    sys.path.insert(0, HERE)
    from gpu_workload import make_model, train_step

    arm, dev = cfg["arm"], cfg["device"]
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.set_device(0)
        torch.zeros(1, device=dev)  # CUDA context
    else:
        torch.set_num_threads(1)  # a CPU smoke test on shared cores: no spinning intra-op pool
    res: dict = {"arm": arm, "size": cfg.get("size"), "round": cfg.get("round"), "pid": os.getpid()}
    res["cpus"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    traceml = None
    if arm == "traceml":  # before the model: auto mode patches the modules it times
        import traceml_ai as traceml

        traceml.init(
            mode="auto",
            session_id=cfg["traceml_session"],
            aggregator_port=cfg["traceml_port"],
            logs_dir=cfg["traceml_logs"],
            on_missing_aggregator="raise",
        )
    model = make_model(cfg["d"], cfg["layers"], device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator(device="cpu").manual_seed(1)
    shape = (cfg["batch"], cfg["t"], cfg["d"])
    batches = [(torch.randn(shape, generator=g).to(dev), torch.randn(shape, generator=g).to(dev)) for _ in range(2)]

    def one(i: int) -> None:
        train_step(model, opt, *batches[i & 1])

    t_attach = time.perf_counter()
    mon = prof = None
    if arm.startswith("ranksight"):
        import ranksight

        if arm == "ranksight_disabled":
            mon = ranksight.init(enabled=False)
        else:
            mon = ranksight.init(
                run_dir=cfg["run_dir"], job="gpu-cost", run_id=f"{arm}-{cfg['size']}-r{cfg['round']}", **cfg["opts"]
            )
        mon.watch(model, optimizer=opt)
    elif arm == "profiler":
        from torch.profiler import ProfilerActivity, profile, schedule

        wait, warmup, active = PROFILER_SCHEDULE
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        prof = profile(activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=0))
        prof.start()
    res["attach_s"] = time.perf_counter() - t_attach
    if traceml is not None:
        trace_step = traceml.trace_step

        def step(i: int) -> None:
            with trace_step(model):
                one(i)
    elif mon is not None:

        def step(i: int) -> None:
            with mon.step():
                one(i)
    elif prof is not None:

        def step(i: int) -> None:
            one(i)
            prof.step()
    else:
        step = one

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    counter = [0]

    def blocks(n_steps: int, block: int) -> list[float]:
        out = []
        for _ in range(n_steps // block):
            sync()
            t0 = time.perf_counter()
            for _ in range(block):
                step(counter[0])
                counter[0] += 1
            sync()
            out.append(time.perf_counter() - t0)
        return out

    block = cfg["block"]
    res["startup_s"] = time.perf_counter() - t_launch
    # 2. warm-up: the same number of steps in every arm
    warm = blocks(cfg["warmup_steps"], block)
    res["warmup_s"] = sum(warm)
    res["warmup_block_s"] = warm
    worker = getattr(mon, "_worker", None)
    window = getattr(getattr(mon, "_gpu", None), "window", None)
    if window is not None:
        res["first_window"] = {
            "windows_done": getattr(window, "windows_done", None),
            "stop_ms": getattr(window, "last_stop_cost_ns", 0) / 1e6,
        }
    flush0 = (worker.flush_seconds_total, worker.flushes_total) if worker is not None else None
    # 3. timed
    threads0 = _thread_cpu()
    proc0, main0 = time.process_time(), time.thread_time()
    res["timed_t0"] = time.time()
    timed = blocks(cfg["timed_steps"], block)
    res["timed_t1"] = time.time()
    proc1, main1 = time.process_time(), time.thread_time()
    threads1 = _thread_cpu()
    n = len(timed) * block
    res.update(timed_steps=n, block=block, block_s=timed, mean_step_s=sum(timed) / n)
    res["median_block_step_s"] = statistics.median(timed) / block
    res["process_cpu_us_per_step"] = (proc1 - proc0) / n * 1e6
    res["main_thread_cpu_us_per_step"] = (main1 - main0) / n * 1e6
    groups: dict[str, float] = {}
    names: dict[str, float] = {}
    for ident, (name, cpu1) in threads1.items():
        if ident in threads0:
            d = cpu1 - threads0[ident][1]
            groups[_thread_group(name)] = groups.get(_thread_group(name), 0.0) + d
            names[name] = names.get(name, 0.0) + d
    res["thread_cpu_us_per_step"] = {k: v / n * 1e6 for k, v in groups.items()}
    res["thread_cpu_us_per_step_by_name"] = {k: v / n * 1e6 for k, v in names.items()}
    if worker is not None:
        nf = worker.flushes_total - flush0[1]
        res["agent_flushes_timed"] = nf
        res["agent_flush_s_timed"] = worker.flush_seconds_total - flush0[0]
        res["agent_ms_per_flush"] = 1e3 * res["agent_flush_s_timed"] / nf if nf else None
    # 4. the host's lead over the GPU: one step at a time between syncs
    host, gpu = [], []
    for _ in range(LEAD_STEPS):
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        step(counter[0])
        counter[0] += 1
        host.append(time.perf_counter() - t0)
        if cuda:
            e1.record()
            sync()
            gpu.append(e0.elapsed_time(e1) / 1e3)
    res["host_enqueue_s"] = statistics.median(host) if host else None
    res["gpu_step_s"] = statistics.median(gpu) if gpu else None
    # 5. the kernel window's one-off cost (one arm): a span with a forced window against one without
    if cfg.get("window") and window is not None and worker is not None:
        span = steps_for(cfg["flush_s"] + 0.5, res["mean_step_s"], block)
        reps = []
        for _ in range(WINDOW_REPS):
            f0 = worker.flush_seconds_total
            plain = sum(blocks(span, block))
            f1 = worker.flush_seconds_total
            window.next_step = mon.steps_recorded + 3
            window.next_ns = 0
            done0 = window.windows_done
            with_window = sum(blocks(span, block))
            window.next_step = 10**12
            reps.append(
                {
                    "one_off_s": with_window - plain,
                    "window_ran": window.windows_done > done0,
                    "stop_ms": window.last_stop_cost_ns / 1e6,
                    "agent_flush_s_plain_span": f1 - f0,
                    "agent_flush_s_window_span": worker.flush_seconds_total - f1,
                    "span_steps": span,
                }
            )
        res["window"] = reps
    if mon is not None and getattr(mon, "enabled", False):  # the training thread's empty monitored step
        t0 = time.perf_counter_ns()
        for _ in range(300):
            with mon.step():
                pass
        res["empty_step_us"] = (time.perf_counter_ns() - t0) / 300 / 1e3
        res["agent_errors"] = dict(getattr(mon, "errors", {}) or {})
    t_close = time.perf_counter()
    if prof is not None:
        prof.stop()
    if mon is not None:
        mon.close()
    res["close_s"] = time.perf_counter() - t_close
    return res


def _child_entry(func_name: str, cfg: dict, out_path: str) -> None:
    """Run a launch (``child``) or the calibration and write its result to ``out_path``; a launch's error is
    its result, reported as a row while the benchmark goes on."""
    if func_name == "calibrate":
        res = calibrate_main(cfg)
    else:
        try:
            res = child_main(cfg)
        except BaseException as exc:
            res = {"arm": cfg["arm"], "size": cfg.get("size"), "round": cfg.get("round"), "error": repr(exc)}
            res["traceback"] = traceback.format_exc()[-3000:]
    with open(out_path, "w") as f:
        json.dump(res, f)


def calibrate_main(cfg: dict) -> dict:
    """Layers and batch per target step. Batch 1's step is the host's floor (its GPU work is tiny):
    fewer layers while that floor is above ``host_share`` of the target, so the host runs ahead of the
    GPU at the chosen size (a GPU-bound step, as a real job with data on the GPU is); then doubling
    batches until the step reaches the target, and the midpoint below it; the batch closest wins. A
    one-layer model still over the floor stays host-bound, and the table says so."""
    import torch

    sys.path.insert(0, HERE)
    from gpu_workload import make_model, train_step

    dev = cfg["device"]
    cuda = dev.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {}
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(0)
    out["torch"] = torch.__version__

    def time_step(layers: int, b: int) -> float:
        model = make_model(cfg["d"], layers, device=dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        x = torch.randn(b, cfg["t"], cfg["d"], device=dev)
        y = torch.randn(b, cfg["t"], cfg["d"], device=dev)

        def one():
            train_step(model, opt, x, y)

        for _ in range(8):
            one()
        best = float("inf")
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            for _ in range(15):
                one()
            sync()
            best = min(best, (time.perf_counter() - t0) / 15)
        return best

    share = cfg["host_share"]
    for size, target_ms in cfg["sizes"].items():
        target = target_ms / 1e3
        layers, b = cfg["layers"], 1
        s = time_step(layers, 1)
        while s > share * target and layers > 1:
            layers -= 1
            s = time_step(layers, 1)
        floor = s
        trials = [(1, s)]
        while s < target and b < MAX_BATCH:
            b *= 2
            s = time_step(layers, b)
            trials.append((b, s))
        if s > target and b >= 4:  # the step crossed the target between b/2 and b: try 3b/4 too
            trials.append((3 * b // 4, time_step(layers, 3 * b // 4)))
        batch, step_s = choose_batch(trials, target)
        out[size] = {
            "target_ms": target_ms,
            "layers": layers,
            "batch": batch,
            "step_s": step_s,
            "host_floor_ms": floor * 1e3,
            "trials": trials,
        }
        print(
            f"calibrated {size}: layers {layers}, batch {batch}, {step_s * 1e3:.2f} ms, host floor "
            f"{floor * 1e3:.2f} ms (trials {trials})",
            flush=True,
        )
    return out


# ---------------------------------------------------------------- the parent
def _launch(func_name: str, cfg: dict, args, timeout_s: float) -> dict:
    """Run ``func_name(cfg)`` in a fresh process (forked, or a new interpreter); its result dict."""
    fd, out_path = tempfile.mkstemp(suffix=".json", dir=args.work)
    os.close(fd)
    os.makedirs(os.path.join(args.work, "logs"), exist_ok=True)
    tag = f"{cfg.get('arm', func_name)}-{cfg.get('size', '')}-r{cfg.get('round', '')}"
    log_path = os.path.join(args.work, "logs", f"{tag}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    if args.start == "fork":
        pid = os.fork()
        if pid == 0:  # the child: never return into the parent's code
            code = 0
            try:
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)  # the child's output (the profiler's and TraceML's chatter) goes to its log
                os.dup2(fd, 2)
                _child_entry(func_name, cfg, out_path)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout_s
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "_" + func_name, json.dumps(cfg), out_path]
        try:
            with open(log_path, "w") as log:
                status = subprocess.run(cmd, timeout=timeout_s, stdout=log, stderr=subprocess.STDOUT).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    wall = time.perf_counter() - t0
    try:
        with open(out_path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"error": f"no result (exit status {status})"}
    os.unlink(out_path)
    if "error" in res:
        try:
            with open(log_path, errors="replace") as f:
                res["log_tail"] = f.read()[-2000:]
        except OSError:
            pass
    res["launch_wall_s"] = wall
    return res


class NvmlPoller:
    """A separate process reading the GPU's utilization samples (NVML keeps one every ~1/6 s) into a
    file; the parent averages those inside each launch's timed span."""

    CODE = r"""
import sys, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[2]))
last = 0
with open(sys.argv[1], "w", buffering=1) as f:
    while True:
        try:
            kind, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
            for s in samples:
                last = max(last, s.timeStamp)
                f.write("%f %d s\n" % (s.timeStamp / 1e6, s.sampleValue.uiVal))
        except pynvml.NVMLError:
            pass
        f.write("%f %d r\n" % (time.time(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        time.sleep(0.5)
"""

    def __init__(self, path: str, index: int = 0) -> None:
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, path, str(index)], stderr=subprocess.PIPE)

    def samples(self, kind: str) -> list[tuple[float, float]]:
        """``s``: NVML's own samples (its clock); ``r``: utilization rates read every 0.5 s (ours)."""
        out = []
        try:
            with open(self.path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3 and parts[2] == kind:
                        out.append((float(parts[0]), float(parts[1])))
        except OSError:
            pass
        return out

    def util(self, t0: float, t1: float) -> tuple[float | None, str]:
        """Mean utilization % within [t0, t1]: NVML's samples when their clock is ours, else the rates."""
        got = mean_in_window(self.samples("s"), t0, t1)
        return (got, "samples") if got is not None else (mean_in_window(self.samples("r"), t0, t1), "rates")

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            return ""
        return (self.proc.stderr.read() or b"").decode(errors="replace")[-500:]


def _start_traceml(args, cfg: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "traceml_ai.launcher.cli", "serve", "--mode", "summary", "--logs-dir"]
    cmd += [cfg["traceml_logs"], "--run-name", cfg["traceml_session"], "--nproc-per-node", "1"]
    cmd += ["--aggregator-port", str(cfg["traceml_port"])]
    log = open(os.path.join(args.work, f"traceml-serve-{cfg['traceml_session']}.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_traceml(proc: subprocess.Popen, timeout_s: float = 60.0) -> float:
    t0 = time.perf_counter()
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # `traceml serve` finalises (final_summary.*) on Ctrl+C
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return time.perf_counter() - t0


def missing_traceml() -> list[str]:
    return [m for m in TRACEML_DEPS if importlib.util.find_spec(m) is None]


def summarize(runs: list[dict], calib: dict) -> dict:
    out = {}
    for size in dict.fromkeys(r["size"] for r in runs):
        rs = [r for r in runs if r["size"] == size and "error" not in r]
        ratios = round_ratios(rs)
        cpu_ratios = round_ratios(rs, "process_cpu_us_per_step")
        warm_extra: dict[str, list[float]] = {}
        by_round: dict = {}
        for r in rs:
            by_round.setdefault(r["round"], {})[r["arm"]] = r
        for arms in by_round.values():
            base = arms.get("none")
            for arm, r in arms.items():
                if base and arm != "none":
                    steady = len(r["warmup_block_s"]) * r["block"] * (r["mean_step_s"] - base["mean_step_s"])
                    warm_extra.setdefault(arm, []).append(r["warmup_s"] - base["warmup_s"] - steady)
        arms_out = {}
        for arm in dict.fromkeys(r["arm"] for r in runs if r["size"] == size):
            ok = [r for r in rs if r["arm"] == arm]
            errs = [r.get("error") for r in runs if r["size"] == size and r["arm"] == arm and "error" in r]
            a: dict = {"runs": len(ok), "errors": errs}
            if ok:

                def med(key, scale=1.0, ok=ok):
                    m = median(r.get(key) for r in ok)
                    return None if m is None else m * scale

                a.update(
                    mean_step_ms=[round(r["mean_step_s"] * 1e3, 4) for r in ok],
                    step_ms=med("mean_step_s", 1e3),
                    ratio=spread(ratios.get(arm, [])) if arm != "none" else {"median": 1.0},
                    process_cpu_ratio=spread(cpu_ratios.get(arm, [])) if arm != "none" else {"median": 1.0},
                    gpu_util=med("gpu_util"),
                    host_enqueue_ms=med("host_enqueue_s", 1e3),
                    gpu_step_ms=med("gpu_step_s", 1e3),
                    main_thread_cpu_us=med("main_thread_cpu_us_per_step"),
                    process_cpu_us=med("process_cpu_us_per_step"),
                    tool_thread_cpu_us=statistics.median(
                        sum(v for k, v in r["thread_cpu_us_per_step"].items() if k != "other") for r in ok
                    ),
                    other_thread_cpu_us=statistics.median(r["thread_cpu_us_per_step"].get("other", 0.0) for r in ok),
                    warmup_extra_s=spread(warm_extra.get(arm, [])),
                    agent_ms_per_flush=med("agent_ms_per_flush"),
                    agent_flushes_timed=[r.get("agent_flushes_timed") for r in ok],
                    empty_step_us=med("empty_step_us"),
                    startup_s=med("startup_s"),
                    launch_wall_s=med("launch_wall_s"),
                )
                a["bound"] = bound(a["host_enqueue_ms"], a["gpu_step_ms"])
                win = [w for r in ok for w in r.get("window", []) if w.get("window_ran")]
                if win:
                    one_off = [w["one_off_s"] for w in win]
                    a["window_one_off_s"] = spread(one_off)
                    a["window_stop_ms"] = statistics.median(w["stop_ms"] for w in win)
                    step_s = a["step_ms"] / 1e3
                    a["window_amortised_per_60s"] = statistics.median(one_off) / 60.0
                    a["window_amortised_per_300_steps"] = statistics.median(one_off) / (300 * step_s)
            arms_out[arm] = a
        c = calib.get(size, {})
        out[size] = {
            "target_ms": c.get("target_ms"),
            "layers": c.get("layers"),
            "batch": c.get("batch"),
            "arms": arms_out,
        }
    return out


def _f(x, fmt="{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _spread(s: dict, digits: int = 3) -> str:
    """A ``spread``'s median (min-max); "–" without one."""
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})" if s else "–"


def table(summary: dict) -> str:
    head = (
        "| size | arm | runs | mean step ms (median) | ratio to none, median (min-max) | process CPU ratio | "
        "GPU util % | host enqueue / GPU ms per step | main thread CPU µs/step | tool threads CPU µs/step | "
        "agent ms/flush | warm-up extra s (start-up, first flush, first window) | kernel window one-off s |"
    )
    lines = [head, "|" + " --- |" * 13]
    for size, s in summary.items():
        label = f"{size} (L{s['layers']}, b{s['batch']})"
        for arm, a in s["arms"].items():
            if not a["runs"]:
                err = (a["errors"] or ["?"])[0] or "?"
                lines.append(f"| {label} | {arm} | 0 | not run: {err[:80]} |" + " |" * 9)
                continue
            ratio = "1" if arm == "none" else _spread(a["ratio"], 4)
            cpu_ratio = "1" if arm == "none" else _f(a["process_cpu_ratio"].get("median"))
            lead = f"{_f(a['host_enqueue_ms'], '{:.2f}')} / {_f(a['gpu_step_ms'], '{:.2f}')}"
            if a.get("bound"):
                lead += f" ({a['bound']}-bound)"
            warm, win = _spread(a["warmup_extra_s"]), _spread(a.get("window_one_off_s"))
            lines.append(
                f"| {label} | {arm} | {a['runs']} | {a['step_ms']:.3f} | {ratio} | {cpu_ratio} | "
                f"{_f(a['gpu_util'], '{:.0f}')} | {lead} | {_f(a['main_thread_cpu_us'], '{:.0f}')} | "
                f"{_f(a['tool_thread_cpu_us'], '{:.0f}')} | {_f(a['agent_ms_per_flush'], '{:.1f}')} | {warm} | {win} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_child", "_calibrate"):  # --start spawn: a new interpreter runs one launch
        _child_entry(argv[0][1:], json.loads(argv[1]), argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the raw runs and the summary here")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test of the rotation)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 2 rounds, short spans (CPU test)")
    ap.add_argument("--sizes", default="3,10", help="target step times in ms (default 3,10)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default=",".join(BASE_ARMS))
    ap.add_argument("--extra-arm", action="append", default=[], help="ranksight_NAME=JSON of ranksight.init options")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--t", type=int, default=512)
    ap.add_argument("--host-share", type=float, default=0.75, help="most of the target step the host's floor may take")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="past the agent's first flush (2 s) and window")
    ap.add_argument("--timed-s", type=float, default=4.0, help="about a whole number of 2-s flushes")
    ap.add_argument("--cpus", default="", help="CPU affinity of every process, e.g. 2-9 (default: 8 cores from 2)")
    ap.add_argument("--start", choices=["fork", "spawn"], default="fork")
    ap.add_argument("--work", default="", help="run folders (default: a new temporary folder)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.d, args.layers, args.t = 64, 2, 32
        if args.rounds == 3:
            args.rounds = 2
        if args.sizes == "3,10":
            args.sizes = "3"
        args.warmup_s, args.timed_s = 2.5, 2.2
    t_start = time.perf_counter()
    args.work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="gpu-cost-"))
    os.makedirs(args.work, exist_ok=True)
    if hasattr(os, "sched_setaffinity"):
        cpus = parse_cpus(args.cpus) if args.cpus else default_cpus(sorted(os.sched_getaffinity(0)))
        os.sched_setaffinity(0, cpus)  # every child, the aggregator and the poller inherit it
        print(f"CPU affinity {cpus}", flush=True)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    arm_opts = {a: {} for a in arms if a.startswith("ranksight") and a != "ranksight_disabled"}
    for text in args.extra_arm:
        name, opts = parse_extra_arm(text)
        arms.append(name)
        arm_opts[name] = opts
    if "none" not in arms:
        arms.insert(0, "none")
    sizes = {f"{float(x):g}ms": float(x) for x in args.sizes.split(",")}
    unavailable: dict[str, str] = {}
    miss = missing_traceml()
    if "traceml" in arms and miss:
        unavailable["traceml"] = "missing " + ", ".join(miss)
    if importlib.util.find_spec("ranksight") is None:
        for a in arms:
            if a.startswith("ranksight"):
                unavailable[a] = "ranksight not importable"
    for a, why in unavailable.items():
        print(f"arm {a}: not run ({why})", flush=True)
    if args.start == "fork":
        import torch  # noqa: F401  (imported once here, shared by every forked launch; CUDA stays untouched)

    job = {"device": args.device, "d": args.d, "t": args.t}
    calib = _launch(
        "calibrate", {**job, "layers": args.layers, "sizes": sizes, "host_share": args.host_share}, args, 300
    )
    if "error" in calib or any(s not in calib for s in sizes):
        print(f"calibration failed: {calib}", file=sys.stderr)
        return 1
    flush_s = 2.0  # the agent's flush interval at its defaults
    est = 0.0
    plans = {}
    for size in sizes:
        c = calib[size]
        blk = block_for(c["step_s"])
        plans[size] = {
            "block": blk,
            "warmup_steps": steps_for(args.warmup_s, c["step_s"], blk),
            "timed_steps": steps_for(args.timed_s, c["step_s"], blk),
        }
        est += len(arms) * (args.warmup_s + args.timed_s + 2.0) + 2 * (flush_s + 0.5) * WINDOW_REPS
        est += 3.0 if "traceml" in arms else 0.0  # its aggregator's start and final summary
    print(f"plan {plans}; about {est * args.rounds:.0f} s of launches", flush=True)
    poller = None
    if args.device.startswith("cuda") and importlib.util.find_spec("pynvml") is not None:
        poller = NvmlPoller(os.path.join(args.work, "nvml.txt"))
    runs: list[dict] = []
    n_launch = len(arms) * len(sizes) * args.rounds
    k = 0
    for r in range(args.rounds):
        for size in sizes:
            for arm in rotated(arms, r + list(sizes).index(size)):
                k += 1
                cfg = {**job, **plans[size], "arm": arm, "size": size, "round": r, "window": arm == WINDOW_ARM}
                cfg.update(layers=calib[size]["layers"], batch=calib[size]["batch"], flush_s=flush_s)
                cfg.update(master_port=free_port(), run_dir=os.path.join(args.work, "runs"), opts=arm_opts.get(arm, {}))
                if arm in unavailable:
                    runs.append({"arm": arm, "size": size, "round": r, "error": unavailable[arm]})
                    continue
                agg = None
                if arm == "traceml":
                    cfg["traceml_port"] = free_port()
                    cfg["traceml_session"] = f"traceml-{size}-r{r}"
                    cfg["traceml_logs"] = os.path.join(args.work, "traceml-logs")
                    agg = _start_traceml(args, cfg)
                res = _launch("child", cfg, args, LAUNCH_TIMEOUT_S)
                if agg is not None:
                    res["traceml_serve_stop_s"] = _stop_traceml(agg)
                res.update(arm=arm, size=size, round=r)
                if poller is not None and "timed_t0" in res:
                    res["gpu_util"], res["gpu_util_from"] = poller.util(res["timed_t0"], res["timed_t1"])
                runs.append(res)
                msg = res.get("error") or (
                    f"{res['mean_step_s'] * 1e3:.3f} ms/step, util {_f(res.get('gpu_util'), '{:.0f}')} %, "
                    f"launch {res['launch_wall_s']:.1f} s"
                )
                print(
                    f"[{k}/{n_launch} {time.perf_counter() - t_start:.0f}s] round {r} {size} {arm}: {msg}", flush=True
                )
                if "error" in res and ("ModuleNotFoundError" in res["error"] or "ImportError" in res["error"]):
                    unavailable[arm] = res["error"]
    nvml_err = poller.close() if poller is not None else ""
    summary = summarize(runs, calib)
    result = {
        "args": {**vars(args), "max_batch": MAX_BATCH, "lead_steps": LEAD_STEPS, "window_reps": WINDOW_REPS},
        "calibration": calib,
        "plans": plans,
        "arm_options": arm_opts,
        "unavailable": unavailable,
        "nvml_poller_error": nvml_err,
        "wall_s": time.perf_counter() - t_start,
        "summary": summary,
        "goals": verdict(summary),
        "runs": runs,
    }
    if args.json:
        write_results(args.json, result, arms=arms, rounds=args.rounds)
    print(
        f"\n{calib.get('device_name', args.device)}, torch {calib.get('torch')}, {args.rounds} rounds, "
        f"{result['wall_s']:.0f} s; work folder {args.work}"
    )
    print(table(summary))
    for line in result["goals"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
