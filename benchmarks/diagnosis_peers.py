"""Diagnosis side by side: ranksight, TraceML and torch.profiler on the demo's planted faults (CPU, 2 gloo ranks).

For each CPU fault of ``ranksight demo`` (none, input, sync, straggler, graph-break, unused-params) the same
job (``ranksight.commands.demo_job._build``: same model, data, DDP settings and fault) runs three times:

- ranksight: ``ranksight demo --fault F``, then ``ranksight diagnose RUN --json`` (or, when that command
  is not there yet, ``ranksight.rules.diagnose(RUN)``, the function it prints); the first finding counts.
- TraceML 0.5.0: ``traceml serve`` + ``traceml.init(mode="auto")`` + ``trace_step``; its primary
  diagnosis (the "Verdict" line of its end-of-run card) counts.
- torch.profiler: 5 steps recorded after the first quarter; ``key_averages()`` top rows by self CPU time
  on each rank. The profiler gives no verdict: a cause counts as named when the top row of every rank is
  the fault's signature (the loader's ``__next__`` for input, an all-reduce for sync, ...), "partial"
  when it is in every rank's top three; it never names a rank (one table per rank, no comparison).

Judging: *cause* is right when the tool's first verdict is the planted fault (for ``none``: when it
claims no fault at warning level or above); *rank* is right when it names exactly the planted ranks
(all ranks, except the straggler's last rank). GPU-only faults (cpu-op, pageable, host-sync,
fragmentation) are in docs/gpu-validation.md.

Usage: ``python benchmarks/diagnosis_peers.py [--faults none,input,...] [--steps 40] [--json OUT]``
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

from _harness import cli, free_port, markdown, write_results
from _peers import init_rank, start_ranks, traceml_aggregator, train_step, versions

CPU_FAULTS = ("none", "input", "sync", "straggler", "graph-break", "unused-params")
RANKS = 2

# The planted cause: ranksight rule ids that name it, TraceML kinds that name it, profiler row signatures.
EXPECTED = {
    "none": {"rules": set(), "traceml": {"COMPUTE_BOUND", "NO_CLEAR_PERFORMANCE_BOTTLENECK"}, "profiler": None},
    "input": {"rules": {"input-bound"}, "traceml": {"INPUT_BOUND", "INPUT_STRAGGLER"}, "profiler": r"DataLoader"},
    "sync": {"rules": {"exposed-allreduce", "comm-latency"}, "traceml": set(), "profiler": r"all_?reduce|gloo"},
    "straggler": {
        "rules": {"straggler", "compute-imbalance"},
        "traceml": {"COMPUTE_STRAGGLER"},
        "profiler": None,  # a per-rank table cannot show which rank is slow
    },
    "graph-break": {"rules": {"graph-breaks", "recompiles"}, "traceml": set(), "profiler": r"dynamo|Compile|compile"},
    "unused-params": {"rules": {"unused-parameter-scan"}, "traceml": set(), "profiler": r"unused|find_unused"},
}


def expected_ranks(fault: str) -> list[int]:
    """The ranks a right answer names."""
    if fault == "none":
        return []
    return [RANKS - 1] if fault == "straggler" else list(range(RANKS))


# ------------------------------------------------------------------ the demo's faults under a peer

PROFILER_TOP_ROWS = 8


def _profiler_rows(prof) -> list[dict]:
    """The top rows of ``key_averages()`` by self CPU time, as a user reads them off the printed table."""
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {
            "name": e.key,
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "self_cpu_share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[:PROFILER_TOP_ROWS]
    ]


def demo_peer_main(rank: int, cfg_dict: dict, port: int, arm: str, out_dir: str, traceml_cfg: dict) -> None:
    """One rank of ``ranksight.commands.demo_job``'s job for ``cfg.fault``, with ``arm`` (profiler or traceml) attached.

    Mirrors ``ranksight.commands.demo_job._worker`` (same model, data, DDP settings and fault) on CPU; only the
    watching tool differs. The profiler records 5 steps after the first quarter of the run and keeps
    ``key_averages()``; TraceML traces every step and its aggregator writes the verdict.
    """
    from ranksight.commands.demo_job import DemoConfig, _build

    cfg = DemoConfig(**cfg_dict)
    init_rank(rank, cfg.ranks, port)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    device = torch.device("cpu")
    traceml = prof = None
    if arm == "traceml":
        import traceml_ai as traceml

        traceml.init(mode="auto", on_missing_aggregator="raise", **traceml_cfg)
    model, loader, loss_fn = _build(cfg, rank, device)
    bucket_cap_mb = 512 if cfg.fault == "sync" else 25
    model = DDP(model, find_unused_parameters=cfg.fault == "unused-params", bucket_cap_mb=bucket_cap_mb)
    if cfg.fault == "graph-break":
        model = torch.compile(model, backend="eager", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows: list[dict] = []
    if arm == "profiler":
        from torch.profiler import ProfilerActivity, profile, schedule

        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=max(1, cfg.steps // 4), warmup=1, active=5, repeat=1),
            on_trace_ready=lambda p: rows.extend(_profiler_rows(p)),
        )
        prof.start()

    step = 0
    while step < cfg.steps:
        for x, y in loader:
            if cfg.fault == "graph-break" and step % 10 == 9:
                x, y = x[: 8 + step % 7], y[: 8 + step % 7]  # ragged batches: recompiles
            with traceml.trace_step(model) if traceml is not None else contextlib.nullcontext():
                train_step(model, opt, loss_fn, x, y)
            if prof is not None:
                prof.step()
            step += 1
            if step >= cfg.steps:
                break
    if prof is not None:
        prof.stop()
        with open(os.path.join(out_dir, f"profiler-rank{rank}.json"), "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def run_demo_peer(cfg, arm: str, out_dir: str) -> dict:
    """Run the demo's job for ``cfg.fault`` under a peer; return what the peer reported."""
    import diagnosis_peers

    traceml_cfg: dict = {}
    aggregator = contextlib.nullcontext()
    if arm == "traceml":
        traceml_cfg = {"session_id": f"{cfg.fault}", "aggregator_port": free_port(), "logs_dir": out_dir}
        aggregator = traceml_aggregator(
            cfg.ranks, traceml_cfg["aggregator_port"], cfg.fault, out_dir, os.path.join(out_dir, "traceml-serve.log")
        )
    with aggregator:
        # by its module's name: the ranks unpickle it from there
        start_ranks(diagnosis_peers.demo_peer_main, (asdict(cfg), free_port(), arm, out_dir, traceml_cfg), cfg.ranks,
                    out_dir)  # fmt: skip
    if arm == "profiler":
        out = {}
        for r in range(cfg.ranks):
            with open(os.path.join(out_dir, f"profiler-rank{r}.json")) as f:
                out[f"rank{r}"] = json.load(f)
        return out
    with open(os.path.join(out_dir, traceml_cfg["session_id"], "final_summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out_dir, traceml_cfg["session_id"], "final_summary.txt")) as f:
        text = f.read()
    return {"primary_diagnosis": summary.get("primary_diagnosis"), "text": text}


# ------------------------------------------------------------------ judging each tool's answer


def _ranksight(*args: str) -> subprocess.CompletedProcess:
    """``ranksight ARGS`` in a fresh process, its output kept."""
    return subprocess.run([sys.executable, "-m", "ranksight", *args], capture_output=True, text=True)


def run_ranksight(fault: str, steps: int, root: str) -> dict:
    """Run ranksight's demo for the fault and judge its first finding."""
    run_dir, run_id = os.path.join(root, "ranksight"), f"diag-{fault}"
    proc = _ranksight("demo", "--fault", fault, "--steps", str(steps), "--ranks", str(RANKS), "--run-dir", run_dir,
                      "--run-id", run_id, "--no-dashboard")  # fmt: skip
    if proc.returncode != 0:
        return {"error": f"demo exited {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    proc, how = _ranksight("diagnose", os.path.join(run_dir, run_id), "--json"), "ranksight diagnose RUN --json"
    if proc.returncode != 0:
        raise RuntimeError(f"ranksight diagnose failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    diag = json.loads(proc.stdout)
    findings = [f for f in diag.get("findings", []) if f.get("severity") in ("warning", "critical")]
    first = findings[0] if findings else None
    exp = EXPECTED[fault]
    if first is None:
        cause_ok, ranks_ok = fault == "none", fault == "none"
    else:
        cause_ok = first["rule"] in exp["rules"]
        ranks_ok = sorted(first.get("ranks", [])) == expected_ranks(fault)
    return {
        "how": how,
        "printed": f"{first['severity']} {first['axis']}/{first['rule']} ranks {first.get('ranks')}: {first['summary']}"
        if first
        else "no finding at warning level or above",
        "all_rules": [f"{f['rule']}({f['severity']}, ranks {f.get('ranks')})" for f in diag.get("findings", [])],
        "cause_ok": cause_ok,
        "ranks_ok": ranks_ok,
    }


def _traceml_ranks(diagnosis: dict) -> list[int]:
    """The rank TraceML blames: its evidence's worst rank, else the first rank its summary names."""
    ev = diagnosis.get("evidence") or {}
    worst = ev.get("worst")
    if isinstance(worst, dict) and "rank" in worst:
        return [int(worst["rank"])]
    named = re.findall(r"\b[rR](\d+)\b", diagnosis.get("summary", ""))
    return [int(named[0])] if named else []


def run_traceml(fault: str, steps: int, root: str) -> dict:
    """Run the fault under TraceML and judge its primary diagnosis."""
    from ranksight.commands.demo_job import DemoConfig

    cfg = DemoConfig(fault=fault, steps=steps, ranks=RANKS, run_dir=os.path.join(root, "unused"))
    res = run_demo_peer(cfg, "traceml", os.path.join(root, "traceml", fault))
    diag = res.get("primary_diagnosis") or {}
    kind = diag.get("kind", "")
    ranks = _traceml_ranks(diag)
    cause_ok = kind in EXPECTED[fault]["traceml"]
    if fault == "none":
        ranks_ok = cause_ok
    elif kind in ("INPUT_BOUND", "COMPUTE_BOUND"):  # job-wide verdicts: they stand for every rank
        ranks_ok = cause_ok and expected_ranks(fault) == list(range(RANKS))
    else:
        ranks_ok = cause_ok and ranks == expected_ranks(fault)
    return {
        "printed": f"Verdict: {diag.get('status')} ({diag.get('severity')}): {diag.get('summary')}",
        "kind": kind,
        "ranks": ranks,
        "cause_ok": cause_ok,
        "ranks_ok": ranks_ok,
        "card": res.get("text", ""),
    }


def run_profiler(fault: str, steps: int, root: str) -> dict:
    """Run the fault under torch.profiler and judge its top key_averages rows."""
    from ranksight.commands.demo_job import DemoConfig

    cfg = DemoConfig(fault=fault, steps=steps, ranks=RANKS, run_dir=os.path.join(root, "unused"))
    res = run_demo_peer(cfg, "profiler", os.path.join(root, "profiler", fault))
    signature = EXPECTED[fault]["profiler"]
    tops = {r: (rows[0]["name"] if rows else "") for r, rows in res.items()}
    if fault == "none":
        cause_ok = None  # the profiler claims nothing either way
    elif signature is None:
        cause_ok = False
    elif all(re.search(signature, top) for top in tops.values()):
        cause_ok = True
    elif all(any(re.search(signature, row["name"]) for row in rows[:3]) for rows in res.values()):
        cause_ok = "partial"  # there, but below other rows: the reader has to know to look for it
    else:
        cause_ok = False
    printed = "; ".join(
        f"{r}: " + ", ".join(f"{row['name']} {row['self_cpu_share']:.0%}" for row in rows[:3])
        for r, rows in res.items()
    )
    return {"printed": printed, "top_rows": res, "cause_ok": cause_ok, "ranks_ok": None if fault == "none" else False}


def _mark(value) -> str:
    return {True: "yes", False: "no", None: "n/a", "partial": "partial"}[value]


def markdown_table(results: dict) -> str:
    """The diagnosis table for docs/benchmarks.md."""
    rows = [[fault, tool, f"error: {r['error']}", "-", "-"] if "error" in r else
            [fault, tool, r["printed"].replace("\n", " "), _mark(r["cause_ok"]), _mark(r["ranks_ok"])]
            for fault, tools in results.items() for tool, r in tools.items()]  # fmt: skip
    return markdown(["fault", "tool", "what it printed first", "right cause", "right rank"], rows)


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument("--faults", default=",".join(CPU_FAULTS), help="comma-separated CPU faults")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--tools", default="ranksight,traceml,profiler")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if any(f not in CPU_FAULTS for f in faults):
        parser.error(f"--faults must name only CPU faults: {', '.join(CPU_FAULTS)}")
    runners = {"ranksight": run_ranksight, "traceml": run_traceml, "profiler": run_profiler}
    tools = [t for t in args.tools.split(",") if t]
    if any(t not in runners for t in tools):
        parser.error(f"--tools must name only {', '.join(runners)}")

    results: dict = {}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="rs-diag-") as root:
        for fault in faults:
            results[fault] = {}
            for tool in tools:
                t0 = time.time()
                try:
                    results[fault][tool] = runners[tool](fault, args.steps, root)
                except Exception as exc:  # noqa: BLE001 - a tool that fails is reported, not hidden
                    results[fault][tool] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
                results[fault][tool]["wall_s"] = round(time.time() - t0, 1)
                r = results[fault][tool]
                print(f"[{fault}] {tool}: {r.get('printed', r.get('error'))}", file=sys.stderr, flush=True)
    table = markdown_table(results)
    print(table)
    if args.json:
        figures = {"started_utc": started, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "versions": versions(), "steps": args.steps,
                   "results": results, "table": table}  # fmt: skip
        write_results(args.json, figures, arms=tools)
    return 0


if __name__ == "__main__":
    sys.exit(main())
