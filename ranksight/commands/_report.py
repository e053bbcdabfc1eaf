"""The short report a command prints after a job: one verdict line, and the checklist rows that can apply.

``ranksight demo`` and ``ranksight run`` end with these; ``ranksight diagnose`` prints the full report.
"""

from __future__ import annotations

from ranksight.dashboard import fix_gain_text

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


def is_cpu_job(result: dict) -> bool:
    """No rank measured anything on a GPU (the H2D copy is timed on GPU ranks only)."""
    ranks = result.get("breakdown", {}).get("ranks", [])
    return bool(ranks) and all(r.get("h2d_share") is None for r in ranks)


HOST_SAMPLES = ("process_cpu_cores", "host_load_ratio")


def _gpu_names() -> frozenset[str]:
    """Features only a GPU rank can have: the GPU samples, and figures the collectors describe as GPU ones."""
    from ranksight.collectors import FEATURES
    from ranksight.format.schema import SAMPLE_NAMES

    return frozenset(n for n in SAMPLE_NAMES if n not in HOST_SAMPLES) | frozenset(
        n for n, text in FEATURES.items() if "GPU" in str(text)
    )


def split_checklist(result: dict, rules_dir: str | None = None) -> tuple[list[dict], list[str]]:
    """The checklist rows that can apply to this job, and one phrase per kind of row hidden (with why).

    A row is n/a when the run has no such signal: on a CPU job every GPU signal; a torch.compile row
    when the model is not compiled; a row whose condition does not hold (one DDP bucket cannot overlap).
    """
    from ranksight.rules import load_rules

    items = {c.item: c for c in load_rules(rules_dir).checklist}
    gpu_names, cpu = _gpu_names(), is_cpu_job(result)
    shown, counts, conditions = [], {"gpu": 0, "compile": 0, "condition": 0, "other": 0}, []
    for row in result.get("checklist", []):
        item = items.get(row.get("item"))
        names = (item.value.names | (item.when.names if item.when else frozenset())) if item else frozenset()
        if row.get("status") != "n/a":
            shown.append(row)
        elif "compiled" in names:
            counts["compile"] += 1
        elif cpu and names & gpu_names:
            counts["gpu"] += 1
        elif item is not None and item.when is not None:
            counts["condition"] += 1
            conditions.append(item.when.text)
        else:
            counts["other"] += 1
    phrases = {
        "gpu": "GPU item{s} hidden: CPU job",
        "compile": "torch.compile item{s} hidden: model not compiled",
        "condition": "item{s} hidden: {when} does not hold",
        "other": "item{s} hidden: not measured in this run",
    }
    hidden = [
        f"{n} " + phrases[key].format(s="s" if n > 1 else "", when=" / ".join(conditions))
        for key, n in counts.items()
        if n
    ]
    return shown, hidden


def render_applicable_checklist(result: dict, rules_dir: str | None = None) -> str:
    """The checklist without the rows that cannot apply, and a line saying how many were hidden and why."""
    from .diagnose import render_checklist

    shown, hidden = split_checklist(result, rules_dir)
    parts = [render_checklist({**result, "checklist": shown})] if shown else ["(no checklist item applies)"]
    if hidden:
        parts.append("; ".join(hidden) + " (ranksight diagnose lists every row)")
    return "\n".join(parts)
