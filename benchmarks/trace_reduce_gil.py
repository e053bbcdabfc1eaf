"""What the kernel window's reduction costs the training thread: on the agent thread (read event by event, then
reduced there) against the child process (Kineto writes the trace, a child reduces it), on CPU.

    python -m benchmarks trace_reduce_gil --events 100000 --json benchmarks/results/cpu_trace_reduce_gil.json

Two parts, each with the training thread running a CPU loop of small torch ops (~2 ms steps, which release the
GIL inside every op, as a GPU job's launches do not) beside the agent's work:

- extraction: a real profiler result of ``--events`` CPU events (a CPU-only trace: kernels need a GPU) leaves
  the profiler either event by event (``events_from_kineto``, the agent thread before) or as one ``save()``;
- reduction: a GPU-sized trace (the H200 window of tests/data/gpu, repeated to ``--events`` events) is reduced
  on a thread of this process (before) or in a child process (now).

Per arm: the agent thread's CPU seconds (the GIL it held), the longest time a probe thread waited to run
(the longest hold), and the training loop's step-time stretch over the same loop without the work.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._harness import REPO, cli, in_rounds, machine_load, write_results  # noqa: E402

WINDOW = os.path.join(REPO, "tests", "data", "gpu", "window_baseline.json.gz")


def kineto_result(events: int):
    """A finished profiler result holding about ``events`` CPU events (each ``x + 1`` records 5)."""
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.autograd.profiler import (
        ProfilerActivity,
        ProfilerConfig,
        ProfilerState,
        _disable_profiler,
        _enable_profiler,
        _prepare_profiler,
    )

    cfg = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
    acts = {ProfilerActivity.CPU}
    _prepare_profiler(cfg, acts)
    _enable_profiler(cfg, acts)
    x = torch.zeros(8)
    for _ in range(events // 5):
        x = x + 1
    return _disable_profiler()


def gpu_sized_trace(events: int, path: str) -> None:
    """The H200 window's Chrome trace repeated (shifted in time, fresh correlation ids) to ``events`` events."""
    with gzip.open(WINDOW, "rt") as f:
        trace = json.load(f)
    base = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in base) - min(float(e["ts"]) for e in base)
    out = []
    k = 0
    while len(out) < events:
        for e in base:
            c = dict(e, ts=float(e["ts"]) + k * (span + 1.0))
            args = dict(e.get("args") or {})
            if args.get("correlation"):
                args["correlation"] = int(args["correlation"]) + k * 10_000_000
            c["args"] = args
            out.append(c)
        k += 1
    with open(path, "w") as f:
        json.dump({"traceEvents": out[:events]}, f)


def train_loop(stop: threading.Event, steps: list) -> None:
    """The training thread: ~2 ms steps of small torch ops, each step's wall time kept."""
    import torch

    a = torch.randn(96, 96)
    while not stop.is_set():
        t0 = time.perf_counter()
        for _ in range(12):
            a = torch.tanh(a @ a) * 0.5
        steps.append(time.perf_counter() - t0)


def probe(stop: threading.Event, gaps: list) -> None:
    """A thread that asks for the GIL every 0.5 ms: how long it waited beyond that is how long it was held."""
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.0005)
        now = time.perf_counter()
        gaps.append(now - last - 0.0005)
        last = now


def beside_training(work, settle_s: float = 0.3) -> dict:
    """Run ``work()`` on an agent-like thread while the training loop and the probe run; the figures."""
    stop, steps, gaps, figures = threading.Event(), [], [], {}
    threads = [threading.Thread(target=fn, args=(stop, out)) for fn, out in ((train_loop, steps), (probe, gaps))]
    for t in threads:
        t.start()
    time.sleep(settle_s)
    before = len(steps)

    def agent():
        c0, w0 = time.thread_time(), time.perf_counter()
        work()
        figures["agent_cpu_s"], figures["wall_s"] = time.thread_time() - c0, time.perf_counter() - w0

    a = threading.Thread(target=agent, name="ranksight-agent")
    a.start()
    a.join()
    during = steps[before:]
    time.sleep(settle_s)
    stop.set()
    for t in threads:
        t.join()
    calm = steps[:before] + steps[before + len(during) :]
    base = statistics.median(calm) if calm else None
    figures.update(
        steps_during=len(during),
        step_median_calm_s=base,
        step_max_during_s=max(during) if during else None,
        # what the training loop lost while the work ran: its steps' time over as many calm steps
        training_stretch_s=(sum(during) - len(during) * base) if during and base else None,
        longest_gil_wait_s=max(gaps) if gaps else None,
    )
    return figures


def main() -> None:
    parser = cli(__doc__, rounds=3)
    parser.add_argument("--events", type=int, default=100_000, help="events in the trace (a GPU window: 5k-200k)")
    args = parser.parse_args()

    from ranksight.agent._trace_reduce import reduce_file_in_child
    from ranksight.agent._trace_window import events_from_kineto
    from ranksight.trace_reduce import events_from_chrome, reduce_window

    result = kineto_result(args.events)
    tmp = tempfile.mkdtemp(prefix="rs-reduce-")
    saved, trace = os.path.join(tmp, "saved.json"), os.path.join(tmp, "gpu_sized.json")
    gpu_sized_trace(args.events, trace)
    with open(trace) as f:
        gpu_events = events_from_chrome(json.load(f))  # the in-process arm's input, read before it is timed

    # A profiler result saves once ("Trace is already saved"): each save arm takes a fresh one, made beforehand.
    fresh = [kineto_result(args.events) for _ in range(args.rounds)]
    saved_n = iter(range(args.rounds))

    def save() -> None:
        i = next(saved_n)
        fresh[i].save(f"{saved}.{i}")

    arms = {
        "extract_event_by_event": lambda: events_from_kineto(result),
        "extract_save": save,
        "reduce_on_agent_thread": lambda: reduce_window(gpu_events, model_on_gpu=True),
        "reduce_in_child": lambda: reduce_file_in_child(trace, True),
    }
    check = reduce_file_in_child(trace, True)
    same = check == reduce_window(gpu_events, model_on_gpu=True)

    def show(arm, f):
        lost = f["training_stretch_s"] or 0
        return (f"agent CPU {f['agent_cpu_s']:.3f} s, wall {f['wall_s']:.3f} s, longest GIL wait "
                f"{f['longest_gil_wait_s'] * 1e3:.1f} ms, training lost {lost:.3f} s")  # fmt: skip

    rounds = in_rounds(list(arms), args.rounds, lambda arm, r: beside_training(arms[arm]), show)
    keys = [k for k in next(iter(rounds.values()))[0] if k not in ("round", "load")]
    summary = {arm: {k: statistics.median(r[k] for r in rows if r[k] is not None) for k in keys}
               for arm, rows in rounds.items()}  # fmt: skip
    print(json.dumps(summary, indent=1))
    print("child reduction equals the in-process one:", same)
    if args.json:
        write_results(
            args.json,
            {
                "events": args.events,
                "kineto_events": len(result.events()),
                "child_equals_in_process": same,
                "median": summary,
                "rounds": rounds,
                "load_after": machine_load(),
            },  # fmt: skip
            arms=list(arms),
            rounds=args.rounds,
        )


if __name__ == "__main__":
    main()
