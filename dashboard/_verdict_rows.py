"""The Verdict page's tables as plain rows: a finding's evidence and the checklist, each figure with its unit.

Plain functions so they are tested without Streamlit; the page lays them out.
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


def checklist_rows(diag: dict) -> tuple[list[dict], str]:
    """The checklist rows that can apply to this run, each value with its unit, and one line naming the rows
    left out and why (as ``ranksight demo`` prints it): a CPU job has no GPU signal to judge."""
    from ranksight.commands._report import split_checklist

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


__all__ = ["checklist_rows", "evidence_rows"]
