"""The GPU verdict on code we did not write: does ``ranksight diagnose`` stay silent on healthy jobs and
name each planted fault first, on framework scripts written the way their users write them?

The scripts in ``benchmarks/foreign/`` (a Hugging Face Trainer causal LM, a Lightning image classifier in
both ``training_step`` styles, an Accelerate ResNet-50 with gradient accumulation, a torchvision-style
loop, a nanoGPT-style loop and a plain MLP loop) each run on one GPU, ``--repeats`` times, each attached
the way its users would attach ranksight. TraceML (``traceml run``, its own auto-attach for Hugging Face
and Lightning, ``trace_step`` in plain loops) runs the same jobs in the same invocation, as the peer.

    python benchmarks/foreign_corpus.py --run --repeats 3 --out /tmp/fc          # on the GPU machine
    python benchmarks/foreign_corpus.py --score /tmp/fc --json benchmarks/results/gpu_foreign_X.json

``--run`` writes ``runs/`` (ranksight run folders), ``traceml/`` (TraceML summaries), ``jobs.jsonl`` (one line
a job: script, fault, tool, repeat, seconds, exit code, TraceML's primary diagnosis) and ``device.json``.
``--score`` diagnoses every run folder with the installed ranksight (so a rule change is judged again on
the same measurements) and prints, per framework and card: precision, recall, flip rate and the healthy
false-alarm rate, for ranksight and for TraceML where it has a label for the fault.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
FOREIGN = os.path.join(HERE, "foreign")

# (job name, script, extra args, faults)
JOBS = [
    ("hf_clm", "hf_clm.py", [], ["none", "input"]),
    ("lightning_submodule", "lightning_vision.py", ["--style", "submodule"], ["none", "input", "pageable"]),
    ("lightning_self", "lightning_vision.py", ["--style", "self"], ["none", "pageable"]),
    ("accelerate_resnet", "accelerate_resnet.py", [], ["none", "input"]),
    ("vision_loop", "vision_loop.py", [], ["none", "input", "pageable"]),
    ("nanogpt_loop", "nanogpt_loop.py", [], ["none", "host-sync", "unmeasured"]),
    ("mlp_plain", "mlp_plain.py", [], ["none", "cpu-ops"]),
]
EXPECTED = {
    "none": "silent",
    "input": "input-bound",
    "pageable": "pageable-copies",
    "cpu-ops": "cpu-ops",
    "host-sync": "input-path-syncs",
    "unmeasured": "unexplained-host-time",
}
TRACEML_RIGHT = {
    "none": {"COMPUTE_BOUND", "NO_CLEAR_PERFORMANCE_BOTTLENECK"},
    "input": {"INPUT_BOUND", "INPUT_STRAGGLER"},
    "pageable": {"H2D_BOUND", "H2D_STRAGGLER"},
    "unmeasured": {"RESIDUAL_HEAVY"},
}
"""TraceML's primary diagnoses that name each fault; a fault it has no label for is not scored for it."""


def _device() -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return {"gpu": out, "python": sys.version.split()[0]}


def _traceml_primary(logs: str) -> str | None:
    for path in glob.glob(os.path.join(logs, "**", "final_summary.json"), recursive=True):
        try:
            with open(path) as f:
                return (json.load(f).get("primary_diagnosis") or {}).get("kind")
        except (OSError, ValueError):
            return None
    return None


def run(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    with open(os.path.join(out, "device.json"), "w") as f:
        json.dump(_device(), f)
    tools = args.tools or (["ranksight"] + (["traceml"] if args.traceml else []))
    plan = []
    for rep in range(args.repeats):
        for name, script, extra, faults in JOBS:
            if args.jobs and name not in args.jobs:
                continue
            for fault in faults:
                if args.faults and fault not in args.faults:
                    continue
                for tool in tools:
                    if tool == "traceml" and rep >= args.traceml_repeats:
                        continue
                    plan.append((rep, name, script, extra, fault, tool))
    t_end = time.monotonic() + args.budget_s
    jobs_path = os.path.join(out, "jobs.jsonl")
    for rep, name, script, extra, fault, tool in plan:
        if time.monotonic() > t_end:
            print(f"budget spent: {name} {fault} {tool} r{rep} not started", flush=True)
            continue
        run_id = f"{name}.{fault}.r{rep}.{os.getpid()}"
        env = dict(
            os.environ, RANKSIGHT_RUN_DIR=os.path.join(out, "runs"), RANKSIGHT_RUN_ID=run_id, PYTHONUNBUFFERED="1"
        )
        cmd = [sys.executable, os.path.join(FOREIGN, script), "--tool", tool, "--fault", fault, *extra]
        if tool == "traceml":
            tm_logs = os.path.join(out, "traceml", run_id)
            cmd = [
                sys.executable,
                "-m",
                "traceml_ai.launcher.cli",
                "run",
                os.path.join(FOREIGN, script),
                "--mode",
                "summary",
                "--logs-dir",
                tm_logs,
                "--run-name",
                "t",
                "--args",
                "--tool",
                "traceml",
                "--fault",
                fault,
                *extra,
            ]
        log = os.path.join(out, "logs", f"{run_id}.{tool}.log")
        t0 = time.monotonic()
        with open(log, "w") as lf:
            try:
                rc = subprocess.run(
                    cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=args.job_timeout_s, cwd=out
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        row = {
            "job": name,
            "fault": fault,
            "tool": tool,
            "repeat": rep,
            "run_id": run_id,
            "rc": rc,
            "seconds": round(time.monotonic() - t0, 1),
        }
        if tool == "traceml":
            row["traceml"] = _traceml_primary(tm_logs)
        with open(jobs_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


def diagnose(run_path: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ranksight", "diagnose", run_path, "--json"], capture_output=True, text=True, timeout=300
    )
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": (proc.stderr or proc.stdout)[-500:]}


def verdict(report: dict) -> str:
    if "error" in report:
        return "error"
    for f in report.get("findings", []):
        if f.get("severity") in ("warning", "critical"):
            return f["rule"]
    return "silent"


NO_FAULT_WITHIN = 0.05
"""A planted fault whose median step is within 5 % of the same job's healthy median on the same card costs
nothing there (a host-side fetch hidden behind a busy GPU): it is scored as a healthy run."""


def score(args) -> int:
    rows, device = [], ""
    for base in map(os.path.abspath, args.score):
        device = json.load(open(os.path.join(base, "device.json"))).get("gpu", "")
        for line in open(os.path.join(base, "jobs.jsonl")):
            r = json.loads(line)
            r["card"] = args.card or device.split(",")[0].strip()
            r["path"] = os.path.join(base, "runs", r["run_id"])
            rows.append(r)
    for r in rows:
        if r["tool"] == "ranksight":
            rep = diagnose(r["path"]) if os.path.isdir(r["path"]) and r["rc"] == 0 else {"error": f"rc {r['rc']}"}
            r["verdict"] = verdict(rep)
            r["findings"] = [(f["rule"], f["severity"], f.get("cost_share")) for f in rep.get("findings", [])][:4]
            steps = rep.get("breakdown", {}).get("ranks", [{}])
            r["step_median_s"] = steps[0].get("step_median_s") if steps else None
    healthy = defaultdict(list)
    for r in rows:
        if r["tool"] == "ranksight" and r["fault"] == "none" and r.get("step_median_s"):
            healthy[(r["card"], r["job"])].append(r["step_median_s"])
    for r in rows:
        base_s = sorted(healthy.get((r["card"], r["job"]), []))
        base_s = base_s[len(base_s) // 2] if base_s else None
        slow = r.get("step_median_s") / base_s - 1 if base_s and r.get("step_median_s") else None
        r["slowdown"] = None if slow is None else round(slow, 3)
        if r["fault"] != "none" and slow is not None and abs(slow) < NO_FAULT_WITHIN:
            r["no_measurable_fault"] = True
        fault = "none" if r.get("no_measurable_fault") else r["fault"]
        r["expected"] = EXPECTED[fault]
        if r["tool"] == "ranksight":
            r["right"] = r["verdict"] == r["expected"]
        else:
            right = TRACEML_RIGHT.get(fault)
            r["verdict"] = r.get("traceml") or "error"
            r["right"] = None if right is None else r["verdict"] in right
    summary = summarise(rows)
    text = report_text(rows, summary)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "device": device, "rows": rows, "summary": summary}, f, indent=1)
    if args.text:
        with open(args.text, "w") as f:
            f.write(text + "\n")
    return 0


def _rate(n: int, of: int):
    return round(n / of, 3) if of else None


def summarise(rows: list) -> dict:
    out = {}
    for tool in ("ranksight", "traceml"):
        rs = [r for r in rows if r["tool"] == tool and r["right"] is not None]
        if not rs:
            continue
        by_framework = defaultdict(list)
        for r in rs:
            by_framework[(r["card"], r["job"])].append(r)
        groups = defaultdict(list)
        for r in rs:
            groups[(r["card"], r["job"], r["fault"])].append(r["verdict"])
        flips = [k for k, v in groups.items() if len(v) > 1 and len(set(v)) > 1]
        healthy = [r for r in rs if r["expected"] == "silent"]
        faulty = [r for r in rs if r["expected"] != "silent"]
        named = [r for r in rs if r["verdict"] not in ("silent", "error")]
        out[tool] = {
            "runs": len(rs),
            "errors": sum(r["verdict"] == "error" for r in rs),
            "right": _rate(sum(r["right"] for r in rs), len(rs)),
            "recall": _rate(sum(r["right"] for r in faulty), len(faulty)),
            "precision": _rate(sum(r["right"] for r in named), len(named)) if tool == "ranksight" else None,
            "healthy_false_alarm": _rate(sum(not r["right"] for r in healthy), len(healthy)),
            "flip_rate": _rate(len(flips), sum(len(v) > 1 for v in groups.values())),
            "flips": [list(k) for k in flips],
            "per_job": {f"{c}/{j}": _rate(sum(r["right"] for r in v), len(v)) for (c, j), v in by_framework.items()},
        }
    return out


def report_text(rows: list, summary: dict) -> str:
    lines = [f"{'card':<6} {'job':<20} {'fault':<11} {'tool':<9} r  {'slower':>6}  {'verdict':<32} ok  first findings"]
    for r in sorted(rows, key=lambda r: (r["job"], r["fault"], r["tool"], r["repeat"])):
        ok = "-" if r["right"] is None else ("yes" if r["right"] else "NO")
        first = "; ".join(f"{a}:{b[0]}:{c}" for a, b, c in r.get("findings", []))
        slower = "" if r.get("slowdown") is None else f"{r['slowdown']:+.0%}"
        lines.append(
            f"{r['card'][:6]:<6} {r['job']:<20} {r['fault']:<11} {r['tool']:<9} {r['repeat']}  {slower:>6}  "
            f"{str(r['verdict']):<32} {ok:<3} {first}"
        )
    lines.append("")
    for tool, s in summary.items():
        lines.append(f"{tool}: {json.dumps(s)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", action="store_true", help="run the jobs (on a GPU machine)")
    p.add_argument("--out", default="/tmp/foreign-corpus")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", nargs="*", default=None)
    p.add_argument("--faults", nargs="*", default=None)
    p.add_argument("--traceml", action="store_true", help="run TraceML on the same jobs")
    p.add_argument("--tools", nargs="*", choices=["ranksight", "traceml"], help="only these tools")
    p.add_argument("--traceml-repeats", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=540.0, help="start no job after this many seconds")
    p.add_argument("--job-timeout-s", type=float, default=150.0)
    p.add_argument("--score", metavar="DIR", nargs="+", help="diagnose and score --run folders together")
    p.add_argument("--card", default=None, help="the card's name in the scores (default: from device.json)")
    p.add_argument("--json")
    p.add_argument("--text")
    args = p.parse_args(argv)
    if args.score:
        return score(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
