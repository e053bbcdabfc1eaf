"""``ranksight diagnose RUN_DIR``: why the run is slow, what to change first, and the evidence."""

from __future__ import annotations

import json
import re
import textwrap
import time

from ranksight.format.warmup import WARMUP_STEPS

from ._errors import UserError
from ._format import ms, pct, speedup, table

_MARK = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}
_STATUS = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "n/a": "n/a"}
_PHASE_LABELS = (
    ("data_wait_share", "data"),
    ("h2d_share", "h2d"),
    ("compute_share", "compute"),
    ("comm_exposed_share", "comm"),
    ("optimizer_share", "optim"),
    ("other_share", "other"),
)


def add_parser(sub):
    p = sub.add_parser(
        "diagnose",
        help="diagnose a run: the root cause first, with evidence and the fix",
        description="Diagnose a run directory (live, finished or crashed): findings ranked so the first is "
        "the root cause to fix first, then the per-rank breakdown and the tuning checklist.",
    )
    p.add_argument(
        "run_dir",
        nargs="?",
        default=None,
        help="a run folder, a run id, or a folder of runs (its latest run; default ranksight-runs)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (schema in docs/diagnosis.md)")
    p.add_argument("--rules", metavar="DIR", default=None, help="extra rule files (*.yaml); same id overrides")
    p.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help=f"leading steps per rank to leave out (default {WARMUP_STEPS})"
    )
    p.add_argument("--features", action="store_true", help="print the per-rank features the rules read")
    p.add_argument(
        "--since",
        metavar="DURATION",
        default=None,
        help="judge only the last DURATION of the run's data (e.g. 60s, 5m, 1h) and say whether the verdict changed",
    )
    return p


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds; UserError for anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smh]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--since needs a positive duration such as 60s, 5m or 1h, got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def diagnose_or_fail(
    run_dir: str, rules_dir: str | None = None, warmup: int = WARMUP_STEPS, since_s: float | None = None
) -> dict:
    """Run the diagnosis; a bad rule file becomes a UserError listing every error."""
    from ranksight.rules import RuleError, diagnose

    try:
        return diagnose(run_dir, rules_dir, warmup_steps=warmup, since_s=since_s)
    except RuleError as exc:
        raise UserError(str(exc)) from None


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else str(v)


def _cost_text(f: dict) -> str:
    text = speedup(f.get("cost_share"))
    if text and f.get("cost_basis") == "estimate":
        text += " (estimate)"
    return text


def render_findings(result: dict) -> str:
    """The verdict and the other findings as text: what, how sure, which ranks, what fixing it gives back,
    evidence, fix."""
    findings = result["findings"]
    serious = [f for f in findings if f["severity"] != "info"]
    lines = []
    if not serious:
        lines.append("Verdict: no warning or critical finding: nothing in the rules says this run is held back.")
    for i, f in enumerate(findings):
        ranks = ", ".join(str(r) for r in f["ranks"])
        head = "Verdict" if i == 0 and serious else f"Finding {i + 1}"
        gain = _cost_text(f)
        lines.append(
            f"{head}: [{_MARK[f['severity']]}] {f['axis']} / {f['rule']}  "
            f"(confidence {f['confidence']:.2f}; ranks {ranks})" + (f": {gain}" if gain else "")
        )
        lines.append(textwrap.fill(f["summary"], 100, initial_indent="  ", subsequent_indent="  "))
        lines.append(textwrap.fill(_evidence_text(f["evidence"]), 100, initial_indent="  ", subsequent_indent="    "))
        fix = f["fix"]
        fitted = f" ({fix['framework']})" if fix.get("framework") not in (None, "plain") else ""
        lines.append(textwrap.fill(f"fix{fitted}: {fix['text']}", 100, initial_indent="  ", subsequent_indent="    "))
        if fix.get("snippet"):
            lines.append(textwrap.indent(fix["snippet"].rstrip(), "      "))
        lines.append("")
    return "\n".join(lines).rstrip()


def _evidence_text(evidence: dict) -> str:
    """The measured figures, then the names the run has no figure for (a per-bucket timing with the hook off,
    say) in one list, rather than a dash among the numbers."""
    shown = ", ".join(f"{k}={_value(v)}" for k, v in evidence.items() if v is not None)
    missing = ", ".join(k for k, v in evidence.items() if v is None)
    return "evidence: " + "; ".join(filter(None, (shown, missing and f"not measured: {missing}")))


def render_checklist(result: dict) -> str:
    """The tuning checklist as a table (n/a: the run has no such signal, e.g. a GPU signal on CPU)."""
    rows = []
    for c in result["checklist"]:
        v = c["value"]
        # Ratios read as percentages (1.0 too: NVML's 100 %); counts (retries, free blocks) as numbers.
        if v is None:
            shown = "–"
        elif c.get("unit") == "ratio":
            shown = pct(v).strip()
        else:
            shown = _value(int(v) if isinstance(v, float) and v.is_integer() else v)
        rows.append([c["item"], c["group"], _STATUS[c["status"]], shown])
    return table(["item", "group", "status", "value"], rows) if rows else "(no checklist items)"


def render_breakdown_rows(rows: list[dict], statuses: dict[int, str]) -> str:
    """The per-rank breakdown of a diagnosis (a share the run did not measure prints '–', never 0 %)."""
    if not rows:
        return "no steps recorded yet"
    headers = ["rank", "status", "steps", "step ms (median)"] + [f"{label} %" for _, label in _PHASE_LABELS]
    timed = any(r.get("allreduce_share") is not None for r in rows)  # its column only where some rank timed it
    body = [
        [str(r["rank"]), statuses.get(r["rank"], "?"), str(r["steps"]), ms(r["step_median_s"])]
        + [pct(r[key]) for key, _ in _PHASE_LABELS]
        + ([pct(r.get("allreduce_share"))] if timed else [])
        for r in rows
    ]
    return table(headers + (["allreduce %"] if timed else []), body)


def render_window(result: dict) -> str:
    """What --since judged, and whether the verdict changed."""
    window, change = result.get("window"), result.get("change")
    if not window:
        return "Window: no steps recorded yet"

    def clock(ns):
        return time.strftime("%H:%M:%S", time.localtime(ns / 1e9))

    head = (
        f"Window: the last {window['since_s']:g} s of the run's data ({clock(window['start_ns'])}–"
        f"{clock(window['end_ns'])}, up to {window['steps']} steps per rank after warm-up)"
    )
    return head + (f"\nChange: {change['text']}" if change else "")


def render_report(result: dict, run_dir: str, warmup: int = WARMUP_STEPS) -> str:
    """The whole human report: (window,) verdict, findings, breakdown, checklist."""
    from ranksight.collectors import read_rank_meta

    statuses = {m.rank: m.status for m in read_rank_meta(run_dir)}
    scope = "in the window" if "window" in result else "after warm-up"
    parts = [f"run: {result['run']}"]
    if "window" in result:
        parts.append(render_window(result))
    parts += [
        render_findings(result),
        f"Step-time breakdown per rank ({scope}):\n" + render_breakdown_rows(result["breakdown"]["ranks"], statuses),
    ]
    if result.get("other_time"):
        parts.append(render_other_time(result["other_time"]))
    parts.append("Checklist (worst rank):\n" + render_checklist(result))
    return "\n\n".join(parts)


def render_other_time(other: list[dict]) -> str:
    """Where the training thread was during "other" (the sampled stack window), per rank."""
    lines = ['Time outside the measured phases ("other"), from the sampled stack window:']
    for r in other:
        places = ", ".join(f"{t['where']} {t['share']:.0%}" for t in r["top"][:3])
        lines.append(f"  rank {r['rank']} ({pct(r['other_share']).strip()} of the step): {places}")
    return "\n".join(lines)


def run(args) -> int:
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    since_s = parse_duration(args.since) if getattr(args, "since", None) is not None else None
    if args.features:
        from ranksight.rules import diagnose_features

        feats = diagnose_features(args.run_dir, warmup_steps=args.warmup, since_s=since_s)
        print(json.dumps({str(r): f for r, f in feats.items()}, indent=1, default=str))
        return 0
    result = diagnose_or_fail(args.run_dir, args.rules, args.warmup, since_s)
    steps = live_provisional(result, args.run_dir)
    if args.json:
        print(json.dumps({**result, "provisional": steps is not None}, indent=1, default=str))
    else:
        from ranksight.rules import provisional_text

        report = render_report(result, args.run_dir, args.warmup)
        print(report if steps is None else report.replace("\n\n", f"\n{provisional_text(steps)}\n\n", 1))
    return 0


def live_provisional(result: dict, run_dir: str) -> int | None:
    """The steps a live run's verdict rests on when they are too few to call it settled (None otherwise): the
    same floor the dashboard labels (``rules._provisional``); a run that ended keeps the verdict it has."""
    from ranksight.collectors import rank_is_live, read_rank_meta
    from ranksight.rules import provisional

    steps = provisional(result)
    return steps if steps is not None and any(rank_is_live(m) for m in read_rank_meta(run_dir)) else None
