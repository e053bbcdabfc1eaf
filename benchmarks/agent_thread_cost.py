"""The agent thread's CPU per step: what turning marks into rows and writing them costs, off the training thread.

Why it matters: the agent thread holds the GIL while it builds rows, and a host-bound training thread (small
kernels, a fast step) waits for it. A watched loop (a small MLP, ``mon.loader`` + ``watch`` hooks + step
marks, no DDP) runs ``--steps`` steps in a fresh process per round, with the agent flushing every
``--flush-s``; the agent thread's own CPU clock (``pthread_getcpuclockid``) over the steps it turned into rows
is the figure, with the training thread's CPU per step beside it. ``--profile`` prints where the agent thread's
time goes (cProfile of ``Worker.flush``).

    python benchmarks/agent_thread_cost.py --rounds 5 --json benchmarks/results/cpu_agent_thread_cost.json
    # against an earlier commit, side by side (ranksight laid out as it installs):
    git worktree add /tmp/rs-base <commit> && mkdir -p /tmp/rs-base-pkg/ranksight &&
      cp -r /tmp/rs-base/ranksight/. /tmp/rs-base-pkg/ranksight/ &&
      for d in agent collectors rules dashboard integrations; do cp -r /tmp/rs-base/$d /tmp/rs-base-pkg/ranksight/; done
    python benchmarks/agent_thread_cost.py --baseline /tmp/rs-base-pkg --json ...
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # as well under ``python -P``

from _harness import cli, in_rounds, write_results  # noqa: E402

_CHILD = r"""
import json, os, sys, threading, time
if os.environ.get("RS_TREE"):  # another ranksight: ahead of this checkout's editable install
    sys.path.insert(0, os.environ["RS_TREE"])
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]
import torch
import ranksight

steps, flush_s, profile, device = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", sys.argv[5]
gpu_opts = json.loads(sys.argv[6])
torch.set_num_threads(1)
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1")
mon = ranksight.init(run_dir=sys.argv[4], job="agent-cost", flush_interval_s=flush_s, stack_window=False,
                     gpu=gpu_opts)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon.watch(model, optimizer=opt)
data = [(torch.randn(8, 32, device=device), torch.randn(8, 1, device=device)) for _ in range(64)]
worker = mon._worker
if profile:
    import cProfile, pstats
    prof = cProfile.Profile()
    flush = worker.flush
    def profiled(final):
        prof.enable()
        try:
            return flush(final)
        finally:
            prof.disable()
    worker.flush = profiled
agent = next(t for t in threading.enumerate() if t is worker)
clock = time.pthread_getcpuclockid(agent.ident)
def batches():
    while True:
        yield from data
it = iter(mon.loader(batches()))
for _ in range(200):  # warm-up: the first flush opens the spool
    x, y = next(it)
    with mon.step():
        torch.nn.functional.mse_loss(model(x), y).backward(); opt.step(); opt.zero_grad()
time.sleep(flush_s * 1.5)
a0, t0, w0 = time.clock_gettime(clock), time.thread_time(), time.perf_counter()
for _ in range(steps):
    x, y = next(it)
    with mon.step():
        torch.nn.functional.mse_loss(model(x), y).backward(); opt.step(); opt.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
train_cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
time.sleep(flush_s * 1.5)  # the last timed steps are turned into rows
agent_cpu = time.clock_gettime(clock) - a0
mon.close()
out = {"agent_us_per_step": agent_cpu / steps * 1e6, "train_us_per_step": train_cpu / steps * 1e6,
       "step_us": wall / steps * 1e6, "flushes": worker.flushes_total}
if profile:
    stats = pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative"); stats.print_stats(25)
out["ranksight"] = os.path.dirname(ranksight.agent.__file__)
print(json.dumps(out))
"""


def measure(
    steps: int, flush_s: float, profile: bool = False, tree: str | None = None, device: str = "cpu", gpu: str = "{}"
) -> dict:
    """One fresh process; ``tree``: a folder holding another ranksight in its installed layout, run instead."""
    env = dict(os.environ)
    env.pop("RS_TREE", None)
    if tree:
        env["RS_TREE"] = tree
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-P", "-c", _CHILD, str(steps), str(flush_s), "1" if profile else "0", tmp, device, gpu],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    if profile:
        print(out.stderr, file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = cli(__doc__, rounds=5)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--flush-s", type=float, default=0.5)
    ap.add_argument("--profile", action="store_true", help="one round, with the agent thread's profile")
    ap.add_argument("--device", default="cpu", help="cuda: the model on the GPU, so rows carry CUDA events")
    ap.add_argument("--gpu", default="{}", help="GPU options as JSON, e.g. '{\"events_every_steps\": 1}'")
    ap.add_argument(
        "--baseline",
        help="a folder with another ranksight in its installed layout (ranksight/agent, ...),"
        " e.g. an earlier commit's: measured in alternating rounds beside this tree",
    )
    args = ap.parse_args()
    if args.profile:
        print(measure(args.steps, args.flush_s, profile=True, device=args.device, gpu=args.gpu))
        return
    arms = {"this tree": None, **({"baseline": args.baseline} if args.baseline else {})}
    rounds = in_rounds(
        arms,
        args.rounds,
        lambda arm, _: measure(args.steps, args.flush_s, tree=arms[arm], device=args.device, gpu=args.gpu),
        lambda arm, r: (
            f"agent {r['agent_us_per_step']:.1f} us/step, training thread {r['train_us_per_step']:.1f}"
            f" us/step, step {r['step_us']:.0f} us, {r['flushes']} flushes ({r['ranksight']})"
        ),
    )
    keys = ("agent_us_per_step", "train_us_per_step", "step_us")
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in keys} for arm, rs in rounds.items()}
    for arm, m in med.items():
        print(
            f"median {arm}: agent thread {m['agent_us_per_step']:.1f} us/step, training thread"
            f" {m['train_us_per_step']:.1f} us/step"
        )
    ratios = None
    if args.baseline:
        ratios = [
            b["agent_us_per_step"] / a["agent_us_per_step"] for a, b in zip(rounds["this tree"], rounds["baseline"])
        ]
        print(
            f"baseline / this tree, agent thread per step: median {statistics.median(ratios):.2f}"
            f" ({min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} rounds"
        )
    if args.json:
        figures = {"rounds": rounds, "median": med, "baseline_over_this": ratios}
        write_results(args.json, figures, arms=list(arms), rounds=args.rounds)


if __name__ == "__main__":
    main()
