"""What the agent costs a CPU job whose ranks take every core: a 2-rank gloo DDP job, agent on against
``ranksight.init(enabled=False)``, in alternating pairs of launches, and where each arm's CPU goes per step.

    python -m benchmarks agent_cost_gloo --pairs 6 --json benchmarks/results/cpu_agent_cost_gloo.json
    python -m benchmarks agent_cost_gloo --pairs 6 --arm hook='{"comm_hook": true}'   # more arms: init kwargs

Each launch is ``torchrun --nproc-per-node 2`` of this file's ``--rank-job``: an MLP sized for ~28 ms steps with
one torch thread a rank (two ranks on two cores), ``--steps`` steps through ``mon.loader`` and ``mon.step()``
with ``watch(ddp, optimizer)``; only the loop is timed. A round runs every arm once, in rotated order (with two
arms: alternating pairs); a round's ratio is the arm's loop time (the slower rank's) over the off arm's, and the
figure is the median over rounds. Per arm and step, each thread's CPU from ``/proc/self/task`` over the loop:
the training thread, the agent thread, and the rest (gloo's threads, on which DDP's comm-hook callbacks run).
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


def _task_cpu(names: dict) -> dict:
    """CPU seconds of every thread of this process (``/proc/self/task``): those in ``names`` (native id ->
    name) by name, every other thread summed as ``other`` and by its kernel name as ``other:NAME``."""
    tick, out = os.sysconf("SC_CLK_TCK"), {"other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                comm, rest = f.read().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue  # a thread that ended
        fields = rest.split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        name = names.get(int(tid))
        if name is None:
            out["other"] += cpu
            name = "other:" + "".join(c for c in comm if not c.isdigit())  # gloo's, arrow's ... threads by kind
        out[name] = out.get(name, 0.0) + cpu
    return out


def rank_job(argv: list[str]) -> None:
    """One rank of the job (under torchrun): writes its loop time and per-thread CPU to ``OUT/rankN.json``."""
    import argparse
    import threading

    import torch
    import torch.distributed as dist
    from torch import nn

    import ranksight

    p = argparse.ArgumentParser()
    p.add_argument("--kwargs", default="null", help="JSON: ranksight.init keyword arguments; null: enabled=False")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    kwargs = json.loads(a.kwargs)
    mon = ranksight.init(
        run_dir=os.path.join(a.out, "runs"), job="cpu-cost", **(kwargs if kwargs is not None else {"enabled": False})
    )
    model = nn.Sequential(
        nn.Linear(256, a.width), nn.ReLU(), nn.Linear(a.width, a.width), nn.ReLU(), nn.Linear(a.width, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    mon.watch(ddp, optimizer=opt)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(16)]
    loader = [batches[i % 16] for i in range(a.steps)]
    dist.barrier()
    names = {t.native_id: t.name for t in threading.enumerate() if t.name in ("MainThread", "ranksight-agent")}
    t0, c0 = time.perf_counter(), _task_cpu(names)
    for x, y in mon.loader(loader):
        with mon.step():
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    loop_s = time.perf_counter() - t0
    c1 = _task_cpu(names)
    mon.close()
    cpu = {name: (c1[name] - c0.get(name, 0.0)) / a.steps for name in c1}
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "loop_s": loop_s, "cpu_s_per_step": cpu}, f)
    dist.destroy_process_group()


def launch(kwargs: dict | None, steps: int, width: int) -> dict:
    """One torchrun launch: the slower rank's loop time and each rank's per-thread CPU a step."""
    from benchmarks._harness import free_port

    out = tempfile.mkdtemp(prefix="rs-cost-gloo-")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           os.path.abspath(__file__), "--rank-job", "--kwargs", json.dumps(kwargs), "--steps", str(steps),
           "--width", str(width), "--out", out]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"launch failed ({proc.returncode}): {proc.stderr[-3000:]}")
    ranks = []
    for r in (0, 1):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    cpu: dict = {}
    for rank in ranks:
        for name, v in rank["cpu_s_per_step"].items():
            cpu.setdefault(name, []).append(v)
    loop_s = max(r["loop_s"] for r in ranks)
    return {"loop_s": loop_s, "cpu_s_per_step": {k: statistics.mean(v) for k, v in cpu.items()}}


def main() -> None:
    from benchmarks._harness import cli, in_rounds, machine_load, spread, write_results

    if "--rank-job" in sys.argv:
        rank_job([a for a in sys.argv[1:] if a != "--rank-job"])
        return
    parser = cli(__doc__)
    parser.add_argument("--pairs", type=int, default=6, help="rounds: every arm once in each, rotated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=1024, help="MLP width: sets the step time (~28 ms at 1024)")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=JSON",
                        help="another arm: the agent with these ranksight.init keyword arguments")  # fmt: skip
    args = parser.parse_args()
    arms: dict = {"off": None, "on": {}}
    for spec in args.arm:
        name, _, kw = spec.partition("=")
        arms[name] = json.loads(kw)

    launch({}, max(20, args.steps // 10), args.width)  # warm-up launch, discarded (page cache, imports)

    def measure(arm, r):
        return launch(arms[arm], args.steps, args.width)

    def show(arm, f):
        cpu = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(f["cpu_s_per_step"].items()))
        return f"loop {f['loop_s']:.2f} s, CPU ms/step: {cpu}, load {f['load']['loadavg'][0]:.2f}"

    rounds = in_rounds(list(arms), args.pairs, measure, show)
    ratios = {
        arm: [rows[i]["loop_s"] / rounds["off"][i]["loop_s"] for i in range(args.pairs)]
        for arm, rows in rounds.items() if arm != "off"
    }  # fmt: skip
    threads = sorted({k for rows in rounds.values() for row in rows for k in row["cpu_s_per_step"]})
    summary = {
        "loop_ratio": {arm: spread(v) for arm, v in ratios.items()},
        "step_s_off_median": statistics.median(row["loop_s"] / args.steps for row in rounds["off"]),
        "cpu_ms_per_step_median": {
            arm: {t: statistics.median(row["cpu_s_per_step"].get(t, 0.0) * 1e3 for row in rows) for t in threads}
            for arm, rows in rounds.items()
        },
        "loadavg_1m": spread([row["load"]["loadavg"][0] for row in rounds["off"]]),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        write_results(args.json, {"summary": summary, "rounds": rounds, "arms_kwargs": arms, "steps": args.steps,
                                  "width": args.width, "load_after": machine_load()},
                      arms=list(arms), rounds=args.pairs)  # fmt: skip


if __name__ == "__main__":
    main()
