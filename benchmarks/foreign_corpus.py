"""The verdict on code we did not write: framework scripts written the way their users write them, on one GPU.

``benchmarks/foreign/`` holds them (``JOBS``): a Hugging Face Trainer causal LM, a Lightning image classifier in
both ``training_step`` styles, an Accelerate ResNet-50 accumulating gradients, a torchvision-style loop, a
nanoGPT-style loop and a plain MLP loop, each attached the way its users would attach ranksight, run healthy and
with the faults its kind of script meets, ``--repeats`` times. TraceML (``traceml run``: its own Hugging Face
and Lightning auto-attach, ``trace_step`` in plain loops) runs the same jobs in the same call as the peer.

    python benchmarks/foreign_corpus.py --run --repeats 3 --traceml --out DIR    # on the GPU machine
    python benchmarks/foreign_corpus.py --score DIR [DIR ...] --json OUT --text OUT.txt   # with these rules

``--run`` (``benchmarks/foreign_corpus.sh`` on a bare GPU machine) writes ``runs/`` (ranksight's run folders),
``traceml/``, ``logs/``, ``jobs.jsonl`` (a line a job: job, fault, tool, repeat, run id, exit code, seconds,
TraceML's primary diagnosis) and ``device.json``. ``--score`` diagnoses every run folder again with the
installed ranksight, so a rule change is judged on the same measurements, and scores the verdicts per card and
script with ``diagnosis_corpus.py``'s own verdict and ``score`` (recall per fault, precision per rule, healthy
silent rate, flip rate between repeats), adding the false-alarm rate, the recall over planted faults and the
precision over named verdicts; TraceML's primary diagnosis is scored where it has a label for the fault.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FOREIGN = os.path.join(HERE, "foreign")
sys.path.insert(0, HERE)

import diagnosis_corpus as dc  # noqa: E402
from _harness import cli, device_env, write_results  # noqa: E402

JOBS = [
    ("hf_clm", "hf_clm.py", [], ["none", "input"]),
    ("lightning_submodule", "lightning_vision.py", ["--style", "submodule"], ["none", "input", "pageable"]),
    ("lightning_self", "lightning_vision.py", ["--style", "self"], ["none", "pageable"]),
    ("accelerate_resnet", "accelerate_resnet.py", [], ["none", "input"]),
    ("vision_loop", "vision_loop.py", [], ["none", "input", "pageable"]),
    ("nanogpt_loop", "nanogpt_loop.py", [], ["none", "host-sync", "unmeasured"]),
    ("mlp_plain", "mlp_plain.py", [], ["none", "cpu-ops"]),
]
"""(job, script, its options, the faults it is run with); each fault's rule is ``diagnosis_corpus.EXPECTED``'s."""
TRACEML_RIGHT = {
    "none": {"COMPUTE_BOUND", "NO_CLEAR_PERFORMANCE_BOTTLENECK"},
    "input": {"INPUT_BOUND", "INPUT_STRAGGLER"},
    "pageable": {"H2D_BOUND", "H2D_STRAGGLER"},
    "unmeasured": {"RESIDUAL_HEAVY"},
}
"""TraceML's primary diagnoses that name each fault; a fault it has no label for is not scored for it."""
NO_FAULT_WITHIN = 0.05
"""A planted fault whose median step is within 5 % of the same job's healthy median on the same card costs
nothing there (a host-side fetch hidden behind a busy GPU): it is scored as a healthy run."""


def run(args) -> int:
    device_env()  # NVLink multicast off, inherited by every job
    out = os.path.abspath(args.out)
    for sub in ("runs", "logs", "traceml"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    where, device = dc.describe_device(dc.Launch("cuda", 1))
    with open(os.path.join(out, "device.json"), "w") as f:
        json.dump({**device, "where": where, "gpu": ", ".join(device["gpus"])}, f)
    tools = args.tools or ["ranksight", *(["traceml"] if args.traceml else [])]
    plan = [
        (rep, job, script, extra, fault, tool)
        for rep in range(args.repeats)
        for job, script, extra, faults in JOBS
        if not args.jobs or job in args.jobs
        for fault in faults
        if not args.faults or fault in args.faults
        for tool in tools
        if tool == "ranksight" or rep < args.traceml_repeats
    ]
    t_end = time.monotonic() + args.budget_s
    for rep, job, script, extra, fault, tool in plan:
        if time.monotonic() > t_end:
            print(f"budget spent: {job} {fault} {tool} r{rep} not started", flush=True)
            continue
        run_id, logs = f"{job}.{fault}.r{rep}.{os.getpid()}", os.path.join(out, "traceml")
        env = dc.job_env("", device="cuda")
        env.update(RANKSIGHT_RUN_DIR=os.path.join(out, "runs"), RANKSIGHT_RUN_ID=run_id)
        cmd = [os.path.join(FOREIGN, script), "--tool", tool, "--fault", fault, *extra]
        if tool == "traceml":  # started by TraceML's launcher, as its users start a script
            logs = os.path.join(logs, run_id)
            cmd = ["-m", "traceml_ai.launcher.cli", "run", cmd[0], "--mode", "summary", "--logs-dir", logs,
                   "--run-name", "t", "--args", *cmd[1:]]  # fmt: skip
        log = os.path.join(out, "logs", f"{run_id}.{tool}.log")
        rc, seconds = dc.run_job([sys.executable, *cmd], env, log, args.job_timeout_s, cwd=out)
        row = {"job": job, "fault": fault, "tool": tool, "repeat": rep, "run_id": run_id,
               "rc": 124 if rc is None else rc, "seconds": round(seconds, 1)}  # fmt: skip
        if tool == "traceml":
            found = glob.glob(os.path.join(logs, "**", "final_summary.json"), recursive=True)
            summary = dc._read_json(found[0], {}) if found else {}
            row["traceml"] = (summary.get("primary_diagnosis") or {}).get("kind")
        with open(os.path.join(out, "jobs.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


def judge(r: dict) -> None:
    """Diagnose one ranksight run again: its verdict as the diagnosis corpus takes it, the first four findings
    (rule, severity, cost share) and the median step."""
    try:
        if r["rc"] != 0 or not os.path.isdir(r["path"]):
            raise RuntimeError(f"exit {r['rc']}")
        report = dc.diagnose_json(r["path"], timeout=300)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        r.update(verdict="error", error=str(exc)[-500:], findings=[], step_median_s=None)
        return
    first = dc.verdict_of(report)
    r["verdict"] = first["rule"] if first else "silent"
    r["findings"] = [(f["rule"], f["severity"], f.get("cost_share")) for f in report.get("findings", [])][:4]
    r["step_median_s"] = (report.get("breakdown", {}).get("ranks") or [{}])[0].get("step_median_s")


def score(args) -> int:
    rows = []
    for base in map(os.path.abspath, args.score):
        gpu = dc._read_json(os.path.join(base, "device.json"), {}).get("gpu", "").split(",")[0]
        card = args.card or next((w for w in gpu.split() if any(c.isdigit() for c in w)), gpu)  # "H100"
        with open(os.path.join(base, "jobs.jsonl")) as f:
            for r in map(json.loads, filter(str.strip, f)):
                rows.append({**r, "card": card, "path": os.path.join(base, "runs", r["run_id"])})
    for r in rows:
        if r["tool"] == "ranksight":
            judge(r)
    healthy: dict = {}
    for r in rows:
        if r["tool"] == "ranksight" and r["fault"] == "none" and r.get("step_median_s"):
            healthy.setdefault((r["card"], r["job"]), []).append(r["step_median_s"])
    for r in rows:
        base_s, step_s = healthy.get((r["card"], r["job"])), r.get("step_median_s")
        slow = step_s / statistics.median_high(base_s) - 1 if base_s and step_s else None
        r["slowdown"] = None if slow is None else round(slow, 3)
        r["scored_as"] = "none" if slow is not None and abs(slow) < NO_FAULT_WITHIN else r["fault"]
        r["expected"] = dc.EXPECTED[r["scored_as"]]
        if r["tool"] == "ranksight":
            r["right"] = r["verdict"] == r["expected"]
        else:
            r["verdict"], right = r.get("traceml") or "error", TRACEML_RIGHT.get(r["scored_as"])
            r["right"] = None if right is None else r["verdict"] in right
    summary = summarise(rows)
    text = report_text(rows, summary)
    print(text)
    if args.text:
        with open(args.text, "w") as f:
            f.write(text + "\n")
    if args.json:
        write_results(args.json, {"scored": args.score, "summary": summary, "rows": rows})
    return 0


def summarise(rows: list) -> dict:
    """ranksight's verdicts scored as the diagnosis corpus scores its own (per card/script), with the false-alarm
    rate, the recall over planted faults and the precision over named verdicts; TraceML's where it is scored."""
    mine = [r for r in rows if r["tool"] == "ranksight"]
    s = dc.score([dc.RunResult(f"{r['card']}/{r['job']}", r["scored_as"], r["repeat"], r["run_id"], r["path"],
                               status="error" if r["verdict"] == "error" else "ok", verdict=r["verdict"],
                               hit=r["right"]) for r in mine])  # fmt: skip
    named = [p for rule, p in s["precision"].items() if rule != "silent"]
    faulty = [f for fault, f in s["by_fault"].items() if fault != "none"]
    s["healthy_false_alarm"] = None if s["healthy_silent_rate"] is None else round(1 - s["healthy_silent_rate"], 3)
    s["fault_recall"] = dc._rate(sum(f["hits"] for f in faulty), sum(f["runs"] - f["errors"] for f in faulty))
    s["named_precision"] = dc._rate(sum(p["right"] for p in named), sum(p["runs"] for p in named))
    peer, by_script = [r for r in rows if r["tool"] == "traceml" and r["right"] is not None], {}
    for r in peer:
        by_script.setdefault(f"{r['card']}/{r['job']}", []).append(r["right"])
    healthy = [r["right"] for r in peer if r["scored_as"] == "none"]
    faulted = [r["right"] for r in peer if r["scored_as"] != "none"]
    traceml = {"runs": len(peer), "right": sum(r["right"] for r in peer),
               "fault_recall": dc._rate(sum(faulted), len(faulted)),
               "healthy_false_alarm": dc._rate(len(healthy) - sum(healthy), len(healthy)),
               "by_script": {k: f"{sum(v)}/{len(v)}" for k, v in by_script.items()}}  # fmt: skip
    return {"ranksight": s, "traceml": traceml}


def report_text(rows: list, summary: dict) -> str:
    """A row a run (its slowdown against the healthy median, verdict, first findings), then the scores."""
    table = []
    for r in sorted(rows, key=lambda r: (r["card"], r["job"], r["fault"], r["tool"], r["repeat"])):
        slower = "-" if r.get("slowdown") is None else f"{r['slowdown']:+.0%}"
        right = "-" if r["right"] is None else ("yes" if r["right"] else "NO")
        first = "; ".join(f"{rule}:{severity[0]}:{cost}" for rule, severity, cost in r.get("findings", []))
        table.append((f"{r['card']}/{r['job']}", r["fault"], r["scored_as"], r["tool"], str(r["repeat"]), slower,
                      r["verdict"], right, first))  # fmt: skip
    cols = ("card/script", "fault", "scored as", "tool", "rep", "slower", "verdict", "right", "first findings")
    s = summary["ranksight"]
    return "\n".join([*dc._table(cols, table), "",
        f"ranksight: {s['runs']} runs, {s['errors']} errors; healthy runs silent {s['healthy_silent_rate']} "
        f"(false-alarm rate {s['healthy_false_alarm']}); planted faults named first {s['fault_recall']}; named "
        f"verdicts right {s['named_precision']}; flip rate {s['flip_rate']} ({s['flipped_groups']} of "
        f"{s['groups_judged']} repeated groups changed verdict)",
        "  per script: " + ", ".join(f"{k} {v['hits']}/{v['runs']}" for k, v in s["by_script"].items()),
        "  per fault: " + ", ".join(f"{k} {v['hits']}/{v['runs']}" for k, v in s["by_fault"].items()),
        f"traceml: {json.dumps(summary['traceml'])}"])  # fmt: skip


def main(argv=None) -> int:
    p = cli(__doc__)
    p.add_argument("--run", action="store_true", help="run the jobs (on a GPU machine)")
    p.add_argument("--out", default="/tmp/foreign-corpus", help="--run: the folder its runs and jobs.jsonl go to")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", nargs="*", default=None, choices=[j[0] for j in JOBS], help="only these jobs")
    p.add_argument("--faults", nargs="*", default=None, help="only these faults")
    p.add_argument("--traceml", action="store_true", help="run TraceML on the same jobs")
    p.add_argument("--tools", nargs="*", choices=["ranksight", "traceml"], help="only these tools")
    p.add_argument("--traceml-repeats", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=540.0, help="start no job after this many seconds")
    p.add_argument("--job-timeout-s", type=float, default=150.0)
    p.add_argument("--score", metavar="DIR", nargs="+", help="diagnose and score --run folders together")
    p.add_argument("--card", default=None, help="the card's name in the scores (default: from device.json)")
    p.add_argument("--text", help="--score: the printed report")
    args = p.parse_args(argv)
    if not args.run and not args.score:
        p.error("--run or --score DIR")
    return score(args) if args.score else run(args)


if __name__ == "__main__":
    sys.exit(main())
