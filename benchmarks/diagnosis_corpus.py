"""The diagnosis on realistic training scripts: does ``ranksight diagnose`` name the planted fault?

Runs each (script, fault) of ``benchmarks/workloads/`` — a nanoGPT-style trainer, the PyTorch DDP
tutorial's trainer, a Hugging Face ``Trainer`` script and a Lightning script, each with the agent
attached the way its users would attach it — ``--repeats`` times as a 2-rank gloo job on CPU, each in
its own run directory, then ``ranksight diagnose RUN --json``, and scores the verdict (the first
finding of severity warning or critical; "silent" when there is none) against the planted fault.

    python benchmarks/diagnosis_corpus.py --repeats 3 --json benchmarks/results/corpus_cpu_DATE.json
    python benchmarks/diagnosis_corpus.py --scripts ddp_tutorial --faults none input --repeats 1

Printed: one row per run (script, fault, repeat, verdict rule, severity, confidence, ranks, median
step, and the fault's true share of the step as the script measured it itself), then per fault
class: runs, errors, recall (the expected rule named first), the straggler's named rank, the healthy
silent rate, and the flip rate (share of (script, fault) groups whose verdict differs between
repeats); and per verdict rule its precision (of the runs whose verdict was rule R, how many had the
fault R stands for).

On GPUs (``--device cuda``): one rank per GPU over NCCL (``torchrun --nproc-per-node --gpus``,
Lightning ``devices=--gpus``), each script at its GPU size (a healthy step of ~10-30 ms of GPU compute
on an H200, not kernel launches; see each script's docstring) and without ``OMP_NUM_THREADS=1``:

    python benchmarks/diagnosis_corpus.py --device cuda --repeats 3 --json corpus_gpu.json   # 2 GPUs
    bash benchmarks/gpu_corpus.sh                          # the same on a bare GPU machine, into $OUT

``--gpus 1 --straggler-rank 0 --no-diagnose`` times each fault on one GPU (calibration: the fault's
share of the step, no verdict); ``--dist-backend gloo`` runs 2 ranks on one GPU (a smoke test of the
2-rank code paths only: the timings mean nothing, Lightning cannot do it).

On one GPU the single-GPU faults too (``GPU_FAULTS``: pageable copies, ops left on the CPU, host syncs,
fragmentation under memory pressure, launch-bound kernels), and ``--check-fix`` reruns each planted fault
with the fix its finding names (the workloads' ``--fix``) and compares the cost the finding stated with the
step time the fix gave back (``fix_check``; ``benchmarks/fix_check.py`` does it on saved results):

    python benchmarks/diagnosis_corpus.py --device cuda --gpus 1 --scripts gpt_trainer --repeats 3 --check-fix

``--repeats-of FAULT=N`` gives some faults more repeats; ``--budget-s`` starts no job past a time budget
(the reports are written either way).

A run whose script crashes or times out is an "error" row with the tail of its output, never
skipped. Each job runs in its own session and the whole session is killed when it ends, so no rank
is left behind.
"""

from __future__ import annotations

import argparse
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

from _harness import commit, write_results  # noqa: E402

ALL_FAULTS = ("none", "input", "straggler", "metric-collectives", "exposed-allreduce", "unused-params", "graph-breaks")
GPU_FAULTS = ("pageable", "cpu-ops", "host-sync", "fragmentation", "launch-bound")
"""Faults only a GPU job has (on a CPU job the same code is no fault): run with ``--device cuda`` only."""
EXPECTED = {
    "none": "silent",
    "input": "input-bound",
    "straggler": "straggler",
    "metric-collectives": "blocking-collectives",
    "exposed-allreduce": "exposed-allreduce",
    "unused-params": "unused-parameter-scan",
    "graph-breaks": "graph-breaks",
    "pageable": "pageable-copies",
    "cpu-ops": "cpu-ops",
    "host-sync": "input-path-syncs",
    "fragmentation": "fragmentation",
    "launch-bound": "launch-bound",
}
FIXABLE = ("input", "unused-params", "graph-breaks", *GPU_FAULTS)
"""Faults whose workloads take ``--fix`` (the fault with the fix its finding names applied): ``--check-fix``."""
FAULT_OF_RULE = {rule: fault for fault, rule in EXPECTED.items()}
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
        if self.size:
            out += ["--size", self.size]
        if self.straggler_rank is not None:
            out += ["--straggler-rank", str(self.straggler_rank)]
        return out


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
    script: Script,
    fault: str,
    steps: int,
    run_dir: str,
    run_id: str,
    launch: Launch = Launch(),
    fixed: bool = False,
) -> list:
    script_args = [os.path.join(WORKLOADS, script.file), "--fault", fault, "--steps", str(steps), "--run-dir", run_dir]
    # graph breaks are dynamo's, the same with any backend; inductor takes minutes a run on 2 CPU cores
    script_args += ["--run-id", run_id, "--compile-backend", "eager", *launch.script_args()]
    script_args += ["--fix"] if fixed else []
    if script.launcher == "torchrun":
        if launch.dist_backend:
            script_args += ["--dist-backend", launch.dist_backend]
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
    env.update(
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        CORPUS_TRUTH_DIR=truth_dir,
    )
    return env


def run_job(cmd: list, env: dict, log_path: str, timeout: float) -> tuple:
    """Run one job to completion in its own session; (returncode or None on timeout, seconds)."""
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        io = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
        proc = subprocess.Popen(cmd, env=env, cwd=WORKLOADS, start_new_session=True, **io)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:  # Ctrl-C: take the job down with us
            _kill_session(proc)
            proc.wait()
            raise
        finally:
            _kill_session(proc)  # whatever the job left behind (a rank stuck in a collective)
            if proc.poll() is None:
                proc.wait()
    return rc, time.monotonic() - t0


def diagnose_json(
    run_path: str, timeout: float = 120.0, src: Optional[str] = None, warmup: Optional[int] = None
) -> dict:
    """``ranksight diagnose RUN --json``, as a user runs it; raises RuntimeError with its stderr."""
    extra = [] if warmup is None else ["--warmup", str(warmup)]
    out = subprocess.run(
        [sys.executable, "-m", "ranksight", "diagnose", run_path, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.dirname(os.path.abspath(run_path)),
        env=job_env("", src),
    )
    if out.returncode != 0:
        raise RuntimeError(f"diagnose exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


HYGIENE = {"unused-parameter-scan"}
"""Rules whose estimated cost sits below the warning floor: with nothing loud, their finding listed first
(at info, with its fix) is the verdict."""


def verdict_of(report: dict) -> Optional[dict]:
    findings = report.get("findings", [])
    for finding in findings:
        if finding.get("severity") in ("warning", "critical"):
            return finding
    if findings and findings[0].get("rule") in HYGIENE:
        return findings[0]
    return None


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
    if not os.path.isdir(truth_dir):
        return ranks
    for name in sorted(os.listdir(truth_dir)):
        t = _read_json(os.path.join(truth_dir, name))
        if t is None:
            continue
        ends, fault_s = t.get("step_ends", []), t.get("fault_s", [])
        intervals = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :])]
        faults = fault_s[warmup + 1 :]
        total = sum(intervals)
        ranks[str(t.get("rank"))] = {
            "steps": len(ends),
            "step_median_s": round(statistics.median(intervals), 5) if intervals else None,
            "step_mean_s": round(total / len(intervals), 6) if intervals else None,
            "fault_share": round(sum(faults) / total, 4) if total > 0 else None,
            "samples_per_step": t.get("samples_per_step"),
        }
    return ranks


def run_one(
    script_name: str,
    fault: str,
    repeat: int,
    steps: int,
    root: str,
    timeout: float = 300.0,
    src: Optional[str] = None,
    launch: Launch = Launch(),
    diagnose: bool = True,
    fixed: bool = False,
) -> RunResult:
    """One job and its diagnosis; never raises for a failing job (status and error_tail say what failed).

    ``src``: a folder holding a frozen ``ranksight`` package (``snapshot_source``) used by the job and
    the diagnosis instead of the installed one. ``diagnose=False``: the job and its truth only."""
    script = SCRIPTS[script_name]
    run_dir = os.path.join(root, "runs")
    run_id = f"{script_name}-{fault}{'-fixed' if fixed else ''}-r{repeat}-{uuid.uuid4().hex[:6]}"
    run_path = os.path.join(run_dir, run_id)
    log_path = os.path.join(root, "logs", run_id + ".log")
    truth_dir = os.path.join(root, "truth", run_id)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)
    res = RunResult(script_name, fault, repeat, run_id, run_path, expected=EXPECTED[fault], fixed=fixed)
    cmd = launch_command(script, fault, steps, run_dir, run_id, launch, fixed)
    rc, res.elapsed_s = run_job(cmd, job_env(truth_dir, src, launch.device), log_path, timeout)
    res.elapsed_s = round(res.elapsed_s, 1)
    res.returncode = rc
    res.truth = truth_summary(truth_dir)
    if rc is None or rc != 0:
        res.status = "timeout" if rc is None else "error"
        res.verdict = "error"
        res.error_tail = _tail(log_path)
        return res
    if not diagnose:
        res.verdict = "not-diagnosed"
        return res
    try:
        report = diagnose_json(run_path, src=src)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        res.status, res.verdict, res.error_tail = (
            "diagnose-error",
            "error",
            f"{exc}\n--- job log ---\n{_tail(log_path)}",
        )
        return res
    _fill_from_report(res, report)
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


def snapshot_source(how: str, dest: str) -> tuple:
    """Freeze the ranksight package for a long corpus run while the working tree keeps changing.

    ``tree``: copy the working tree's package folders now; ``head``: the committed HEAD
    (``git archive``). Lays them out as one importable ``ranksight`` package under ``dest`` (put on
    PYTHONPATH, it wins over the editable install's finder) and returns (dest, description)."""
    src_root = REPO
    if how == "head":
        src_root = os.path.join(dest, "_head")
        os.makedirs(src_root, exist_ok=True)
        archive = subprocess.run(["git", "archive", "HEAD"], capture_output=True, cwd=REPO, check=True).stdout
        subprocess.run(["tar", "-x", "-C", src_root], input=archive, check=True)
    pkg = os.path.join(dest, "ranksight")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(src_root, "ranksight"), pkg, ignore=ignore)
    for sub in PACKAGES[1:]:
        shutil.copytree(os.path.join(src_root, sub), os.path.join(pkg, sub), ignore=ignore)
    if how == "head":
        shutil.rmtree(src_root, ignore_errors=True)
        return dest, f"HEAD {(commit() or '')[:12]}"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *PACKAGES], capture_output=True, text=True, cwd=REPO
    ).stdout.count("\n")
    return dest, f"working tree at {time.strftime('%H:%M:%S')} on {(commit() or '')[:12]} ({dirty} changed files)"


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
    flips, judged, per_group = 0, 0, {}
    for (script, fault), rs in groups.items():
        vs = [r.verdict for r in rs if r.status == "ok"]
        per_group[f"{script}/{fault}"] = [r.verdict for r in rs]
        if len(vs) >= 2:
            judged += 1
            flips += len(set(vs)) > 1
    by_script: dict = {}
    for script in dict.fromkeys(r.script for r in results):
        hits = sum(bool(r.hit) for r in ok if r.script == script)
        runs = sum(r.script == script for r in results)
        by_script[script] = {"runs": runs, "hits": hits, "recall": _rate(hits, sum(r.script == script for r in ok))}
    healthy = [r for r in ok if r.fault == "none"]
    return {
        "by_script": by_script,
        "by_fault": by_fault,
        "precision": precision,
        "healthy_silent_rate": _rate(sum(r.verdict == "silent" for r in healthy), len(healthy)),
        "flip_rate": _rate(flips, judged),
        "flipped_groups": flips,
        "groups_judged": judged,
        "verdicts_by_group": per_group,
        "overall_recall": _rate(sum(bool(r.hit) for r in ok), len(ok)),
        "runs": len(results),
        "errors": len(results) - len(ok),
    }


FIX_TOLERANCE = 0.05
"""How far (share of the step) the cost a finding stated may lie from the step time its fix gave back."""


def _per_sample_s(r: RunResult, clock: str = "truth") -> Optional[float]:
    """A run's step time per sample, over the samples a step trains on: the median over ranks of the
    script's own median step interval (``truth``) or mean one (``truth_mean``: its time after warm-up over
    its steps, the denominator of a cost share), or ranksight's median step period (``ranksight``)."""
    samples = [t.get("samples_per_step") for t in r.truth.values() if t.get("samples_per_step")]
    per = samples[0] if samples else 1
    if clock == "ranksight":
        return r.step_median_s / per if r.step_median_s else None
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
            return {
                "cost_share": cost if cost is not None else 0.0,
                "stated": cost is not None,
                "speedup": f.get("speedup"),
                "place": place,
                "severity": f.get("severity"),
                "first": r.verdict == rule,
            }
    return None


def fix_check(results: list) -> list:
    """Per (script, fault) with faulty and fixed runs: the cost the planted fault's finding stated against
    the step time the fix gave back (1 - fixed / faulty, per sample, medians over the runs), on the
    script's own clock and on ranksight's."""
    rows = []
    keys = dict.fromkeys((r.script, r.fault) for r in results if r.fixed)
    for script, fault in keys:
        faulty = [r for r in results if r.script == script and r.fault == fault and not r.fixed and r.status == "ok"]
        fixed = [r for r in results if r.script == script and r.fault == fault and r.fixed and r.status == "ok"]
        row = {"script": script, "fault": fault, "rule": EXPECTED[fault], "runs": len(faulty), "fixed_runs": len(fixed)}
        stated = [c for c in (stated_cost(r) for r in faulty) if c is not None]
        row["named"] = len(stated)
        row["named_first"] = sum(c["first"] for c in stated)
        row["costs"] = [round(c["cost_share"], 4) for c in stated]
        row["cost_share"] = round(statistics.median(row["costs"]), 4) if stated else None
        row["cost_stated"] = any(c["stated"] for c in stated)
        row["speedup"] = round(1.0 / (1.0 - row["cost_share"]), 2) if row["cost_share"] is not None else None
        for clock in ("truth", "truth_mean", "ranksight"):
            before = [v for v in (_per_sample_s(r, clock) for r in faulty) if v]
            after = [v for v in (_per_sample_s(r, clock) for r in fixed) if v]
            gain = None
            if before and after:
                gain = round(1.0 - statistics.median(after) / statistics.median(before), 4)
            row[f"gain_{clock}"] = gain
            if clock == "truth":
                row["step_before_s"] = round(statistics.median(before), 6) if before else None
                row["step_after_s"] = round(statistics.median(after), 6) if after else None
        # Judged on the median step (its gain is what a typical step gives back). The mean step's gain (all the
        # time after warm-up, the denominator of a cost share) is kept beside it: in a 30-step run the kernel
        # windows' fixed cost weighs more on the faster, fixed run, so it swings more than the median's.
        gain = row["gain_truth"]
        row["diff_pp"] = round((row["cost_share"] - gain) * 100, 1) if gain is not None and stated else None
        mean_gain = row["gain_truth_mean"]
        row["diff_pp_mean"] = (
            round((row["cost_share"] - mean_gain) * 100, 1) if mean_gain is not None and stated else None
        )
        row["within"] = row["diff_pp"] is not None and abs(row["diff_pp"]) <= FIX_TOLERANCE * 100
        row["fixed_verdicts"] = [r.verdict for r in fixed]
        row["fixed_still_named"] = sum(
            any(f.get("rule") == EXPECTED[fault] and f.get("severity") in ("warning", "critical") for f in r.findings)
            for r in fixed
        )
        rows.append(row)
    return rows


def fix_check_text(rows: list) -> list:
    """The fix check as table lines (empty without fixed runs)."""
    if not rows:
        return []
    cols = ("script", "fault", "named first", "cost stated", "speedup", "step/sample before", "after", "gain")
    cols += ("gain (mean step)", "gain (ranksight clock)", "stated - gain", "within 5 pp", "after the fix")
    out = []
    for row in rows:
        cost = row["cost_share"]
        out.append(
            (
                row["script"],
                row["fault"],
                f"{row['named_first']}/{row['runs']}",
                "-" if cost is None else f"{cost:.1%}" + ("" if row["cost_stated"] else " (none stated)"),
                _fmt(row["speedup"], ".2f"),
                _fmt(row["step_before_s"] * 1000 if row["step_before_s"] else None, ".3f"),
                _fmt(row["step_after_s"] * 1000 if row["step_after_s"] else None, ".3f"),
                "-" if row["gain_truth"] is None else f"{row['gain_truth']:.1%}",
                "-" if row.get("gain_truth_mean") is None else f"{row['gain_truth_mean']:.1%}",
                "-" if row["gain_ranksight"] is None else f"{row['gain_ranksight']:.1%}",
                "-" if row["diff_pp"] is None else f"{row['diff_pp']:+.1f} pp",
                "yes" if row["within"] else "no",
                f"{', '.join(row['fixed_verdicts'])}; still named {row['fixed_still_named']}/{row['fixed_runs']}",
            )
        )
    lines = [
        "fix check: the cost each planted fault's finding stated (median of its runs) against the step time "
        "its fix gave back (1 - fixed / faulty per sample, the script's own clock, median step; its mean step "
        "after warm-up beside it; ms per sample)"
    ]
    return lines + _table(cols, out)


def _fmt(v, spec: str = "") -> str:
    if v is None or v == "":
        return "-"
    return format(v, spec) if spec else str(v)


def _truth_cell(r: RunResult) -> str:
    shares = [f"r{rank}:{t['fault_share']:.0%}" for rank, t in sorted(r.truth.items()) if t.get("fault_share")]
    return " ".join(shares) if shares else "-"


def report_text(results: list, summary: dict, header: str = "") -> str:
    lines = [header] if header else []
    cols = ("script", "fault", "rep", "verdict", "severity", "conf", "ranks", "step ms", "fault share", "status", "s")
    rows = []
    for r in results:
        fault, verdict = r.fault + (" (fixed)" if r.fixed else ""), r.verdict
        verdict += "" if r.hit or r.status != "ok" or r.fixed else " (miss)"
        step_ms = _fmt(r.step_median_s * 1000 if r.step_median_s else None, ".1f")
        ranks = ",".join(map(str, r.ranks)) or "-"
        rows.append((r.script, fault, str(r.repeat), verdict, _fmt(r.severity), _fmt(r.confidence, ".2f"), ranks))
        rows[-1] += (step_ms, _truth_cell(r), r.status, f"{r.elapsed_s:.0f}")
    lines += _table(cols, rows)
    lines.append("")
    fixes = fix_check_text(fix_check(results))
    if fixes:
        lines += fixes + [""]
    everything, results = results, [r for r in results if not r.fixed]
    cols = ("fault", "expected", "runs", "errors", "recall", "verdicts", "note")
    rows = []
    for fault, row in summary["by_fault"].items():
        verdicts = ", ".join(f"{k} x{v}" for k, v in sorted(row["verdicts"].items(), key=lambda kv: -kv[1]))
        note = f"rank 1 named in {row['named_rank_1']}/{row['hits']}" if fault == "straggler" else ""
        recall = f"{row['hits']}/{row['runs'] - row['errors']}"
        recall += f" ({row['recall']:.0%})" if row["recall"] is not None else ""
        rows.append((fault, row["expected"], str(row["runs"]), str(row["errors"]), recall, verdicts, note))
    lines += _table(cols, rows)
    lines.append("")
    faults = list(dict.fromkeys(r.fault for r in results))
    cols = ("hits / runs", *faults, "all")
    rows = []
    for script, row in summary["by_script"].items():
        cells = []
        for fault in faults:
            rs = [r for r in results if r.script == script and r.fault == fault]
            errs = sum(r.status != "ok" for r in rs)
            cells.append(f"{sum(bool(r.hit) for r in rs)}/{len(rs)}" + (f" ({errs} err)" if errs else "") if rs else "")
        rows.append((script, *cells, f"{row['hits']}/{row['runs']}"))
    lines += _table(cols, rows)
    lines.append("")
    cols = ("verdict rule", "runs", "precision", "from faults")
    rows = [
        (rule, str(p["runs"]), f"{p['right']}/{p['runs']} ({p['precision']:.0%})", ", ".join(p["faults"]))
        for rule, p in sorted(summary["precision"].items())
    ]
    lines += _table(cols, rows)
    lines.append("")
    hs = summary["healthy_silent_rate"]
    fr = summary["flip_rate"]
    lines.append(
        f"healthy silent rate: {'-' if hs is None else f'{hs:.0%}'}   "
        f"flip rate: {'-' if fr is None else f'{fr:.0%}'} ({summary['flipped_groups']}/{summary['groups_judged']} "
        f"(script, fault) groups changed verdict between repeats)   "
        f"overall recall: {summary['overall_recall']}   runs: {summary['runs']}, errors: {summary['errors']}"
    )
    errors = [r for r in everything if r.status != "ok"]
    for r in errors:
        lines.append("")
        lines.append(f"--- {r.status}: {r.script} / {r.fault} / repeat {r.repeat} (exit {r.returncode}) ---")
        lines.append(r.error_tail.rstrip()[-3000:])
    return "\n".join(lines)


def _table(cols: tuple, rows: list) -> list:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return out


def rediagnose(args) -> int:
    """Score the kept runs of an earlier ``--out`` again with today's rules (installed or --snapshot)."""
    root = args.rediagnose
    with open(os.path.join(root, "results.jsonl")) as fh:
        old = [RunResult(**json.loads(line)) for line in fh if line.strip()]
    dest = tempfile.mkdtemp(prefix="ranksight-src-") if args.snapshot != "none" else ""
    src, source = ranksight_source(args.snapshot, dest)
    # where the jobs ran (kept by the run since the GPU corpus; CPU before that)
    device_record = _read_json(os.path.join(root, DEVICE_FILE), {})
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


def ranksight_source(snapshot: str, dest: str) -> tuple:
    """(folder to put ahead on PYTHONPATH or None, words): the installed package, or ``--snapshot``'s copy."""
    if snapshot == "none":
        return None, f"installed package (live working tree {REPO})"
    return snapshot_source(snapshot, dest)


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


def gpu_names() -> list:
    """The GPUs' names as nvidia-smi lists them (torch's when it is missing): for the report's header."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0 and out.stdout.strip():
            return [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    probe = "import torch; [print(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]"
    try:  # in a child: CUDA is not initialised in this process, which forks none of the jobs anyway
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        return []


def describe_device(launch: Launch) -> tuple:
    """(header words, JSON record) of where the jobs ran."""
    if launch.device == "cpu":
        return f"{launch.ranks} gloo ranks", {"device": "cpu", "ranks": launch.ranks, "backend": "gloo"}
    names = gpu_names()
    backend = launch.dist_backend or "nccl"
    shared = " (ranks share GPUs: smoke test, timings mean nothing)" if launch.ranks > max(len(names), 1) else ""
    distinct = ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names)) or "no GPU found"
    words = f"{launch.ranks} {backend} ranks on {distinct}{shared}"
    record = {"device": "cuda", "ranks": launch.ranks, "backend": backend, "gpus": names, "size": launch.size}
    return words, record


def source_digest(package_root: Optional[str] = None) -> str:
    """A hash of the package's source files (``.py``, ``.yaml``), named as installed (``ranksight/agent/...``):
    names the code that ran even where the checkout's last commit does not (a copy of a working tree, as
    the GPU machines get). ``package_root``: a ``snapshot_source`` package folder; default the checkout's
    folders, which hash the same for the same code."""
    import hashlib

    h = hashlib.sha256()
    for sub in sorted(PACKAGES):
        if package_root is None:
            top = os.path.join(REPO, sub)
        else:
            top = package_root if sub == "ranksight" else os.path.join(package_root, sub)
        for dirpath, dirnames, filenames in os.walk(top):
            skip = {"__pycache__", *PACKAGES} if dirpath == top and sub == "ranksight" else {"__pycache__"}
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
            for name in sorted(filenames):
                if name.endswith((".py", ".yaml")):
                    path = os.path.join(dirpath, name)
                    h.update(f"{sub}/{os.path.relpath(path, top)}".encode())
                    with open(path, "rb") as fh:
                        h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def build_plan(
    scripts: list,
    faults: list,
    repeats: int,
    repeats_of: tuple = (),
    check_fix: Optional[list] = None,
    fix_repeats: int = 1,
) -> list:
    """(script, fault, repeat, fixed) in run order: every repeat of every (script, fault) the script plants,
    then (``check_fix`` not None) the fixed variants: of every fixable fault planned, or of those named
    (``fault`` or ``script/fault``)."""
    counts = {}
    for item in repeats_of:
        fault, _, n = item.partition("=")
        if fault not in EXPECTED or not n.isdigit():
            raise SystemExit(f"--repeats-of takes FAULT=N with a known fault, got {item!r}")
        counts[fault] = int(n)
    most = max([repeats, *counts.values()])
    plan = [
        (s, f, rep, False)
        for rep in range(most)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--scripts", nargs="+", default=list(SCRIPTS), choices=sorted(SCRIPTS))
    faults = f"default: {' '.join(ALL_FAULTS)}; on --device cuda also {' '.join(GPU_FAULTS)}"
    add("--faults", nargs="+", default=None, choices=(*ALL_FAULTS, *GPU_FAULTS), help=faults)
    add("--repeats", type=int, default=3)
    add("--steps", type=int, default=30, help="optimizer steps per run (5 are warm-up)")
    add("--timeout", type=float, default=300.0, help="seconds per job before it is killed")
    add("--out", default=None, help="keep run dirs, logs and truth here (default: a temp dir, removed)")
    add("--json", default=None, help="write every run and the scores here")
    add("--text", default=None, help="write the printed report here too")
    snapshot = "run jobs and diagnosis on a frozen copy of ranksight: the working tree as it is at start, or the "
    snapshot += "committed HEAD (default: the installed package, live)"
    add("--snapshot", choices=("none", "tree", "head"), default="none", help=snapshot)
    add("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one rank per GPU, NCCL")
    add("--gpus", type=int, default=2, help="ranks (GPUs) of a --device cuda job")
    add("--size", choices=("cpu", "gpu"), default=None, help="the scripts' size preset (default: gpu on cuda)")
    backend = "override the scripts' backend (gloo on cuda: more ranks than GPUs, a smoke test only)"
    add("--dist-backend", default=None, help=backend)
    add("--straggler-rank", type=int, default=None, help="rank the straggler slows (0 to time it with --gpus 1)")
    add("--no-diagnose", action="store_true", help="run the jobs and keep their truth, no verdict (calibration)")
    repeats_of = "this many repeats of these faults instead of --repeats (e.g. pageable=3)"
    add("--repeats-of", nargs="+", default=[], metavar="FAULT=N", help=repeats_of)
    check_fix = f"after the runs, run each (script, fault) of {', '.join(FIXABLE)} again with the fix its finding "
    check_fix += "names applied (the workloads' --fix), and compare the cost the finding stated with the step time "
    check_fix += "gained; with arguments, only those faults (FAULT, or SCRIPT/FAULT for one script's)"
    add("--check-fix", nargs="*", default=None, metavar="[SCRIPT/]FAULT", help=check_fix)
    add("--fix-repeats", type=int, default=1, help="runs of each fixed variant (--check-fix)")
    budget = "start no job that would likely end past this many seconds from the start (the longest job so far is "
    budget += "the guess); the reports are written either way, the jobs left out listed"
    add("--budget-s", type=float, default=None, help=budget)
    again = "run no job: diagnose again the runs an earlier --out OUT_DIR kept (after a rule change)"
    add("--rediagnose", default=None, metavar="OUT_DIR", help=again)
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
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    head = commit() or ""  # at the start: others may commit while the corpus runs
    src, source = ranksight_source(args.snapshot, os.path.join(root, "src"))
    source_hash = source_digest(os.path.join(src, "ranksight") if src else None)
    print(f"ranksight: {source}", flush=True)
    print(
        f"{len(plan)} runs ({len(args.scripts)} scripts x {len(args.faults)} faults x {args.repeats} repeats"
        f"{', and the fixed variants' if args.check_fix is not None else ''}), "
        f"{args.steps} steps each, under {root}",
        flush=True,
    )
    results = []
    manifest = os.path.join(root, "results.jsonl")  # one line per finished run, for --rediagnose
    t_start, longest, left_out = time.monotonic(), 0.0, []
    try:
        for i, (s, f, rep, fixed) in enumerate(plan, 1):
            if args.budget_s and time.monotonic() - t_start + longest > args.budget_s:
                left_out = plan[i - 1 :]
                print(f"budget of {args.budget_s:g} s: {len(left_out)} job(s) left out", flush=True)
                break
            t_job = time.monotonic()
            diagnose = not args.no_diagnose
            r = run_one(s, f, rep, args.steps, root, args.timeout, src, launch, diagnose, fixed)
            results.append(r)
            longest = max(longest, time.monotonic() - t_job)
            with open(manifest, "a") as fh:
                fh.write(json.dumps(asdict(r), default=str) + "\n")
            extra = "" if r.status == "ok" else "  " + (r.error_tail.strip().splitlines() or [""])[-1]
            print(
                f"[{i}/{len(plan)}] {s} / {f}{' (fixed)' if fixed else ''} / {rep}: {r.verdict} {r.severity} "
                f"({r.status}, {r.elapsed_s:.0f} s){extra}",
                flush=True,
            )
    finally:
        summary = score(results)
        header = (
            f"ranksight diagnosis corpus, {started}, commit {head[:12]}, source {source_hash[:12]}, "
            f"{platform.node()}, {os.cpu_count()} CPUs, {where}, {args.steps} steps, repeats {args.repeats}\n"
            f"ranksight: {source}"
        )
        if left_out:
            header += "\nleft out by --budget-s: " + ", ".join(
                f"{s}/{f}{' (fixed)' if fixed else ''}/{rep}" for s, f, rep, fixed in left_out
            )
        script = os.path.relpath(sys.argv[0], REPO) if sys.argv[0] else "diagnosis_corpus.py"
        meta = {"command": " ".join([script, *(argv if argv is not None else sys.argv[1:])]), "started": started}
        meta.update(commit=head, source_digest=source_hash, ranksight_source=source)
        meta["host"] = {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
        meta.update(device=device_record, settings={**vars(args), "compile_backend": "eager"})
        print()
        write_reports(args, results, summary, header, meta, left_out)
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
