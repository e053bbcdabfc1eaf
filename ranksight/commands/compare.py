"""``ranksight compare RUN_A RUN_B [--gate 3%] [--json | --markdown]``: did the change between two runs make
steps faster or slower, is the difference real, and why?

Both runs are diagnosed, then compared by ``ranksight.dashboard.compare`` -- the function the
dashboard's Compare page uses -- so the terminal and the page show the same figures. The change in step
time comes with an interval (``_gate``: a block bootstrap over each run's steps), split into the phases
and findings that moved it; with ``--gate`` the exit code says whether B may pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ranksight.format.warmup import WARMUP_STEPS

from ._errors import UserError
from ._format import table
from ._gate import EXIT_INCOMPARABLE, assess
from ._gate_policy import GateConfig, load_config, parse_share
from ._gate_report import render_markdown, render_text

_SEVERITY = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}


def add_parser(sub):
    p = sub.add_parser(
        "compare",
        help="compare two runs: step time with its interval, phases and findings, B against A; --gate for CI",
        description="Compare run B against run A (e.g. before and after a change): step time and each phase's "
        "share side by side, the change in step time with a confidence interval (per rank and for the job), "
        "the phases and findings that moved it, and with --gate a verdict for CI. A run is a run folder, a "
        "run id, or a folder of runs (its latest run).",
        epilog=GATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_a", metavar="RUN_A", help="the run before (a run folder or run id)")
    p.add_argument("run_b", metavar="RUN_B", help="the run after")
    add_options(p)
    return p


GATE_EPILOG = """\
exit codes:
  0  no gate, or the gate passed (also when it cannot tell, with the reason)
  1  the gate failed: at the chosen confidence B is slower than A by more than a limit
  2  the runs cannot be compared (different world size, no rank in both, too few steps after warm-up),
     or a bad argument; one line on stderr says which

the gate judges the change the phases explain beyond the host's uniform stretch of the step's own work:
it fails when that interval lies wholly above the limit; "cannot tell" when it reaches past the limit only
in part, or when the step moved but every phase moved with it (a busier host does that). Per-phase limits:
[tool.ranksight.gate] in ./pyproject.toml or --gate-config (docs/ci-gate.md)."""


def add_options(p) -> None:
    """The options ``compare`` and ``baseline compare`` share."""
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--markdown", action="store_true", help="print Markdown (for $GITHUB_STEP_SUMMARY or a PR)")
    p.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help=f"leading steps per rank to leave out (default {WARMUP_STEPS})"
    )
    p.add_argument("--rules", metavar="DIR", default=None, help="extra rule files (*.yaml); same id overrides")
    p.add_argument(
        "--gate", metavar="LIMIT", default=None,
        help="fail (exit 1) when B's step time is slower than A's by more than LIMIT (e.g. 3%%) at the "
        "chosen confidence; also reads per-phase limits from ./pyproject.toml [tool.ranksight.gate]",
    )  # fmt: skip
    p.add_argument(
        "--gate-config", metavar="FILE", default=None,
        help="the gate's limits from FILE: a pyproject.toml ([tool.ranksight.gate]) or a YAML file",
    )  # fmt: skip
    p.add_argument(
        "--confidence", type=float, default=None,
        help="two-sided confidence of the intervals (default 0.95, or the gate config's)",
    )  # fmt: skip


def _value(v, unit: str) -> str:
    if v is None:
        return "–"
    return {"s": f"{1000 * v:.1f} ms", "ratio": f"{100 * v:.1f} %", "steps/s": f"{v:.2f}/s"}[unit]


def _delta(v, unit: str) -> str:
    if v is None:
        return "–"
    # A share's change in percentage points: a relative change of a near-zero share reads as thousands of %.
    return {"s": f"{1000 * v:+.1f} ms", "ratio": f"{100 * v:+.1f} pp", "steps/s": f"{v:+.2f}/s"}[unit]


def _cost(c) -> str:
    return "–" if c is None else f"{100 * c:.0f} %"


def _speedup(s) -> str:
    return "–" if not s else f"{s:.2f}×"


def _explains(result: dict, side: str, rule: str) -> str:
    """' with what it explains (x, y)' where the finding's cost is that of findings it explains: a cause takes the
    cost of what it explains when higher, while its own text states its own figure, so the two differ."""
    explained = result.get("explains", {}).get(side, {}).get(rule)
    return f" with what it explains ({', '.join(explained)})" if explained else ""


def render_comparison(result: dict) -> str:
    """The comparison as text: the speedup first, the figures side by side, then the findings' changes."""
    from ranksight.dashboard import speedup_sentence

    rows = [
        [
            m["metric"],
            _value(m["a"], m["unit"]),
            _value(m["b"], m["unit"]),
            _delta(m["delta"], m["unit"]),
            "–" if m["relative"] is None or m["unit"] == "ratio" else f"{100 * m['relative']:+.1f} %",
        ]
        for m in result["metrics"]
        if m["a"] is not None or m["b"] is not None
    ]
    lines = [
        f"{side.upper()}: {result[side]['run']}  ({result[side]['ranks']} ranks, "
        f"{result[side]['steps_per_rank']} steps each after warm-up)"
        for side in ("a", "b")
    ]
    lines += [
        "",
        speedup_sentence(result),
        "",
        table(["", "A", "B", "B - A", "B / A - 1"], rows),
        "",
        "Findings (cost: the share of step time the rule says a fix gives back):",
    ]
    found = result["findings"]
    for f in found["disappeared"]:
        lines.append(
            f"  gone in B:     {f['rule']} [{_SEVERITY.get(f['severity'], f['severity'])}], "
            f"cost in A {_cost(f['cost_share'])}{_explains(result, 'a', f['rule'])} (up to {_speedup(f['speedup'])})"
        )
    for f in found["appeared"]:
        lines.append(
            f"  new in B:      {f['rule']} [{_SEVERITY.get(f['severity'], f['severity'])}], "
            f"cost {_cost(f['cost_share'])}{_explains(result, 'b', f['rule'])} (up to {_speedup(f['speedup'])}): "
            f"{f['summary']}"
        )
    for f in found["changed"]:
        lines.append(
            f"  changed:       {f['rule']} [{f['severity_a']} -> {f['severity_b']}], cost "
            f"{_cost(f['cost_share_a'])}{_explains(result, 'a', f['rule'])} -> "
            f"{_cost(f['cost_share_b'])}{_explains(result, 'b', f['rule'])} "
            f"(up to {_speedup(f['speedup_a'])} -> {_speedup(f['speedup_b'])})"
        )
    for f in found["unchanged"]:
        lines.append(f"  unchanged:     {f['rule']} [{f['severity_b']}], cost {_cost(f['cost_share_b'])}")
    if not any(found.values()):
        lines.append("  none in either run")
    if "change" in result:
        lines += ["", render_text(result["change"])]
    return "\n".join(lines)


def gate_config(args) -> GateConfig:
    """The gate's limits: ``--gate-config`` (or ./pyproject.toml's table when ``--gate`` is given), then
    ``--gate`` and ``--confidence`` over it."""
    try:
        if args.gate_config:
            config = load_config(args.gate_config)
        elif args.gate is not None and _has_gate_table("pyproject.toml"):
            config = load_config("pyproject.toml")
        else:
            config = GateConfig()
        step = parse_share(args.gate) if args.gate is not None else config.step_time
        confidence = args.confidence if args.confidence is not None else config.confidence
        return GateConfig(step_time=step, phases=config.phases, confidence=confidence)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None


def _has_gate_table(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return b"[tool.ranksight.gate" in f.read()


def report(result: dict, args) -> int:
    """Print the comparison (text, JSON or Markdown) and return the exit code."""
    change = result["change"]
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    elif args.markdown:
        print(render_markdown(result))
    else:
        print(render_comparison(result))
    if change["status"] == "incomparable":
        print(f"ranksight {args.command}: cannot compare: {change['reason']}", file=sys.stderr)
        return EXIT_INCOMPARABLE if (change["limits"]["step_time"] is not None or change["limits"]["phases"]) else 0
    return change["exit_code"]


def compare_sides(diag_a: dict, samples_a, diag_b: dict, samples_b, config: GateConfig, warmup: int) -> dict:
    """The side-by-side comparison with the change section (``change``) added."""
    from ranksight.dashboard import compare

    result = compare(diag_a, diag_b)
    result["explains"] = {side: _explained(d) for side, d in (("a", diag_a), ("b", diag_b))}
    result["change"] = assess(samples_a, samples_b, result["findings"], config, warmup)
    return result


def _explained(diag: dict) -> dict[str, list[str]]:
    """Per finding of a run, the findings it explains (their ``explained_by``)."""
    out: dict[str, list[str]] = {}
    for f in diag.get("findings", []):
        if f.get("explained_by"):
            out.setdefault(f["explained_by"], []).append(f["rule"])
    return out


def run(args) -> int:
    from ._gate_samples import read_samples
    from .diagnose import diagnose_or_fail

    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    config = gate_config(args)
    # ranksight.cli resolved both arguments to run folders (commands._paths.resolve_run).
    result = compare_sides(
        diagnose_or_fail(args.run_a, args.rules, args.warmup), read_samples(args.run_a, args.warmup),
        diagnose_or_fail(args.run_b, args.rules, args.warmup), read_samples(args.run_b, args.warmup),
        config, args.warmup,
    )  # fmt: skip
    return report(result, args)
