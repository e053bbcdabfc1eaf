"""The short report a command prints after a job: one verdict line, and the checklist rows that can apply.

``ranksight demo`` and ``ranksight run`` end with these; ``ranksight diagnose`` prints the full report.
"""

from __future__ import annotations

from ranksight.dashboard import fix_gain_text, split_checklist

_SEVERITY = {"critical": "CRITICAL", "warning": "WARNING", "info": "info"}
GPU_GROUPS = ("memory planning", "kernels")


def verdict_line(result: dict) -> str:
    """The first finding that is a warning or worse, in one line; or that none is."""
    serious = [f for f in result.get("findings", []) if f.get("severity") != "info"]
    if not serious:
        return "verdict: no warning or critical finding: nothing in the rules says this run is held back"
    f = serious[0]
    gain = fix_gain_text(f)
    return f"verdict: [{_SEVERITY.get(f['severity'], f['severity'])}] {f['rule']}: {f['summary']}" + (
        f" ({gain})" if gain else ""
    )


def render_applicable_checklist(result: dict, rules_dir: str | None = None) -> str:
    """The checklist without the rows that cannot apply, and a line saying how many were hidden and why."""
    from .diagnose import render_checklist

    shown, hidden = split_checklist(result, rules_dir)
    parts = [render_checklist({**result, "checklist": shown})] if shown else ["(no checklist item applies)"]
    if hidden:
        parts.append("; ".join(hidden) + " (ranksight diagnose lists every row)")
    return "\n".join(parts)
