"""``ranksight diagnose RUN_DIR``: why the run is slow, what to change first, and the evidence."""

from __future__ import annotations

import json
import textwrap

from ranksight.cli import UserError

from ._format import pct, table
from .summary import render_breakdown

_MARK = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}
_STATUS = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "n/a": "n/a"}


def add_parser(sub):
    p = sub.add_parser(
        "diagnose",
        help="diagnose a run: the root cause first, with evidence and the fix",
        description="Diagnose a run directory (live, finished or crashed): findings ranked so the first is "
        "the root cause to fix first, then the per-rank breakdown and the tuning checklist.",
    )
    p.add_argument("run_dir", help="a run folder, e.g. ranksight-runs/<run-id>")
    p.add_argument("--json", action="store_true", help="print one JSON object (schema in docs/diagnosis.md)")
    p.add_argument("--rules", metavar="DIR", default=None, help="extra rule files (*.yaml); same id overrides")
    p.add_argument("--warmup", type=int, default=5, help="leading steps per rank to leave out (default 5)")
    p.add_argument("--features", action="store_true", help="print the per-rank features the rules read")
    return p


def diagnose_or_fail(run_dir: str, rules_dir: str | None = None, warmup: int = 5) -> dict:
    """Run the diagnosis; a bad rule file becomes a UserError listing every error."""
    from ranksight.rules import RuleError, diagnose

    try:
        return diagnose(run_dir, rules_dir, warmup_steps=warmup)
    except RuleError as exc:
        raise UserError(str(exc)) from None


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_findings(result: dict) -> str:
    """The verdict and the other findings as text: what, how sure, which ranks, evidence, fix."""
    findings = result["findings"]
    serious = [f for f in findings if f["severity"] != "info"]
    lines = []
    if not serious:
        lines.append("Verdict: no warning or critical finding: nothing in the rules says this run is held back.")
    for i, f in enumerate(findings):
        ranks = ", ".join(str(r) for r in f["ranks"])
        head = "Verdict" if i == 0 and serious else f"Finding {i + 1}"
        lines.append(
            f"{head}: [{_MARK[f['severity']]}] {f['axis']} / {f['rule']}  "
            f"(confidence {f['confidence']:.2f}; ranks {ranks})"
        )
        lines.append(textwrap.fill(f["summary"], 100, initial_indent="  ", subsequent_indent="  "))
        evidence = ", ".join(f"{k}={_value(v)}" for k, v in f["evidence"].items())
        lines.append(textwrap.fill(f"evidence: {evidence}", 100, initial_indent="  ", subsequent_indent="    "))
        lines.append(textwrap.fill(f"fix: {f['fix']['text']}", 100, initial_indent="  ", subsequent_indent="    "))
        if f["fix"].get("snippet"):
            lines.append(textwrap.indent(f["fix"]["snippet"].rstrip(), "      "))
        lines.append("")
    return "\n".join(lines).rstrip()


def render_checklist(result: dict) -> str:
    """The tuning checklist as a table (n/a: the run has no such signal, e.g. a GPU signal on CPU)."""
    rows = []
    for c in result["checklist"]:
        v = c["value"]
        # Ratios read as percentages (1.0 too: NVML's 100 %); counts (retries, free blocks) as numbers.
        if v is None:
            shown = "-"
        elif c.get("unit") == "ratio":
            shown = pct(v).strip()
        else:
            shown = _value(int(v) if isinstance(v, float) and v.is_integer() else v)
        rows.append([c["item"], c["group"], _STATUS[c["status"]], shown])
    return table(["item", "group", "status", "value"], rows) if rows else "(no checklist items)"


def render_report(result: dict, run_dir: str, warmup: int = 5) -> str:
    """The whole human report: verdict, findings, breakdown, checklist."""
    return "\n\n".join(
        [
            f"run: {result['run']}",
            render_findings(result),
            "Step-time breakdown per rank (after warm-up):\n" + render_breakdown(run_dir, warmup),
            "Checklist (worst rank):\n" + render_checklist(result),
        ]
    )


def run(args) -> int:
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.features:
        from ranksight.rules import diagnose_features

        feats = diagnose_features(args.run_dir, warmup_steps=args.warmup)
        print(json.dumps({str(r): f for r, f in feats.items()}, indent=1, default=str))
        return 0
    result = diagnose_or_fail(args.run_dir, args.rules, args.warmup)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(render_report(result, args.run_dir, args.warmup))
    return 0
