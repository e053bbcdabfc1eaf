"""The demo's planted faults, then their diagnosis: is each fault named first?

Two halves, because the GPU machine has no DuckDB:

``python benchmarks/demo_suite.py run --out DIR [--faults ...] [--steps N] [--ranks N]``
    one ``ranksight demo`` job per fault (GPU faults need CUDA), run folders under ``DIR/runs``, and
    ``DIR/demo_runs.json`` with each job's wall time and its median host / GPU step clocks (read
    with pyarrow alone).
``python benchmarks/demo_suite.py report DIR``
    anywhere with DuckDB: ``ranksight.rules.diagnose`` on each run; prints scenario → first finding →
    confidence (and the ranks), checks them against ``EXPECTED`` and writes ``DIR/demo_diagnosis.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from _harness import median, read_rows, write_results

GPU_DEFAULT = ("none", "input", "pageable", "cpu-op", "host-sync", "fragmentation")
CPU_DEFAULT = ("none", "input", "sync", "straggler", "graph-break", "unused-params")
# What each planted fault must be diagnosed as first (None: no warning or critical finding at all).
EXPECTED = {
    "none": None,
    "input": ("data_pipeline", "input-bound"),
    "sync": ("sync", "exposed-allreduce"),
    "straggler": ("sync", "straggler"),
    "straggler30": ("sync", "straggler"),
    "blocking": ("sync", "blocking-collectives"),
    "graph-break": ("parallelism", "graph-breaks"),
    "unused-params": ("parallelism", "unused-parameter-scan"),
    "pageable": ("data_pipeline", "pageable-copies"),
    "cpu-op": ("parallelism", "cpu-ops"),
    "host-sync": ("data_pipeline", "input-path-syncs"),
    "fragmentation": ("parallelism", "fragmentation"),
}


def _clocks(run_path: str) -> dict:
    rows = [r for r in read_rows(run_path, "steps") if r["step"] >= 5]
    keys = ("step_s", "data_wait_s", "gpu_step_s", "gpu_gap_s", "h2d_s", "gpu_compute_s")
    return {"steps": len(rows), **{f"median_{k}": median(r.get(k) for r in rows) for k in keys}}


def run(args) -> int:
    from ranksight.commands.demo_job import DemoConfig, run_demo

    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    out: dict = {"runs": {}}
    try:
        import torch

        out["torch"], out["device"] = torch.__version__, torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - recorded, the runs say the rest
        out["device"] = f"unknown ({exc})"
    if not args.faults:
        import torch

        args.faults = list(GPU_DEFAULT if torch.cuda.is_available() else CPU_DEFAULT)
    for fault in args.faults:
        name = f"{args.prefix}-{fault}-r{args.ranks}"
        runs = os.path.join(args.out, "runs")
        cfg = DemoConfig(fault=fault, ranks=args.ranks, steps=args.steps, run_dir=runs, job="demo-suite", run_id=name)
        t0 = time.perf_counter()
        try:
            path = run_demo(cfg)
            out["runs"][name] = {"fault": fault, "wall_s": time.perf_counter() - t0, **_clocks(path)}
        except Exception as exc:  # noqa: BLE001 - one failing fault must not lose the others
            out["runs"][name] = {"fault": fault, "error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(out["runs"][name]), flush=True)
    write_results(os.path.join(args.out, "demo_runs.json"), out, arms=args.faults)
    return 0


def _shares_a_gpu_over_gloo(runs_dir: str, name: str) -> bool:
    """Whether rank 0 recorded DDP over gloo with its model on a GPU (the demo's ranks sharing one GPU, where
    NCCL refuses them), from its rank file rather than the folder's name: a CPU run is gloo too."""
    try:
        with open(os.path.join(runs_dir, name, "ranks", "rank-00000.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    devices = (meta.get("model") or {}).get("devices") or []
    return (meta.get("ddp") or {}).get("backend") == "gloo" and any(str(d).startswith("cuda") for d in devices)


def report(args) -> int:
    from ranksight.rules import diagnose

    runs_dir = os.path.join(args.dir, "runs")
    table, ok = [], True
    for name in sorted(os.listdir(runs_dir)):
        fault = name.split("-", 1)[1].rsplit("-r", 1)[0]  # PREFIX-FAULT-rRANKS
        result = diagnose(os.path.join(runs_dir, name))
        serious = [f for f in result["findings"] if f["severity"] != "info"]
        first = serious[0] if serious else None
        got = (first["axis"], first["rule"]) if first else None
        ranks = int(name.rsplit("-r", 1)[1])
        expected = EXPECTED.get(fault, got)
        if fault == "none" and ranks > 1 and _shares_a_gpu_over_gloo(runs_dir, name):
            expected = ("sync", "gloo-on-gpu")  # ranks sharing one GPU must use gloo: NCCL refuses them
        right = got == expected
        if fault in ("straggler", "straggler30") and first:  # the demo slows the last rank down
            right &= first["ranks"] == [ranks - 1]
        ok &= right
        row = {"run": name, "fault": fault, "first": got}
        row.update({k: first[k] if first else None for k in ("severity", "confidence", "ranks", "evidence")})
        table.append(
            {**row, "others": [f["rule"] for f in serious[1:]], "right": right, "breakdown": result["breakdown"]}
        )
        shown = "no warning"
        if first:
            shown = f"{got[0]} / {got[1]} ({first['severity']}, {first['confidence']:.2f}, ranks {first['ranks']})"
        print(f"{name:28s} {shown:55s} {'right' if right else 'WRONG'}")
    write_results(os.path.join(args.dir, "demo_diagnosis.json"), {"runs": table})
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the demo faults")
    r.add_argument("--out", required=True)
    default = f"default: {' '.join(GPU_DEFAULT)} on a GPU, else {' '.join(CPU_DEFAULT)}"
    r.add_argument("--faults", nargs="+", help=default)
    r.add_argument("--prefix", default="gpu", help="run folder names: PREFIX-FAULT-rRANKS")
    r.add_argument("--steps", type=int, default=60)
    r.add_argument("--ranks", type=int, default=1)
    d = sub.add_parser("report", help="diagnose the runs of a 'run' folder")
    d.add_argument("dir")
    args = p.parse_args()
    return run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    raise SystemExit(main())
