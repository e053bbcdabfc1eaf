"""What the agent costs a CPU job whose ranks take every core: a 2-rank gloo DDP job, agent on against
``enabled=False``, in alternating pairs of launches, and where the agent's CPU goes.

    python -m benchmarks agent_cpu_cost --pairs 6 --json benchmarks/results/cpu_agent_cost_2rank.json
    python -m benchmarks agent_cpu_cost --profile   # one launch, the agent thread under cProfile: its top functions

Each launch is ``torchrun --nproc-per-node 2`` of this file's ``--rank-job``: an MLP sized for ~28 ms steps with
one torch thread a rank (two ranks on two cores), ``--steps`` steps through ``mon.loader`` and ``mon.step()``
with ``watch(model, optimizer)``. Per launch: the training loop's wall time (rank 0's; the all-reduce keeps the
ranks together), the launch's wall time, and on the agent's arm each thread's CPU seconds by name (the
training thread, the agent thread, the others) read from ``/proc`` at the loop's end. The pair's ratio is
on / off; the median of the pairs' ratios is the figure.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _thread_cpu() -> dict:
    """CPU seconds of each thread of this process, by its Python name (from /proc, read from any thread)."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    out: dict = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[t.name] = out.get(t.name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError, TypeError):
            continue
    try:  # every thread, Python's or not (gloo's, the agent's children are processes): the process total
        t = os.times()
        out["process_total"] = t.user + t.system
    except OSError:
        pass
    return out


def rank_job(argv: list[str]) -> None:
    """One rank of the job (under torchrun)."""
    import argparse

    import torch
    import torch.distributed as dist
    from torch import nn

    import ranksight

    p = argparse.ArgumentParser()
    p.add_argument("--on", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--out", required=True)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-train", action="store_true", help="the training loop under cProfile (CPU time)")
    p.add_argument("--off-parts", default="", help="agent parts off: comm_hook,time_collectives,stack_window")
    a = p.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    parts = {name: False for name in a.off_parts.split(",") if name}
    mon = ranksight.init(
        run_dir=os.path.join(a.out, "runs"), job="cpu-cost", enabled=bool(a.on), flush_interval_s=2.0, **parts
    )
    profiler = None
    if a.profile and a.on:
        profiler = _profile_agent_thread(mon)
    width = a.width
    model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    mon.watch(ddp, optimizer=opt)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(16)]
    loader = [batches[i % 16] for i in range(a.steps)]
    dist.barrier()
    train_prof = None
    if a.profile_train:
        import cProfile

        train_prof = cProfile.Profile(time.thread_time)
        train_prof.enable()
    t0, c0 = time.perf_counter(), _thread_cpu()
    for x, y in mon.loader(loader):
        with mon.step():
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    loop_s = time.perf_counter() - t0
    c1 = _thread_cpu()
    if train_prof is not None:
        train_prof.disable()
    cpu = {name: c1[name] - c0.get(name, 0.0) for name in c1}
    mon.close()
    after_close = _thread_cpu()
    figures = {"rank": rank, "on": a.on, "loop_s": loop_s, "step_s": loop_s / a.steps, "thread_cpu_s": cpu,
               "process_cpu_after_close_s": after_close.get("process_total")}  # fmt: skip
    if profiler is not None:
        figures["agent_profile"] = _top(profiler)
    if train_prof is not None:
        figures["train_profile"] = _top(train_prof, 40)
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(figures, f)
    dist.destroy_process_group()


def _profile_agent_thread(mon):
    """Run the agent thread's flushes under cProfile (the samplers run inside them)."""
    import cProfile

    prof = cProfile.Profile(time.thread_time)  # CPU time: on a loaded host wall time is mostly waiting
    worker = mon._worker
    original = worker._safe_flush

    def profiled(*args, **kwargs):
        prof.enable()
        try:
            return original(*args, **kwargs)
        finally:
            prof.disable()

    worker._safe_flush = profiled
    return prof


def _top(prof, n: int = 25) -> list:
    import pstats

    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append({"where": f"{os.path.basename(file)}:{line}({func})", "calls": nc, "own_s": tt, "cumulative_s": ct})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return rows[:n]


def launch(on: bool, steps: int, width: int, profile: bool = False, off_parts: str = "") -> dict:
    """One torchrun launch of the job; rank 0's figures and both ranks' thread CPU, with the launch's wall."""
    from benchmarks._harness import free_port

    out = tempfile.mkdtemp(prefix="rs-cpu-cost-")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           os.path.abspath(__file__), "--rank-job", "--on", str(int(on)), "--steps", str(steps), "--width", str(width),
           "--out", out, "--off-parts", off_parts] + (["--profile"] if profile else [])  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(HERE))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"launch failed ({proc.returncode}): {proc.stderr[-3000:]}")
    ranks = []
    for r in (0, 1):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    loop = max(r["loop_s"] for r in ranks)
    return {"on": on, "off_parts": off_parts, "launch_wall_s": wall, "loop_s": loop, "ranks": ranks}


def _parts(args) -> None:
    """Arms: off, on, and on with each ``--parts`` set off; per arm and thread, CPU seconds a step (medians over
    ``--pairs`` rounds, arms rotated): what each part of the agent costs, measured in CPU, not in wall time."""
    from benchmarks._harness import in_rounds, write_results

    arms = ["off", "on", *args.parts]

    def measure(arm, r):
        got = launch(arm != "off", args.steps, args.width, off_parts="" if arm in ("on", "off") else arm)
        cpu: dict = {}
        for rank in got["ranks"]:
            for name, v in rank["thread_cpu_s"].items():
                cpu.setdefault(name, []).append(v / args.steps)
        return {"loop_s": got["loop_s"], "cpu_s_per_step": {k: statistics.mean(v) for k, v in cpu.items()}}

    def show(arm, f):
        cpu = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in f["cpu_s_per_step"].items())
        return f"loop {f['loop_s']:.2f} s, {cpu}"

    rounds = in_rounds(arms, args.pairs, measure, show)
    summary = {
        arm: {name: statistics.median(r["cpu_s_per_step"].get(name, 0.0) for r in rows)
              for name in ("MainThread", "ranksight-agent", "process_total")}
        for arm, rows in rounds.items()
    }  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.json:
        write_results(args.json, {"summary_cpu_s_per_step": summary, "rounds": rounds, "steps": args.steps},
                      arms=arms, rounds=args.pairs)  # fmt: skip


def main() -> None:
    from benchmarks._harness import cli, machine_load, write_results

    if "--rank-job" in sys.argv:
        rank_job([a for a in sys.argv[1:] if a != "--rank-job"])
        return
    parser = cli(__doc__)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=1024, help="MLP width: sets the step time (~28 ms at 1024)")
    parser.add_argument("--profile", action="store_true", help="one launch with the agent thread under cProfile")
    parser.add_argument("--parts", nargs="*", default=[],
                        help="also launch the agent with these parts off, one arm each (e.g. comm_hook "
                             "time_collectives,comm_hook): where its CPU goes, per thread")  # fmt: skip
    args = parser.parse_args()

    if args.profile:
        res = launch(True, args.steps, args.width, profile=True)
        for r in res["ranks"]:
            print(f"rank {r['rank']}: loop {r['loop_s']:.2f} s, thread CPU {json.dumps(r['thread_cpu_s'])}")
        for row in res["ranks"][0]["agent_profile"]:
            print(f"  {row['cumulative_s']:.4f} s cum  {row['own_s']:.4f} s own  {row['calls']:>6}  {row['where']}")
        if args.json:
            write_results(args.json, {"profile": res, "load": machine_load()})
        return

    launch(True, max(20, args.steps // 10), args.width)  # warm-up launch, discarded (page cache, imports)
    if args.parts:
        return _parts(args)
    pairs = []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        load = machine_load()
        got = {on: launch(on, args.steps, args.width) for on in order}
        ratio = got[True]["loop_s"] / got[False]["loop_s"]
        launch_ratio = got[True]["launch_wall_s"] / got[False]["launch_wall_s"]
        pairs.append({"order": ["on" if o else "off" for o in order], "load": load, "loop_ratio": ratio,
                      "launch_ratio": launch_ratio, "on": got[True], "off": got[False]})  # fmt: skip
        agent = [r["thread_cpu_s"].get("ranksight-agent", 0.0) for r in got[True]["ranks"]]
        print(f"pair {i} ({'/'.join(pairs[-1]['order'])}): loop on/off {ratio:.3f}, launch {launch_ratio:.3f}, "
              f"step {got[False]['loop_s'] / args.steps * 1e3:.1f} ms, agent thread CPU {agent}, "
              f"load {load['loadavg'][0]:.1f}", flush=True)  # fmt: skip
    summary = {
        "loop_ratio_median": statistics.median(p["loop_ratio"] for p in pairs),
        "launch_ratio_median": statistics.median(p["launch_ratio"] for p in pairs),
        "step_s_off_median": statistics.median(p["off"]["loop_s"] / args.steps for p in pairs),
        "agent_thread_cpu_s_per_step": statistics.median(
            r["thread_cpu_s"].get("ranksight-agent", 0.0) / args.steps for p in pairs for r in p["on"]["ranks"]
        ),
        "training_thread_cpu_s_per_step": {
            arm: statistics.median(
                r["thread_cpu_s"].get("MainThread", 0.0) / args.steps for p in pairs for r in p[arm]["ranks"]
            )
            for arm in ("on", "off")
        },  # fmt: skip
        "process_cpu_s_per_step": {
            arm: statistics.median(
                r["thread_cpu_s"].get("process_total", 0.0) / args.steps for p in pairs for r in p[arm]["ranks"]
            )
            for arm in ("on", "off")
        },  # fmt: skip
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        write_results(args.json, {"summary": summary, "pairs": pairs, "steps": args.steps, "width": args.width,
                                  "load_after": machine_load()})  # fmt: skip


if __name__ == "__main__":
    main()
