"""What the live tracker follower costs a training job: step time with and without it, and its own CPU.

The framework callbacks (Lightning, Hugging Face, Accelerate) start a follower on global rank 0 that reads the
run folder every ``tracker_interval_s`` (10 s by default) and logs a sample per rank to the trackers. A CPU
training loop (a small MLP, ``ranksight.init`` + ``mon.watch`` + ``mon.step()``, one torch thread, ~5 ms
steps) runs for ``--seconds`` in a fresh process per round, without a follower and with one feeding a TensorBoard
sink (the cheapest real back end): ``thread`` reads the folder on a thread of the training process (as the
callbacks did before), ``callbacks`` is started as the Lightning / HF / Accelerate callbacks start it
(``integrations._common.follow_trackers``: the reading in a child process, a thread handing its points to the
trackers). The arms take turns. Reported: each arm's step time against the unfollowed loop's, round by round,
and the follower's CPU seconds per minute of the loop: its thread's own CPU clock (``pthread_getcpuclockid``)
plus the reader process's user + system time, and the part spent inside the training process.

    python benchmarks/tracker_follow_cost.py --rounds 4 --json benchmarks/results/cpu_tracker_follow_cost.json
"""

from __future__ import annotations

import statistics
import tempfile

from _harness import cli, fresh_process, in_rounds, write_results

_CHILD = r"""
import json, os, sys, threading, time
import torch
import ranksight

seconds, mode, interval_s = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
run_dir, hidden = sys.argv[4], int(sys.argv[5])
torch.set_num_threads(1)
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1")
mon = ranksight.init(run_dir=run_dir, job="follow-cost", stack_window=False)
h = hidden
model = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
                            torch.nn.Linear(h, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon.watch(model, optimizer=opt)
x, y = torch.randn(64, h), torch.randn(64, 1)

def step():
    with mon.step():
        torch.nn.functional.mse_loss(model(x), y).backward(); opt.step(); opt.zero_grad()

for _ in range(100):  # warm-up
    step()
follower = None
if mode != "off":
    from ranksight.exporters import Follower, TensorBoardSink
    from ranksight.integrations._common import follow_trackers
    sink = TensorBoardSink(os.path.join(run_dir, "tb"))
    if mode == "callbacks":  # as the Lightning / HF / Accelerate callbacks start it
        follower = follow_trackers(mon, lambda: [sink], interval_s)
    else:  # "thread": the folder read on a thread of this process; "process": by a child process
        follower = Follower(mon.run_path, [sink], interval_s=interval_s, process=mode == "process").start()
    assert follower is not None, "no follower started"

def follower_cpu():
    # the reading, wherever it runs: the thread's own CPU clock, plus the reader process's user + system time
    total = 0.0
    thread = getattr(follower, "_thread", None)
    if thread is not None and thread.is_alive():
        total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    proc = getattr(follower, "_proc", None)
    if proc is not None and proc.poll() is None:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total

def thread_cpu():
    thread = getattr(follower, "_thread", None)
    if thread is not None and thread.is_alive():
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0

c0, t0 = (follower_cpu(), thread_cpu()) if follower else (0.0, 0.0)
p0, w0 = time.process_time(), time.perf_counter()
times = []
while time.perf_counter() - w0 < seconds:
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
wall = time.perf_counter() - w0
proc_cpu = time.process_time() - p0
c1, t1 = (follower_cpu(), thread_cpu()) if follower else (0.0, 0.0)
mon.close()
f0 = time.perf_counter()
if follower is not None:
    from ranksight.integrations._common import finish_trackers
    finish_trackers(follower)
finish_s = time.perf_counter() - f0
times.sort()
tb = os.path.join(run_dir, "tb")
print(json.dumps({
    "steps": len(times), "wall_s": wall, "step_median_ms": times[len(times) // 2] * 1e3,
    "step_mean_ms": wall / len(times) * 1e3, "step_p99_ms": times[int(len(times) * 0.99)] * 1e3,
    "process_cpu_s": proc_cpu, "follower_cpu_s": c1 - c0, "follower_thread_cpu_s": t1 - t0, "finish_s": finish_s,
    "follower_kind": ("process" if getattr(follower, "process", False) else "thread") if follower else None,
    "tb_files": sorted(os.listdir(tb)) if os.path.isdir(tb) else [],
}))
"""


def measure(seconds: float, mode: str, interval_s: float, hidden: int) -> dict:
    """One fresh process of ``_CHILD``: its figures, and its own wall, user and system seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        return fresh_process(_CHILD, seconds, mode, interval_s, tmp, hidden)


def summarize(off: list[dict], arm: list[dict]) -> dict:
    """An arm against the unfollowed loop, round by round (round i of both arms ran back to back)."""
    med = [a["step_median_ms"] / o["step_median_ms"] for o, a in zip(off, arm)]
    mean = [a["step_mean_ms"] / o["step_mean_ms"] for o, a in zip(off, arm)]
    per_min = [r["follower_cpu_s"] / r["wall_s"] * 60 for r in arm]
    thread_per_min = [r["follower_thread_cpu_s"] / r["wall_s"] * 60 for r in arm]
    return {
        "step_median_ratio": statistics.median(med),
        "step_median_ratio_range": [min(med), max(med)],
        "step_mean_ratio": statistics.median(mean),
        "step_mean_ratio_range": [min(mean), max(mean)],
        "follower_cpu_s_per_min": statistics.median(per_min),
        "follower_cpu_s_per_min_range": [min(per_min), max(per_min)],
        "follower_cpu_share_of_wall": statistics.median(per_min) / 60,
        "in_process_thread_cpu_s_per_min": statistics.median(thread_per_min),
        "finish_s": statistics.median(r["finish_s"] for r in arm),
    }


def main() -> None:
    ap = cli(__doc__, rounds=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval-s", type=float, default=10.0, help="the follower's poll interval (callbacks: 10)")
    ap.add_argument("--hidden", type=int, default=512, help="MLP width: 512 is ~5 ms a step on one core")
    ap.add_argument(
        "--arms",
        default="off,thread,callbacks",
        help="comma-separated: off (no follower), thread (the folder read in-process), process (by a child),"
        " callbacks (as the framework callbacks start it)",
    )
    args = ap.parse_args()
    arms = args.arms.split(",")
    assert "off" in arms, "the 'off' arm is the reference"
    rounds = in_rounds(
        arms,
        args.rounds,
        lambda arm, _: measure(args.seconds, arm, args.interval_s, args.hidden),
        lambda arm, r: (
            f"{r['steps']} steps, median {r['step_median_ms']:.3f} ms, mean {r['step_mean_ms']:.3f} ms,"
            f" process CPU {r['process_cpu_s']:.2f} s, follower CPU {r['follower_cpu_s']:.3f} s (in-process thread"
            f" {r['follower_thread_cpu_s']:.3f} s, {r['follower_kind']}), finish {r['finish_s']:.2f} s"
        ),
    )
    summary = {arm: summarize(rounds["off"], rounds[arm]) for arm in arms if arm != "off"}
    for arm, m in summary.items():
        print(
            f"{arm}: step time / off: median {m['step_median_ratio']:.4f} ({m['step_median_ratio_range'][0]:.4f}-"
            f"{m['step_median_ratio_range'][1]:.4f}), mean {m['step_mean_ratio']:.4f}; follower CPU"
            f" {m['follower_cpu_s_per_min']:.3f} s per minute ({m['follower_cpu_share_of_wall'] * 100:.2f} % of the"
            f" wall time), of it in the training process {m['in_process_thread_cpu_s_per_min']:.3f} s per minute"
        )
    if args.json:
        write_results(args.json, {"args": vars(args), "summary": summary, "rounds": rounds}, arms, args.rounds)


if __name__ == "__main__":
    main()
