"""``ranksight compare RUN_A RUN_B [--json]``: did the change between two runs make steps faster, and why?

Both runs are diagnosed, then compared by ``ranksight.dashboard.compare`` -- the function the
dashboard's Compare page uses -- so the terminal and the page show the same figures.
"""

from __future__ import annotations

import json

from ranksight.format.warmup import WARMUP_STEPS

from ._errors import UserError
from ._format import table

_SEVERITY = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}


def add_parser(sub):
    p = sub.add_parser(
        "compare",
        help="compare two runs: step time, phase shares and findings, B against A",
        description="Compare run B against run A (e.g. before and after a fix): step time and each phase's "
        "share side by side with B - A, the findings that appeared, disappeared or changed cost, and the "
        "step-time speedup of B over A. A run is a run folder, a run id, or a folder of runs (its latest run).",
    )
    p.add_argument("run_a", metavar="RUN_A", help="the run before (a run folder or run id)")
    p.add_argument("run_b", metavar="RUN_B", help="the run after")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help=f"leading steps per rank to leave out (default {WARMUP_STEPS})"
    )
    p.add_argument("--rules", metavar="DIR", default=None, help="extra rule files (*.yaml); same id overrides")
    return p


def _value(v, unit: str) -> str:
    if v is None:
        return "–"
    return {"s": f"{1000 * v:.1f} ms", "ratio": f"{100 * v:.1f} %", "steps/s": f"{v:.2f}/s"}[unit]


def _delta(v, unit: str) -> str:
    if v is None:
        return "–"
    return {"s": f"{1000 * v:+.1f} ms", "ratio": f"{100 * v:+.1f} pt", "steps/s": f"{v:+.2f}/s"}[unit]


def _cost(c) -> str:
    return "–" if c is None else f"{100 * c:.0f} %"


def _speedup(s) -> str:
    return "–" if not s else f"{s:.2f}×"


def render_comparison(result: dict) -> str:
    """The comparison as text: the speedup first, the figures side by side, then the findings' changes."""
    from ranksight.dashboard import speedup_sentence

    rows = [
        [
            m["metric"],
            _value(m["a"], m["unit"]),
            _value(m["b"], m["unit"]),
            _delta(m["delta"], m["unit"]),
            "–" if m["relative"] is None else f"{100 * m['relative']:+.1f} %",
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
            f"cost in A {_cost(f['cost_share'])} (up to {_speedup(f['speedup'])})"
        )
    for f in found["appeared"]:
        lines.append(
            f"  new in B:      {f['rule']} [{_SEVERITY.get(f['severity'], f['severity'])}], "
            f"cost {_cost(f['cost_share'])} (up to {_speedup(f['speedup'])}): {f['summary']}"
        )
    for f in found["changed"]:
        lines.append(
            f"  changed:       {f['rule']} [{f['severity_a']} -> {f['severity_b']}], cost "
            f"{_cost(f['cost_share_a'])} -> {_cost(f['cost_share_b'])} "
            f"(up to {_speedup(f['speedup_a'])} -> {_speedup(f['speedup_b'])})"
        )
    for f in found["unchanged"]:
        lines.append(f"  unchanged:     {f['rule']} [{f['severity_b']}], cost {_cost(f['cost_share_b'])}")
    if not any(found.values()):
        lines.append("  none in either run")
    return "\n".join(lines)


def run(args) -> int:
    from ranksight.dashboard import compare

    from .diagnose import diagnose_or_fail

    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    # ranksight.cli resolved both arguments to run folders (commands._paths.resolve_run).
    result = compare(
        diagnose_or_fail(args.run_a, args.rules, args.warmup), diagnose_or_fail(args.run_b, args.rules, args.warmup)
    )
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(render_comparison(result))
    return 0
