"""The Verdict page's tables as plain rows: a finding's evidence and the checklist, each figure with its unit.

Plain functions so they are tested without Streamlit; the page lays them out. Which checklist rows can apply
(``split_checklist``) is decided here once, for the page and for the report ``ranksight demo`` prints.
"""

from __future__ import annotations

import functools

from ._units import figure_text, unit_kind


@functools.lru_cache(maxsize=1)
def _rules():
    from ranksight.rules import load_rules

    return load_rules()


def _value_name(rule_id: str) -> str | None:
    """The feature a rule's compared ``value`` reads (its first name), for the value's unit."""
    rule = next((r for r in _rules().rules if r.id == rule_id), None)
    names = sorted(rule.value.names) if rule is not None and rule.value is not None else []
    return next((n for n in names if unit_kind(n) is not None), None)


def evidence_rows(finding: dict) -> list[dict]:
    """One row per evidence figure, with its unit. The rule's compared ``value`` is left out where it repeats
    a figure already shown (it is then the same number twice), else shown as "compared value"."""
    evidence = dict(finding.get("evidence") or {})
    value = evidence.pop("value", None)
    rows = [{"evidence": name, "value": figure_text(name, v)} for name, v in evidence.items()]
    if value is not None and not any(_same(value, v) for v in evidence.values()):
        name = _value_name(str(finding.get("rule", "")))
        rows.append({"evidence": "compared value", "value": figure_text(name or "", value)})
    return rows


def _same(a, b) -> bool:
    return isinstance(b, (int, float)) and abs(float(a) - float(b)) <= 1e-9 + 1e-4 * abs(float(a))


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


def checklist_rows(diag: dict) -> tuple[list[dict], str]:
    """The checklist rows that can apply to this run, each value with its unit, and one line naming the rows
    left out and why (as ``ranksight demo`` prints it): a CPU job has no GPU signal to judge."""
    shown, hidden = split_checklist(diag)
    names = {c.item: sorted(c.value.names) for c in _rules().checklist}
    rows = []
    for c in shown:
        name = next(iter(names.get(c.get("item"), [])), "")
        rows.append(
            {
                "status": c.get("status"),
                "item": c.get("item"),
                "group": c.get("group"),
                "value": figure_text(name, c.get("value")),
            }
        )
    line = "; ".join(hidden)
    if line:
        line = line.replace("GPU items hidden: CPU job", "GPU items hidden: they need a GPU, and this job ran on CPUs")
        line = line.replace("GPU item hidden: CPU job", "GPU item hidden: it needs a GPU, and this job ran on CPUs")
    return rows, line


__all__ = ["checklist_rows", "evidence_rows", "is_cpu_job", "split_checklist"]
