"""The diagnosis on realistic training scripts: does ``ranksight diagnose`` name the planted fault?

Runs each (script, fault) of ``benchmarks/workloads/`` (a nanoGPT-style trainer, the PyTorch DDP tutorial's
trainer, a Hugging Face ``Trainer`` script and a Lightning script, each with the agent attached the way its
users would attach it) ``--repeats`` times as a 2-rank gloo job on CPU, each in its own run directory, then
``ranksight diagnose RUN --json``, and scores the verdict (the first finding of severity warning or critical;
"silent" when there is none) against the planted fault.

    python benchmarks/diagnosis_corpus.py --repeats 3 --json benchmarks/results/corpus_cpu_DATE.json
    python benchmarks/diagnosis_corpus.py --rediagnose OUT_DIR        # the kept runs, judged with today's rules
    python benchmarks/diagnosis_corpus.py --device cuda --gpus 1 --scripts gpt_trainer --check-fix

Printed: one row per run (verdict, severity, confidence, ranks, median step, and the fault's true share of the
step as the script timed it), then per fault: recall, the straggler's named rank, the healthy silent rate and
the flip rate between repeats; per verdict rule its precision. On GPUs (``--device cuda``): one rank per GPU
over NCCL, each script at its GPU size, with the faults only a GPU job has (``GPU_FAULTS``);
``benchmarks/gpu_corpus.sh`` runs it on a bare GPU machine. ``--check-fix`` reruns each planted fault with the
fix its finding names (the workloads' ``--fix``) and compares the cost the finding stated with the step time
the fix gave back (``fix_check``). ``--gpus 1 --straggler-rank 0 --no-diagnose`` times each fault on one GPU
(calibration); ``--dist-backend gloo`` runs 2 ranks on one GPU (a smoke test of the 2-rank paths only).

A run whose script crashes or times out is an "error" row with the tail of its output, never skipped. Each
job runs in its own session, killed as a whole when it ends, so no rank is left behind.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _harness import cli, commit, write_results  # noqa: E402

ALL_FAULTS = ("none", "input", "straggler", "metric-collectives", "exposed-allreduce", "unused-params", "graph-breaks")
GPU_FAULTS = ("pageable", "cpu-ops", "host-sync", "fragmentation", "launch-bound")
"""Faults only a GPU job has (on a CPU job the same code is no fault): run with ``--device cuda`` only."""
EXPECTED = {
    "none": "silent", "input": "input-bound", "straggler": "straggler", "metric-collectives": "blocking-collectives",
    "exposed-allreduce": "exposed-allreduce", "unused-params": "unused-parameter-scan", "graph-breaks": "graph-breaks",
    "pageable": "pageable-copies", "cpu-ops": "cpu-ops", "host-sync": "input-path-syncs",
    "fragmentation": "fragmentation", "launch-bound": "launch-bound", "unmeasured": "unexplained-host-time",
}  # fmt: skip
"""Each planted fault and the rule that names it first (``unmeasured``, an unmarked slow fetch: the framework
scripts' corpus, ``foreign_corpus.py``)."""
FIXABLE = ("input", "unused-params", "graph-breaks", *GPU_FAULTS)
"""Faults whose workloads take ``--fix`` (the fault with the fix its finding names applied): ``--check-fix``."""
STRAGGLER_RANK = 1  # every workload plants the extra work on rank 1


@dataclass(frozen=True)
class Script:
    name: str
    file: str
    launcher: str  # "torchrun" or "python" (the script starts its own ranks: Lightning)
    faults: tuple


SCRIPTS = {
    s.name: s
    for s in (
        # every GPU fault but pageable copies: nanoGPT's batches are tokens, nothing to pin
        Script("gpt_trainer", "gpt_trainer.py", "torchrun", (*ALL_FAULTS, *GPU_FAULTS[1:])),
        Script("ddp_tutorial", "ddp_tutorial.py", "torchrun", (*ALL_FAULTS, "pageable", "cpu-ops", "host-sync")),
        Script("hf_trainer", "hf_trainer.py", "torchrun", ALL_FAULTS),
        Script("lightning_trainer", "lightning_trainer.py", "python", ALL_FAULTS),
    )
}
DEVICE_FILE = "device.json"  # in --out: where the jobs ran, for --rediagnose's report
RANKS = 2  # ranks of a CPU job (gloo); a GPU job has one rank per GPU (--gpus)
WARMUP_STEPS = 5  # what the diagnosis leaves out; the truth share is taken over the same steps


@dataclass(frozen=True)
class Launch:
    """Where the jobs run: CPU ranks over gloo, or one rank per GPU over NCCL."""

    device: str = "cpu"  # cpu | cuda
    ranks: int = RANKS
    size: Optional[str] = None  # the scripts' size preset; None: theirs (gpu on cuda)
    dist_backend: Optional[str] = None  # None: nccl on cuda, gloo on cpu
    straggler_rank: Optional[int] = None  # None: the scripts' (rank 1)

    def script_args(self) -> list:
        out = [] if self.device == "cpu" else ["--device", self.device]
        out += ["--size", self.size] if self.size else []
        return out + (["--straggler-rank", str(self.straggler_rank)] if self.straggler_rank is not None else [])


@dataclass
class RunResult:
    script: str
    fault: str
    repeat: int
    run_id: str
    run_path: str
    status: str = "ok"  # ok | error (script crashed) | timeout | diagnose-error
    returncode: Optional[int] = None
    elapsed_s: float = 0.0
    verdict: str = ""  # rule id of the first warning/critical finding, "silent", or "error"
    severity: str = ""
    confidence: Optional[float] = None
    ranks: list = field(default_factory=list)
    expected: str = ""
    hit: Optional[bool] = None
    step_median_s: Optional[float] = None  # median over ranks of the breakdown's step median
    ranks_reporting: int = 0
    steps_per_rank: dict = field(default_factory=dict)  # breakdown's step count per rank (after warm-up)
    findings: list = field(default_factory=list)  # every finding: rule, severity, confidence, ranks
    breakdown: list = field(default_factory=list)
    truth: dict = field(default_factory=dict)  # the fault's share of the step, per rank, as the script timed it
    error_tail: str = ""
    ingest: Optional[dict] = None  # kept for older results.jsonl (an ingest run beside the job, retired)
    fixed: bool = False  # --check-fix: the fault with its finding's fix applied (not scored for recall)


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill every process of the job's own session (its ranks, Lightning's child, torchrun's agent)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM:
            time.sleep(2.0)


def _tail(path: str, n_chars: int = 3000) -> str:
    """The job's first Python traceback (a rank's, not the launcher's summary) and the log's last lines."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    first = text.find("Traceback (most recent call last)")
    if first < 0 or first >= len(text) - n_chars:
        return text[-n_chars:]
    line_start = text.rfind("\n", 0, first) + 1
    return text[line_start : line_start + n_chars // 2] + "\n[...]\n" + text[-n_chars // 2 :]


def launch_command(
    script: Script, fault: str, steps: int, run_dir: str, run_id: str, launch: Launch = Launch(), fixed: bool = False
) -> list:
    script_args = [os.path.join(WORKLOADS, script.file), "--fault", fault, "--steps", str(steps), "--run-dir", run_dir]
    # graph breaks are dynamo's, the same with any backend; inductor takes minutes a run on 2 CPU cores
    script_args += ["--run-id", run_id, "--compile-backend", "eager", *launch.script_args()]
    script_args += ["--fix"] if fixed else []
    if script.launcher == "torchrun":
        script_args += ["--dist-backend", launch.dist_backend] if launch.dist_backend else []
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        return [*torchrun, "--nproc-per-node", str(launch.ranks), *script_args]
    if launch.ranks != RANKS:  # Lightning starts its own ranks, 2 unless told
        script_args += ["--devices", str(launch.ranks)]
    return [sys.executable, *script_args]


def job_env(truth_dir: str, src: Optional[str] = None, device: str = "cpu") -> dict:
    """The job's environment: no agent settings of ours, one thread a CPU rank (GPU jobs keep the host's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    if src:  # a frozen copy of ranksight (see snapshot_source) ahead of the editable install
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if device == "cpu":  # 2 gloo ranks on a small host; GPU scripts leave it to torchrun, as users do
        env["OMP_NUM_THREADS"] = "1"
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["CORPUS_TRUTH_DIR"] = truth_dir
    return env


def run_job(cmd: list, env: dict, log_path: str, timeout: float, cwd: str = WORKLOADS) -> tuple:
    """Run one job to completion in its own session; (returncode or None on timeout, seconds)."""
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        io = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True, **io)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also on Ctrl-C: the job and whatever it left behind (a rank stuck in a collective)
            _kill_session(proc)
            if proc.poll() is None:
                proc.wait()
    return rc, time.monotonic() - t0


def diagnose_json(
    run_path: str, timeout: float = 120.0, src: Optional[str] = None, warmup: Optional[int] = None
) -> dict:
    """``ranksight diagnose RUN --json``, as a user runs it; raises RuntimeError with its stderr."""
    extra = [] if warmup is None else ["--warmup", str(warmup)]
    cmd = [sys.executable, "-m", "ranksight", "diagnose", run_path, "--json", *extra]
    cwd, env = os.path.dirname(os.path.abspath(run_path)), job_env("", src)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"diagnose exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


HYGIENE = {"unused-parameter-scan"}
"""Rules whose estimated cost sits below the warning floor: with nothing loud, their finding listed first
(at info, with its fix) is the verdict."""


def verdict_of(report: dict) -> Optional[dict]:
    findings = report.get("findings", [])
    loud = [f for f in findings if f.get("severity") in ("warning", "critical")]
    return loud[0] if loud else (findings[0] if findings and findings[0].get("rule") in HYGIENE else None)


def _read_json(path: str, default=None):
    """The JSON document in ``path``; ``default`` where it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def truth_summary(truth_dir: str, warmup: int = WARMUP_STEPS) -> dict:
    """Per rank: steps seen, median and mean step interval, and the planted code's share of the step time."""
    ranks = {}
    for name in sorted(os.listdir(truth_dir)) if os.path.isdir(truth_dir) else []:
        t = _read_json(os.path.join(truth_dir, name))
        if t is None:
            continue
        ends, fault_s = t.get("step_ends", []), t.get("fault_s", [])
        intervals = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :])]
        total = sum(intervals)
        ranks[str(t.get("rank"))] = {
            "steps": len(ends),
            "step_median_s": round(statistics.median(intervals), 5) if intervals else None,
            "step_mean_s": round(total / len(intervals), 6) if intervals else None,
            "fault_share": round(sum(fault_s[warmup + 1 :]) / total, 4) if total > 0 else None,
            "samples_per_step": t.get("samples_per_step"),
        }
    return ranks


def run_one(
    script_name: str, fault: str, repeat: int, steps: int, root: str, timeout: float = 300.0,
    src: Optional[str] = None, launch: Launch = Launch(), diagnose: bool = True, fixed: bool = False,
) -> RunResult:  # fmt: skip
    """One job and its diagnosis; never raises for a failing job (status and error_tail say what failed).

    ``src``: a folder holding a frozen ``ranksight`` package (``snapshot_source``) used by the job and
    the diagnosis instead of the installed one. ``diagnose=False``: the job and its truth only."""
    run_dir = os.path.join(root, "runs")
    run_id = f"{script_name}-{fault}{'-fixed' if fixed else ''}-r{repeat}-{uuid.uuid4().hex[:6]}"
    run_path, log_path = os.path.join(run_dir, run_id), os.path.join(root, "logs", run_id + ".log")
    truth_dir = os.path.join(root, "truth", run_id)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)
    res = RunResult(script_name, fault, repeat, run_id, run_path, expected=EXPECTED[fault], fixed=fixed)
    cmd = launch_command(SCRIPTS[script_name], fault, steps, run_dir, run_id, launch, fixed)
    res.returncode, elapsed = run_job(cmd, job_env(truth_dir, src, launch.device), log_path, timeout)
    res.elapsed_s, res.truth = round(elapsed, 1), truth_summary(truth_dir)
    if res.returncode != 0:
        res.status, res.verdict = "timeout" if res.returncode is None else "error", "error"
        res.error_tail = _tail(log_path)
        return res
    if not diagnose:
        res.verdict = "not-diagnosed"
        return res
    try:
        _fill_from_report(res, diagnose_json(run_path, src=src))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        res.status, res.verdict = "diagnose-error", "error"
        res.error_tail = f"{exc}\n--- job log ---\n{_tail(log_path)}"
    return res


FINDING_KEYS = ("rule", "severity", "confidence", "ranks", "cost_share", "speedup", "cost_basis", "explained_by")


def _fill_from_report(res: RunResult, report: dict) -> None:
    res.findings = [{k: f.get(k) for k in (*FINDING_KEYS, "evidence")} for f in report.get("findings", [])]
    res.breakdown = report.get("breakdown", {}).get("ranks", [])
    res.ranks_reporting = len(res.breakdown)
    res.steps_per_rank = {str(r.get("rank")): r.get("steps") for r in res.breakdown}
    medians = [r["step_median_s"] for r in res.breakdown if r.get("step_median_s") is not None]
    res.step_median_s = round(statistics.median(medians), 5) if medians else None
    v = verdict_of(report)
    if v is None:
        res.verdict, res.severity = "silent", ""
    else:
        res.verdict, res.severity = v["rule"], v["severity"]
        res.confidence, res.ranks = v.get("confidence"), list(v.get("ranks") or [])
    res.hit = None if res.fixed else res.verdict == res.expected


PACKAGES = ("ranksight", "agent", "collectors", "rules", "dashboard", "integrations")
"""pyproject's package-dir: ``ranksight`` from its folder, the others as its subpackages from theirs."""


def snapshot_source(dest: str) -> tuple:
    """Freeze the working tree's ranksight for a long corpus run while the tree keeps changing: its package
    folders copied now as one importable ``ranksight`` package under ``dest`` (put on PYTHONPATH, it wins over
    the editable install's finder). Returns (dest, description)."""
    pkg, ignore = os.path.join(dest, "ranksight"), shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(REPO, "ranksight"), pkg, ignore=ignore)
    for sub in PACKAGES[1:]:
        shutil.copytree(os.path.join(REPO, sub), os.path.join(pkg, sub), ignore=ignore)
    return dest, f"working tree at {time.strftime('%H:%M:%S')} on {commit() or ''}"


# ------------------------------------------------------------------------------------------- scoring
def _rate(n: int, of: int) -> Optional[float]:
    return round(n / of, 3) if of else None


def score(results: list) -> dict:
    results = [r for r in results if not r.fixed]  # --check-fix's reruns are judged by fix_check()
    ok = [r for r in results if r.status == "ok"]
    by_fault: dict = {}
    for fault in dict.fromkeys(r.fault for r in results):
        rs = [r for r in results if r.fault == fault]
        hits = [r for r in rs if r.status == "ok" and r.hit]
        errors = sum(r.status != "ok" for r in rs)
        by_fault[fault] = {"expected": EXPECTED[fault], "runs": len(rs), "errors": errors, "hits": len(hits)}
        by_fault[fault].update(recall=_rate(len(hits), len(rs) - errors), verdicts=dict(Counter(r.verdict for r in rs)))
        if fault == "straggler":
            by_fault[fault]["named_rank_1"] = sum(1 for r in hits if r.ranks == [STRAGGLER_RANK])
    precision: dict = {}
    for rule in dict.fromkeys(r.verdict for r in ok):
        rs = [r for r in ok if r.verdict == rule]
        right = sum(EXPECTED[r.fault] == rule for r in rs)
        precision[rule] = {"runs": len(rs), "right": right, "precision": _rate(right, len(rs))}
        precision[rule]["faults"] = sorted({r.fault for r in rs})
    groups: dict = {}
    for r in results:
        groups.setdefault((r.script, r.fault), []).append(r)
    judged = [[r.verdict for r in rs if r.status == "ok"] for rs in groups.values()]
    judged = [vs for vs in judged if len(vs) >= 2]
    flips = sum(len(set(vs)) > 1 for vs in judged)
    by_script: dict = {}
    for script in dict.fromkeys(r.script for r in results):
        hits = sum(bool(r.hit) for r in ok if r.script == script)
        runs = sum(r.script == script for r in results)
        by_script[script] = {"runs": runs, "hits": hits, "recall": _rate(hits, sum(r.script == script for r in ok))}
    healthy = [r for r in ok if r.fault == "none"]
    return {
        "by_script": by_script, "by_fault": by_fault, "precision": precision,
        "healthy_silent_rate": _rate(sum(r.verdict == "silent" for r in healthy), len(healthy)),
        "flip_rate": _rate(flips, len(judged)), "flipped_groups": flips, "groups_judged": len(judged),
        "verdicts_by_group": {f"{s}/{f}": [r.verdict for r in rs] for (s, f), rs in groups.items()},
        "overall_recall": _rate(sum(bool(r.hit) for r in ok), len(ok)), "runs": len(results),
        "errors": len(results) - len(ok),
    }  # fmt: skip


FIX_TOLERANCE = 0.05
"""How far (share of the step) the cost a finding stated may lie from the step time its fix gave back."""


def _per_sample_s(r: RunResult, clock: str = "truth") -> Optional[float]:
    """A run's step time per sample, over the samples a step trains on: the median over ranks of the
    script's own median step interval (``truth``) or mean one (``truth_mean``: its time after warm-up over
    its steps, the denominator of a cost share), or ranksight's median step period (``ranksight``)."""
    samples = [t.get("samples_per_step") for t in r.truth.values() if t.get("samples_per_step")]
    if clock == "ranksight":
        return r.step_median_s / (samples[0] if samples else 1) if r.step_median_s else None
    key = "step_mean_s" if clock == "truth_mean" else "step_median_s"
    values = [t[key] / (t.get("samples_per_step") or 1) for t in r.truth.values() if t.get(key)]
    return statistics.median(values) if values else None


def stated_cost(r: RunResult) -> Optional[dict]:
    """The finding of the rule that names the run's planted fault: its cost share (0 when it states no
    time cost: fragmentation's levels are memory), speedup, place among the findings, severity; None when
    that rule did not fire."""
    rule = EXPECTED[r.fault]
    for place, f in enumerate(r.findings, 1):
        if f.get("rule") == rule:
            cost = f.get("cost_share")
            return {"cost_share": cost if cost is not None else 0.0, "stated": cost is not None,
                    "speedup": f.get("speedup"), "place": place, "severity": f.get("severity"),
                    "first": r.verdict == rule}  # fmt: skip
    return None


def _median(values: list, digits: int) -> Optional[float]:
    return round(statistics.median(values), digits) if values else None


def fix_check(results: list) -> list:
    """Per (script, fault) with faulty and fixed runs: the cost the planted fault's finding stated against
    the step time the fix gave back (1 - fixed / faulty, per sample, medians over the runs), on the
    script's own clock and on ranksight's. Judged on the median step (what a typical step gives back); the
    mean step's gain (all the time after warm-up, the denominator of a cost share) is kept beside it: in a
    30-step run the kernel windows' fixed cost weighs more on the faster, fixed run."""
    rows = []
    for script, fault in dict.fromkeys((r.script, r.fault) for r in results if r.fixed):
        mine = [r for r in results if r.script == script and r.fault == fault and r.status == "ok"]
        faulty, fixed = [r for r in mine if not r.fixed], [r for r in mine if r.fixed]
        row = {"script": script, "fault": fault, "rule": EXPECTED[fault], "runs": len(faulty), "fixed_runs": len(fixed)}
        stated = [c for c in (stated_cost(r) for r in faulty) if c is not None]
        row.update(named=len(stated), named_first=sum(c["first"] for c in stated))
        row["costs"] = [round(c["cost_share"], 4) for c in stated]
        row["cost_share"] = _median(row["costs"], 4)
        row["cost_stated"] = any(c["stated"] for c in stated)
        row["speedup"] = round(1.0 / (1.0 - row["cost_share"]), 2) if row["cost_share"] is not None else None
        for clock in ("truth", "truth_mean", "ranksight"):
            before = [v for v in (_per_sample_s(r, clock) for r in faulty) if v]
            after = [v for v in (_per_sample_s(r, clock) for r in fixed) if v]
            gain = round(1.0 - statistics.median(after) / statistics.median(before), 4) if before and after else None
            row[f"gain_{clock}"] = gain
            if clock == "truth":
                row["step_before_s"], row["step_after_s"] = _median(before, 6), _median(after, 6)
        for suffix, gain in (("", row["gain_truth"]), ("_mean", row["gain_truth_mean"])):
            row["diff_pp" + suffix] = (
                round((row["cost_share"] - gain) * 100, 1) if gain is not None and stated else None
            )
        row["within"] = row["diff_pp"] is not None and abs(row["diff_pp"]) <= FIX_TOLERANCE * 100
        row["fixed_verdicts"] = [r.verdict for r in fixed]
        row["fixed_still_named"] = sum(
            any(f.get("rule") == EXPECTED[fault] and f.get("severity") in ("warning", "critical") for f in r.findings)
            for r in fixed
        )
        rows.append(row)
    return rows


def _fmt(v, spec: str = "") -> str:
    return "-" if v is None or v == "" else format(v, spec)


def fix_check_text(rows: list) -> list:
    """The fix check as table lines (empty without fixed runs)."""
    if not rows:
        return []
    cols = ("script", "fault", "named first", "cost stated", "speedup", "step/sample before", "after", "gain")
    cols += ("gain (mean step)", "gain (ranksight clock)", "stated - gain", "within 5 pp", "after the fix")
    out = []
    for row in rows:
        cost = _fmt(row["cost_share"], ".1%")
        cost += "" if row["cost_stated"] or row["cost_share"] is None else " (none stated)"
        ms = [_fmt(row[k] * 1000 if row[k] else None, ".3f") for k in ("step_before_s", "step_after_s")]
        gains = [_fmt(row.get(k), ".1%") for k in ("gain_truth", "gain_truth_mean", "gain_ranksight")]
        fixed = f"{', '.join(row['fixed_verdicts'])}; still named {row['fixed_still_named']}/{row['fixed_runs']}"
        diff = "-" if row["diff_pp"] is None else f"{row['diff_pp']:+.1f} pp"
        out.append((row["script"], row["fault"], f"{row['named_first']}/{row['runs']}", cost,
                    _fmt(row["speedup"], ".2f"), *ms, *gains, diff,
                    "yes" if row["within"] else "no", fixed))  # fmt: skip
    lines = [
        "fix check: the cost each planted fault's finding stated (median of its runs) against the step time "
        "its fix gave back (1 - fixed / faulty per sample, the script's own clock, median step; its mean step "
        "after warm-up beside it; ms per sample)"
    ]
    return lines + _table(cols, out)


def report_text(results: list, summary: dict, header: str = "") -> str:
    lines = [header] if header else []
    cols = ("script", "fault", "rep", "verdict", "severity", "conf", "ranks", "step ms", "fault share", "status", "s")
    rows = []
    for r in results:
        verdict = r.verdict + ("" if r.hit or r.status != "ok" or r.fixed else " (miss)")
        shares = " ".join(f"r{k}:{t['fault_share']:.0%}" for k, t in sorted(r.truth.items()) if t.get("fault_share"))
        rows.append((r.script, r.fault + (" (fixed)" if r.fixed else ""), str(r.repeat), verdict, _fmt(r.severity),
                     _fmt(r.confidence, ".2f"), ",".join(map(str, r.ranks)) or "-",
                     _fmt(r.step_median_s * 1000 if r.step_median_s else None, ".1f"), shares or "-", r.status,
                     f"{r.elapsed_s:.0f}"))  # fmt: skip
    lines += [*_table(cols, rows), ""]
    fixes = fix_check_text(fix_check(results))
    lines += [*fixes, ""] if fixes else []
    everything, results = results, [r for r in results if not r.fixed]
    rows = []
    for fault, row in summary["by_fault"].items():
        verdicts = ", ".join(f"{k} x{v}" for k, v in sorted(row["verdicts"].items(), key=lambda kv: -kv[1]))
        note = f"rank 1 named in {row['named_rank_1']}/{row['hits']}" if fault == "straggler" else ""
        recall = f"{row['hits']}/{row['runs'] - row['errors']}"
        recall += f" ({row['recall']:.0%})" if row["recall"] is not None else ""
        rows.append((fault, row["expected"], str(row["runs"]), str(row["errors"]), recall, verdicts, note))
    lines += [*_table(("fault", "expected", "runs", "errors", "recall", "verdicts", "note"), rows), ""]
    faults = list(dict.fromkeys(r.fault for r in results))
    rows = []
    for script, row in summary["by_script"].items():
        cells = []
        for fault in faults:
            rs = [r for r in results if r.script == script and r.fault == fault]
            errs = sum(r.status != "ok" for r in rs)
            cells.append(f"{sum(bool(r.hit) for r in rs)}/{len(rs)}" + (f" ({errs} err)" if errs else "") if rs else "")
        rows.append((script, *cells, f"{row['hits']}/{row['runs']}"))
    lines += [*_table(("hits / runs", *faults, "all"), rows), ""]
    rows = [
        (rule, str(p["runs"]), f"{p['right']}/{p['runs']} ({p['precision']:.0%})", ", ".join(p["faults"]))
        for rule, p in sorted(summary["precision"].items())
    ]
    lines += [*_table(("verdict rule", "runs", "precision", "from faults"), rows), ""]
    lines.append(
        f"healthy silent rate: {_fmt(summary['healthy_silent_rate'], '.0%')}   "
        f"flip rate: {_fmt(summary['flip_rate'], '.0%')} ({summary['flipped_groups']}/{summary['groups_judged']} "
        f"(script, fault) groups changed verdict between repeats)   "
        f"overall recall: {summary['overall_recall']}   runs: {summary['runs']}, errors: {summary['errors']}"
    )
    for r in (r for r in everything if r.status != "ok"):
        lines += ["", f"--- {r.status}: {r.script} / {r.fault} / repeat {r.repeat} (exit {r.returncode}) ---"]
        lines.append(r.error_tail.rstrip()[-3000:])
    return "\n".join(lines)


def _table(cols: tuple, rows: list) -> list:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    return out + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]


def rediagnose(args) -> int:
    """Score the kept runs of an earlier ``--out`` again with today's rules (installed or --snapshot)."""
    root = args.rediagnose
    with open(os.path.join(root, "results.jsonl")) as fh:
        old = [RunResult(**json.loads(line)) for line in fh if line.strip()]
    src, source = ranksight_source(args.snapshot, None)
    device_record = _read_json(os.path.join(root, DEVICE_FILE), {})  # where the jobs ran (CPU before GPU runs)
    results = []
    for r in old:
        truth_dir = os.path.join(root, "truth", r.run_id)
        if os.path.isdir(truth_dir):  # read again: later figures (the mean step) from the script's own record
            r.truth = truth_summary(truth_dir) or r.truth
        if r.status in ("ok", "diagnose-error"):
            fresh = RunResult(r.script, r.fault, r.repeat, r.run_id, r.run_path, expected=EXPECTED[r.fault])
            fresh.returncode, fresh.elapsed_s, fresh.truth, fresh.fixed = r.returncode, r.elapsed_s, r.truth, r.fixed
            kept = os.path.join(root, "runs", os.path.basename(r.run_path))
            if not os.path.isdir(r.run_path) and os.path.isdir(kept):  # unpacked elsewhere (runs.tgz)
                fresh.run_path = kept
            try:
                _fill_from_report(fresh, diagnose_json(fresh.run_path, src=src))
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                fresh.status, fresh.verdict, fresh.error_tail = "diagnose-error", "error", str(exc)
            r = fresh
        results.append(r)
    where = f", jobs ran on {device_record['where']}" if device_record.get("where") else ""
    header = f"ranksight diagnosis corpus, re-diagnosed {time.strftime('%Y-%m-%d %H:%M:%S')} from {root}{where}\n"
    meta = {"rediagnosed": root, "device": device_record, "ranksight_source": source, "commit": commit() or ""}
    write_reports(args, results, score(results), header + f"ranksight: {source}", meta)
    return 0


def ranksight_source(snapshot: str, dest: Optional[str]) -> tuple:
    """(folder to put ahead on PYTHONPATH or None, words): the installed package, or ``--snapshot``'s copy in
    ``dest`` (default: a new temporary folder)."""
    if snapshot == "none":
        return None, f"installed package (live working tree {REPO})"
    return snapshot_source(dest or tempfile.mkdtemp(prefix="ranksight-src-"))


def write_reports(args, results: list, summary: dict, header: str, meta: dict, left_out: Optional[list] = None) -> None:
    """The report printed and written to ``--text``; ``meta``, then every run, the scores and the fix check, to
    ``--json``."""
    text = report_text(results, summary, header)
    print(text)
    if args.text:
        with open(args.text, "w") as fh:
            fh.write(text + "\n")
    if args.json:
        doc = {**meta, "expected": EXPECTED, "summary": summary, "fix_check": fix_check(results)}
        if left_out is not None:
            doc["left_out"] = [list(job) for job in left_out]
        write_results(args.json, {**doc, "runs": [asdict(r) for r in results]})


def describe_device(launch: Launch) -> tuple:
    """(header words, JSON record) of where the jobs ran."""
    if launch.device == "cpu":
        return f"{launch.ranks} gloo ranks", {"device": "cpu", "ranks": launch.ranks, "backend": "gloo"}
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        names = [n.strip() for n in subprocess.run(query, capture_output=True, text=True).stdout.splitlines()]
    except OSError:  # no nvidia-smi: the header says no GPU found
        names = []
    backend = launch.dist_backend or "nccl"
    shared = " (ranks share GPUs: smoke test, timings mean nothing)" if launch.ranks > max(len(names), 1) else ""
    distinct = ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names)) or "no GPU found"
    record = {"device": "cuda", "ranks": launch.ranks, "backend": backend, "gpus": names, "size": launch.size}
    return f"{launch.ranks} {backend} ranks on {distinct}{shared}", record


def build_plan(
    scripts: list, faults: list, repeats: int, repeats_of: tuple = (), check_fix: Optional[list] = None,
    fix_repeats: int = 1,
) -> list:  # fmt: skip
    """(script, fault, repeat, fixed) in run order: every repeat of every (script, fault) the script plants,
    then (``check_fix`` not None) the fixed variants: of every fixable fault planned, or of those named
    (``fault`` or ``script/fault``)."""
    counts = {}
    for item in repeats_of:
        fault, _, n = item.partition("=")
        if fault not in EXPECTED or not n.isdigit():
            raise SystemExit(f"--repeats-of takes FAULT=N with a known fault, got {item!r}")
        counts[fault] = int(n)
    plan = [
        (s, f, rep, False)
        for rep in range(max([repeats, *counts.values()]))
        for s in scripts
        for f in faults
        if f in SCRIPTS[s].faults and rep < counts.get(f, repeats)
    ]
    if check_fix is not None:
        for item in check_fix:
            if item.split("/")[-1] not in FIXABLE:
                raise SystemExit(f"--check-fix: no fixed variant of {item!r} (fixable: {', '.join(FIXABLE)})")
        pairs = [
            (s, f)
            for s, f in dict.fromkeys((s, f) for s, f, _, _ in plan)
            if f in FIXABLE and (not check_fix or f in check_fix or f"{s}/{f}" in check_fix)
        ]
        plan += [(s, f, rep, True) for rep in range(fix_repeats) for s, f in pairs]
    return plan


def main(argv: Optional[list] = None) -> int:
    parser = cli(__doc__)
    add = parser.add_argument
    add("--scripts", nargs="+", default=list(SCRIPTS), choices=sorted(SCRIPTS))
    faults = f"default: {' '.join(ALL_FAULTS)}; on --device cuda also {' '.join(GPU_FAULTS)}"
    add("--faults", nargs="+", default=None, choices=(*ALL_FAULTS, *GPU_FAULTS), help=faults)
    add("--repeats", type=int, default=3)
    add("--steps", type=int, default=30, help="optimizer steps per run (5 are warm-up)")
    add("--timeout", type=float, default=300.0, help="seconds per job before it is killed")
    add("--out", default=None, help="keep run dirs, logs and truth here (default: a temp dir, removed)")
    add("--text", default=None, help="write the printed report here too")
    snapshot = "tree: run jobs and diagnosis on a copy of ranksight as the working tree is at start (default: the "
    add("--snapshot", choices=("none", "tree"), default="none", help=snapshot + "installed package, live)")
    add("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one rank per GPU, NCCL")
    add("--gpus", type=int, default=2, help="ranks (GPUs) of a --device cuda job")
    add("--size", choices=("cpu", "gpu"), default=None, help="the scripts' size preset (default: gpu on cuda)")
    add("--dist-backend", default=None, help="override the scripts' backend (gloo on cuda: a smoke test only)")
    add("--straggler-rank", type=int, default=None, help="rank the straggler slows (0 to time it with --gpus 1)")
    add("--no-diagnose", action="store_true", help="run the jobs and keep their truth, no verdict (calibration)")
    add("--repeats-of", nargs="+", default=[], metavar="FAULT=N", help="this many repeats of these faults")
    check_fix = f"after the runs, run each (script, fault) of {', '.join(FIXABLE)} again with the fix its finding "
    check_fix += "names (the workloads' --fix) and compare the cost the finding stated with the step time gained; "
    add("--check-fix", nargs="*", default=None, metavar="[SCRIPT/]FAULT", help=check_fix + "with arguments, only those")
    add("--fix-repeats", type=int, default=1, help="runs of each fixed variant (--check-fix)")
    budget = "start no job likely to end past this many seconds (the longest job so far is the guess)"
    add("--budget-s", type=float, default=None, help=budget)
    add("--rediagnose", default=None, metavar="OUT_DIR", help="run no job: judge again the runs OUT_DIR kept")
    args = parser.parse_args(argv)
    if args.rediagnose:
        return rediagnose(args)
    if args.faults is None:
        args.faults = list(ALL_FAULTS) + (list(GPU_FAULTS) if args.device == "cuda" else [])
    if args.device == "cpu" and set(args.faults) & set(GPU_FAULTS):
        skipped = [f for f in args.faults if f in GPU_FAULTS]
        print(f"GPU faults left out of a CPU corpus (no fault on a CPU job): {' '.join(skipped)}", flush=True)
        args.faults = [f for f in args.faults if f not in GPU_FAULTS]

    ranks = RANKS if args.device == "cpu" else args.gpus
    launch = Launch(args.device, ranks, args.size, args.dist_backend, args.straggler_rank)
    where, device_record = describe_device(launch)
    root = args.out or tempfile.mkdtemp(prefix="ranksight-corpus-")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, DEVICE_FILE), "w") as fh:
        json.dump({**device_record, "where": where}, fh)
    plan = build_plan(args.scripts, args.faults, args.repeats, args.repeats_of, args.check_fix, args.fix_repeats)
    started, head = time.strftime("%Y-%m-%d %H:%M:%S"), commit() or ""  # at the start: others may commit meanwhile
    src, source = ranksight_source(args.snapshot, os.path.join(root, "src"))
    print(f"ranksight: {source}\n{len(plan)} runs, {args.steps} steps each, under {root}", flush=True)
    results, left_out = [], []
    manifest = os.path.join(root, "results.jsonl")  # one line per finished run, for --rediagnose
    t_start, longest = time.monotonic(), 0.0
    try:
        for i, (s, f, rep, fixed) in enumerate(plan, 1):
            if args.budget_s and time.monotonic() - t_start + longest > args.budget_s:
                left_out = plan[i - 1 :]
                print(f"budget of {args.budget_s:g} s: {len(left_out)} job(s) left out", flush=True)
                break
            t_job = time.monotonic()
            r = run_one(s, f, rep, args.steps, root, args.timeout, src, launch, not args.no_diagnose, fixed)
            results.append(r)
            longest = max(longest, time.monotonic() - t_job)
            with open(manifest, "a") as fh:
                fh.write(json.dumps(asdict(r), default=str) + "\n")
            extra = "" if r.status == "ok" else "  " + (r.error_tail.strip().splitlines() or [""])[-1]
            print(f"[{i}/{len(plan)}] {s} / {f}{' (fixed)' if fixed else ''} / {rep}: {r.verdict} {r.severity} "
                  f"({r.status}, {r.elapsed_s:.0f} s){extra}", flush=True)  # fmt: skip
    finally:
        header = (
            f"ranksight diagnosis corpus, {started}, commit {head[:12]}, {platform.node()}, {os.cpu_count()} CPUs, "
            f"{where}, {args.steps} steps, repeats {args.repeats}\nranksight: {source}"
        )
        if left_out:
            header += "\nleft out by --budget-s: " + ", ".join(
                f"{s}/{f}{' (fixed)' if fixed else ''}/{rep}" for s, f, rep, fixed in left_out
            )
        script = os.path.relpath(sys.argv[0], REPO) if sys.argv[0] else "diagnosis_corpus.py"
        meta = {"command": " ".join([script, *(argv if argv is not None else sys.argv[1:])]), "started": started}
        meta.update(commit=head, ranksight_source=source, device=device_record)
        meta["host"] = {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
        meta["settings"] = {**vars(args), "compile_backend": "eager"}
        print()
        write_reports(args, results, score(results), header, meta, left_out)
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
