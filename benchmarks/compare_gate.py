"""The regression gate against real runs: do healthy reruns pass, and is a planted slowdown caught?

Runs one small training job with the agent attached many times, under a competing CPU-bound process (on a
CPU machine), and gates pairs of runs with the real command line (``ranksight compare A B --gate 3% --json``):

* healthy pairs (two runs of the same job): each should pass (exit 0); the target is >= 19 of 20;
* a planted slowdown of ``--slow`` (8 % on CPU, 5 % on a GPU) of the step time, as a wait in the data loader's
  fetch (a read from slow storage): each should fail (exit 1) with the data wait named first; the target is
  >= 9 of 10;
* a planted 3 % slowdown (below what a short run can tell from noise): "cannot tell" or caught, never "faster".

    python -m benchmarks compare_gate --json benchmarks/results/compare_gate_cpu.json
    python -m benchmarks compare_gate --device cuda --small 0 --warmup --pairs 6 --json A.json   # one call...
    python -m benchmarks compare_gate --device cuda --small 0 --first-round 5 --pairs 20 --json B.json   # the next
    python -m benchmarks compare_gate --merge A.json B.json C.json --json OUT  # the parts as one

The job on CPU is a 2-rank DDP MLP on gloo (a few seconds of steps); with ``--device cuda`` one rank on the GPU
(about 20 s). Each planted run sizes its own slowdown: it times its first steps unplanted (inside the warm-up
the gate leaves out), then each fetch waits for the stated share of their median step, so the plant is that
share of the step under the load the run meets. A wait, not CPU work: on the 2-core machine, CPU work in the
fetch made the scheduler take the core back later in the step (the rank's "other" time rose as much as its
data wait), which is the host's doing, not the plant's. The rounds rotate which run goes first, so drift in the machine
falls on every arm alike; each round's load is kept.
Needs only torch, ranksight and duckdb.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _harness import cli, free_port, machine_load, rotated, spread, write_results  # noqa: E402

WORKER = "_worker"


def _worker(config: dict) -> None:
    """One rank of the job (started by ``run_job`` with the torchrun-style environment set)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import ranksight

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = config["device"]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if world > 1:
        dist.init_process_group("gloo" if device == "cpu" else "nccl", rank=rank, world_size=world)
    if device == "cuda":
        torch.cuda.set_device(rank)
    mon = ranksight.init(run_dir=config["run_dir"], job="compare-gate", run_id=config["run_id"], flush_interval_s=0.5)
    width, batch, depth = config["width"], config["batch"], config["depth"]
    layers: list = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers, nn.Linear(width, 1)).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    mon.watch(model, optimizer=opt)
    plant = {"share": config["plant"], "wait_s": 0.0, "ask_s": 0.0}
    starts: list[float] = []

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**7

        def __getitem__(self, i):
            if plant["wait_s"]:  # the planted slowdown: the fetch waits, as a read from slow storage does
                t0 = time.perf_counter()
                if plant["ask_s"] > 0:
                    time.sleep(plant["ask_s"])
                # A sleep wakes late on a busy host (a 0.9 ms sleep took about 2 ms beside the busy loop): the next
                # asks for less, so the waits average the planted share whatever the host does.
                plant["ask_s"] += 0.5 * (plant["wait_s"] - (time.perf_counter() - t0))
            return torch.randn(batch, 64), torch.randn(batch, 1)

    loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=0, pin_memory=device == "cuda")
    for step, (x, y) in enumerate(mon.loader(loader)):
        if plant["share"] and step <= PLANT_FROM:
            starts.append(time.perf_counter())
            if step == PLANT_FROM:  # the unplanted steps' median, past the first few
                plant["wait_s"] = plant["share"] * statistics.median(b - a for a, b in zip(starts[4:], starts[5:]))
                plant["ask_s"] = plant["wait_s"]
                print(f"planted {1000 * plant['wait_s']:.3f} ms a fetch", flush=True)
        with mon.step():
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if device == "cuda":
                loss.item()  # a loop that logs its loss every step: the host waits for the GPU, so a slow fetch shows
        if step + 1 >= config["steps"]:
            break
    mon.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def run_job(config: dict) -> str:
    """Start the job's ranks as processes (the environment torchrun would give them), wait, return the run."""
    port, world = free_port(), config["ranks"]
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, __file__, WORKER, json.dumps(config)], env=env))
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"job {config['run_id']} failed: exit codes {codes}")
    return os.path.join(config["run_dir"], config["run_id"])


def busy_loop() -> subprocess.Popen:
    """A competing CPU-bound process (a Python busy loop), as another job on the same host would be."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


PLANT_FROM = 24
"""A planted run's first planted fetch: the steps before it size the plant, and lie inside the warm-up the gate
leaves out of a 400- or 480-step run (its first 10 %)."""

JOBS = {
    "cpu": {"device": "cpu", "ranks": 2, "width": 256, "batch": 256, "depth": 3, "steps": 480},
    "cuda": {"device": "cuda", "ranks": 1, "width": 4096, "batch": 4096, "depth": 6, "steps": 400},
}
"""The job per device: on CPU about 10-20 ms a step on a shared 2-core machine (480 steps, 5-10 s: at 160 steps
the healthy pairs' intervals were 14 % wide, too wide to call an 8 % change);
on a GPU about 50 ms a step (400 steps: about 20 s)."""


def gate(a: str, b: str, limit: str, cwd: str) -> dict:
    """``ranksight compare A B --gate LIMIT --json``: its exit code and its change section."""
    out = subprocess.run(
        [sys.executable, "-m", "ranksight", "compare", a, b, "--gate", limit, "--json"],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )  # fmt: skip
    if out.returncode not in (0, 1, 2) or not out.stdout.strip():
        raise RuntimeError(f"compare {a} {b} failed ({out.returncode}): {out.stderr[-2000:]}")
    change = json.loads(out.stdout)["change"]
    row = {"a": os.path.basename(a), "b": os.path.basename(b), "exit_code": out.returncode, "status": change["status"]}
    if change["status"] == "incomparable":
        return {**row, "reason": change["reason"]}
    step = change["job"]["step"]
    c = step["change"]
    # Named first: the phase with the largest part beyond the host's stretch that moved up.
    moved = [r["phase"] for r in change["attribution"] if r["moved"] and r["excess"]["point"] > 0]
    wait = change["job"]["phases"].get("data_wait_s", {})
    return {**row, "verdict": change["verdict"], "verdict_reason": change.get("verdict_reason"),
            "change": c["point"], "low": c["low"], "high": c["high"], "a_s": step["a_s"], "b_s": step["b_s"],
            "first_moved": moved[0] if moved else None,
            "data_wait_pp": wait.get("contribution", {}).get("point"),
            "data_wait_excess": wait.get("excess", {}).get("point"),
            "explained": step["explained"], "host_stretch": step["host_stretch"]["point"]}  # fmt: skip


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument("--device", choices=sorted(JOBS), default="cpu")
    parser.add_argument("--pairs", type=int, default=20, help="rounds up to this one, a healthy pair each (default 20)")
    parser.add_argument("--slow-pairs", type=int, default=10, help="pairs of each planted slowdown (default 10)")
    parser.add_argument("--slow", type=float, default=None, help="the planted slowdown (default 0.08 CPU, 0.05 GPU)")
    parser.add_argument(
        "--small", type=float, default=0.03, help="the slowdown too small to call (default 0.03; 0 leaves that arm out)"
    )
    parser.add_argument("--limit", default="3%", help="the gate's limit (default 3%%)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the device's job)")
    parser.add_argument("--load", type=int, default=None, help="competing busy loops (default 1 on CPU, 0 on GPU)")
    parser.add_argument("--keep", default=None, help="keep the runs in this folder (default: a temporary one)")
    parser.add_argument(
        "--warmup", action="store_true",
        help="one launch first, not gated: a fresh machine's first launch pays cold caches (GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--regate", metavar="RESULTS", default=None, help="judge an earlier results file's pairs again (same runs)"
    )
    parser.add_argument(
        "--first-round", type=int, default=0,
        help="the first round's number: a machine that allows ten minutes a call runs rounds in parts (GPU)",
    )  # fmt: skip
    parser.add_argument("--merge", nargs="+", metavar="RESULTS", help="the parts' results files, as one (--json)")
    args = parser.parse_args()
    if args.regate:
        return regate(args)
    if args.merge:
        return merge(args)
    slow = args.slow if args.slow is not None else (0.08 if args.device == "cpu" else 0.05)
    load = args.load if args.load is not None else (1 if args.device == "cpu" else 0)
    base = dict(JOBS[args.device], **({"steps": args.steps} if args.steps else {}))
    root = args.keep or tempfile.mkdtemp(prefix="compare-gate-")
    run_dir = os.path.join(root, "runs")
    print(f"runs under {run_dir}", flush=True)
    # SIGTERM ends the benchmark through its finally: the busy loops it started go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    busy = [busy_loop() for _ in range(load)]
    started = time.perf_counter()
    try:
        job = lambda run_id, plant=0.0: run_job({**base, "run_dir": run_dir, "run_id": run_id, "plant": plant})  # noqa: E731
        shares = {"slow": slow, "small": args.small}
        runs: dict[str, str] = {}

        rounds: list[dict] = []
        pairs: dict[str, list] = {"healthy": [], "slow": [], "small": []}
        if args.warmup:
            job(f"warmup-{args.first_round}")
        planted = ["slow"] + (["small"] if args.small > 0 else [])
        for r in range(args.first_round, args.pairs):
            arms = ["healthy_a", "healthy_b"] + (planted if r < args.slow_pairs else [])
            load_now = machine_load()
            for arm in rotated(arms, r):
                runs[f"{arm}-{r}"] = job(f"{arm}-{r}", shares.get(arm, 0.0))
            rounds.append({"round": r, "load": load_now})
            # Gated as each round ends, and written each round: a run cut short still leaves its figures.
            pairs["healthy"].append(gate(runs[f"healthy_a-{r}"], runs[f"healthy_b-{r}"], args.limit, root))
            if r < args.slow_pairs:
                pairs["slow"].append(gate(runs[f"healthy_a-{r}"], runs[f"slow-{r}"], args.limit, root))
            if r < args.slow_pairs and args.small > 0:
                pairs["small"].append(gate(runs[f"healthy_b-{r}"], runs[f"small-{r}"], args.limit, root))
            summary = summarise(pairs, rounds, started)
            last = ", ".join(f"{k} {[p.get('verdict', p['status']) for p in v[-1:]]}" for k, v in pairs.items())
            print(f"round {r}: load {load_now['loadavg'][0]:.1f}; {last}", flush=True)
            figures = {"device": args.device, "job": base, "limit": args.limit, "slow": slow, "small": args.small,
                       "busy_loops": load, "plant_from_step": PLANT_FROM, "warmup_launch": args.warmup,
                       "summary": summary, "pairs": pairs, "rounds": rounds, "runs_dir": run_dir}  # fmt: skip
            if args.json:
                write_results(args.json, figures, arms=["healthy_a", "healthy_b", "slow", "small"], rounds=r + 1)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(json.dumps(summary, indent=1))
    return 0


def merge(args) -> int:
    """Several parts' results (``--first-round``, each its own launch of the benchmark) as one file (``--json``):
    their pairs and rounds joined, the summary made again; each part's header kept."""
    docs = []
    for path in args.merge:
        with open(path) as f:
            docs.append(json.load(f))
    doc = {k: v for k, v in docs[0].items() if k not in ("header", "pairs", "rounds", "summary")}
    doc["pairs"] = {k: [p for d in docs for p in d["pairs"][k]] for k in docs[0]["pairs"]}
    doc["rounds"] = [r for d in docs for r in d["rounds"]]
    doc["parts"] = [{"file": os.path.basename(p), "header": d.get("header")} for p, d in zip(args.merge, docs)]
    doc["summary"] = {**summarise(doc["pairs"], doc["rounds"], time.perf_counter()),
                      "wall_s": sum(d["summary"]["wall_s"] for d in docs)}  # fmt: skip
    print(json.dumps(doc["summary"], indent=1))
    if args.json:
        write_results(args.json, doc, arms=["healthy_a", "healthy_b", "slow", "small"], rounds=len(doc["rounds"]))
    return 0


def regate(args) -> int:
    """Gate every pair of an earlier results file again with this checkout's ``ranksight compare`` (the runs are
    the same; what judges them changed), and write the file (``--json``, else in place)."""
    with open(args.regate) as f:
        doc = json.load(f)
    run_dir = os.path.join(args.keep, "runs") if args.keep else doc["runs_dir"]
    root = os.path.dirname(run_dir)
    doc["pairs"] = {k: [gate(os.path.join(run_dir, p["a"]), os.path.join(run_dir, p["b"]), doc["limit"], root)
                        for p in v] for k, v in doc["pairs"].items()}  # fmt: skip
    wall = doc["summary"]["wall_s"]
    doc["summary"] = {**summarise(doc["pairs"], doc["rounds"], time.perf_counter()), "wall_s": wall}
    header = doc.pop("header", {})
    doc["regated_from"] = header
    print(json.dumps(doc["summary"], indent=1))
    write_results(args.json or args.regate, doc, arms=header.get("arms"), rounds=header.get("rounds"))
    return 0


def summarise(pairs: dict, rounds: list, started: float) -> dict:
    """The counts the targets are stated in, and the spread of the changes and intervals behind them."""
    return {
        "exit_codes": {k: {c: sum(p["exit_code"] == c for p in v) for c in (0, 1, 2)} for k, v in pairs.items()},
        "healthy_passed": sum(p["exit_code"] == 0 for p in pairs["healthy"]),
        "healthy_pairs": len(pairs["healthy"]),
        "slow_failed": sum(p["exit_code"] == 1 for p in pairs["slow"]),
        "slow_failed_data_named": sum(p["exit_code"] == 1 and p["first_moved"] == "data_wait_s" for p in pairs["slow"]),
        "slow_data_named_first": sum(p.get("first_moved") == "data_wait_s" for p in pairs["slow"]),
        "slow_pairs": len(pairs["slow"]),
        "verdicts": {
            k: {w: sum(p.get("verdict") == w for p in v) for w in ("slower", "cannot tell", "no change", "faster")}
            for k, v in pairs.items()
        },
        "small_failed": sum(p["exit_code"] == 1 for p in pairs["small"]),
        "healthy_change": spread([p.get("change") for p in pairs["healthy"]]),
        "healthy_interval_width": spread([p["high"] - p["low"] for p in pairs["healthy"] if "high" in p]),
        "healthy_explained_width": spread(
            [p["explained"]["high"] - p["explained"]["low"] for p in pairs["healthy"] if "explained" in p]
        ),
        "slow_change": spread([p.get("change") for p in pairs["slow"]]),
        "slow_data_wait_pp": spread([p.get("data_wait_pp") for p in pairs["slow"]]),
        "slow_size": spread([p.get("data_wait_excess") for p in pairs["slow"]]),
        "slow_explained": spread([(p.get("explained") or {}).get("point") for p in pairs["slow"]]),
        "healthy_explained": spread([(p.get("explained") or {}).get("point") for p in pairs["healthy"]]),
        "small_change": spread([p.get("change") for p in pairs["small"]]),
        "small_data_wait_pp": spread([p.get("data_wait_pp") for p in pairs["small"]]),
        "small_size": spread([p.get("data_wait_excess") for p in pairs["small"]]),
        "loadavg_1m": spread([r["load"]["loadavg"][0] for r in rounds]),
        "wall_s": time.perf_counter() - started,
    }


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == WORKER:
        _worker(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
