"""Verdict first: the rules' findings (root cause first) with evidence, ranks and the fix; the checklist."""

from typing import Optional

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._queries import total_from_breakdown
from ranksight.dashboard._view import context, guard, live_panel, md_escape, require_run, share_sentence

_COLORS = {"critical": "red", "warning": "orange", "info": "blue"}
ctx = context()
st.title("Verdict")


def verdict(path: str) -> None:
    with guard("the diagnosis"), st.spinner("diagnosing the run ..."):
        diag = _data.diagnosis(path)
        # The diagnosis carries the per-rank breakdown: the landing page needs no other pass over the steps.
        total = total_from_breakdown(diag.get("breakdown", {}).get("ranks", []))
        if total["rows"]:
            st.markdown(f"**Where step time goes** (all ranks, after warm-up): {md_escape(share_sentence(total))}")
        else:
            st.info("no steps recorded yet: the first records appear after one flush interval (2 s by default)")
        findings = diag.get("findings", [])
        if not findings:
            st.success("no findings: nothing in this run crosses a rule's threshold")
        for i, f in enumerate(findings):
            with st.container(border=True):
                severity = str(f.get("severity", "?"))
                st.markdown(f"#### {i + 1}. {md_escape(f.get('rule', '?'))}")
                st.markdown(
                    f":{_COLORS.get(severity, 'gray')}-badge[{md_escape(severity)}] {md_escape(f.get('axis', '?'))} · "
                    f"confidence {float(f.get('confidence') or 0):.0%} · ranks "
                    f"{md_escape(_ranks(f.get('ranks') or []))}"
                )
                st.text(f.get("summary", ""))
                evidence = f.get("evidence") or {}
                if evidence:
                    st.table([{"evidence": k, "value": _fmt(v)} for k, v in evidence.items()])
                fix = f.get("fix") or {}
                if fix.get("text"):
                    st.markdown(f"**Fix:** {md_escape(fix['text'])}")
                if fix.get("snippet"):
                    st.code(fix["snippet"], language="python")
        checklist = diag.get("checklist", [])
        if checklist:
            st.subheader("Checklist")
            st.table(
                [
                    {
                        "status": c.get("status"),
                        "item": c.get("item"),
                        "group": c.get("group"),
                        "value": _fmt(c.get("value"), c.get("unit")),
                    }
                    for c in checklist
                ]
            )


def _ranks(ranks: list) -> str:
    return (
        "all" if not ranks else ", ".join(map(str, ranks[:16])) + (f" (+{len(ranks) - 16})" if len(ranks) > 16 else "")
    )


def _fmt(v, unit: Optional[str] = None) -> str:
    if v is None:
        return "—"
    if unit == "ratio":
        return f"{100 * v:.1f} %"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


if require_run(ctx):
    st.text(f"run: {ctx.run['run']}")
    live_panel(ctx, verdict, ctx.run["path"])
