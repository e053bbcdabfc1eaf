"""Verdict first: the rules' findings (root cause first) with their cost, evidence, ranks and the fix, the
per-rank step breakdown beside the first one; the checklist below."""

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._queries import fix_gain_text
from ranksight.dashboard._verdict_rows import checklist_rows, evidence_rows
from ranksight.dashboard._view import (
    code_html,
    context,
    guard,
    live_panel,
    md_escape,
    md_table,
    require_run,
    share_sentence,
    stacked_by_rank_svg,
)
from ranksight.format.phases import breakdown_total

_COLORS = {"critical": "red", "warning": "orange", "info": "blue"}
ctx = context()
st.title("Verdict")


def verdict(path: str) -> None:
    with guard("the diagnosis"):  # made by the refresh that drew the clock: no spinner pushes the page down
        diag = _data.diagnosis(path)
        if note := _data.provisional_note(path):
            st.warning(note, icon="⏳")
        if note := _data.verdict_note(path):  # the clock has moved on since the verdict was made
            st.caption(note)
        # The diagnosis carries the per-rank breakdown: the landing page needs no other pass over the steps.
        rows = diag.get("breakdown", {}).get("ranks", [])
        total = breakdown_total(rows)
        if total["rows"]:
            st.markdown(f"**Where step time goes** (all ranks, after warm-up): {md_escape(share_sentence(total))}")
        else:
            st.info("no steps recorded yet: the first records appear after one flush interval (2 s by default)")
        findings = diag.get("findings", [])
        first, chart = st.columns([3, 2]) if total["rows"] else (st.container(), None)
        with first:
            if findings:
                _finding(0, findings[0])
            else:
                st.success("no findings: nothing in this run crosses a rule's threshold")
        if chart is not None:
            with chart:
                st.markdown("**Step time per rank** (share of each phase, after warm-up)")
                named = [r for f in findings for r in (f.get("ranks") or [])]
                # markdown's raw HTML: st.html's sanitiser keeps no SVG
                st.markdown(stacked_by_rank_svg(rows, named), unsafe_allow_html=True)
        for i, f in enumerate(findings[1:], start=1):
            _finding(i, f)
        if diag.get("checklist"):
            st.subheader("Checklist")
            shown, hidden = checklist_rows(diag)
            if shown:
                st.markdown(md_table(shown))
            else:
                st.markdown("No checklist item applies to this run.")
            if hidden:
                st.caption(md_escape(hidden))


def _finding(i: int, f: dict) -> None:
    """One finding: rule, severity, confidence, ranks, what fixing it is worth, summary, evidence, fix."""
    with st.container(border=True):
        severity = str(f.get("severity", "?"))
        st.markdown(f"#### {i + 1}. {md_escape(f.get('rule', '?'))}")
        st.markdown(
            f":{_COLORS.get(severity, 'gray')}-badge[{md_escape(severity)}] {md_escape(f.get('axis', '?'))} · "
            f"confidence {float(f.get('confidence') or 0):.0%} · ranks "
            f"{md_escape(_ranks(f.get('ranks') or []))}"
        )
        gain = fix_gain_text(f)
        if gain:
            st.markdown(f"**{md_escape(gain)}**")
        st.text(f.get("summary", ""))
        evidence = evidence_rows(f)
        if evidence:
            st.markdown(md_table(evidence))
        fix = f.get("fix") or {}
        if fix.get("text"):
            st.markdown(f"**Fix:** {md_escape(fix['text'])}")
        if fix.get("snippet"):
            # Wrapped, not scrolled: in the card beside the chart a long line was cut at the card's edge.
            st.html(code_html(fix["snippet"], wrap=True))


def _ranks(ranks: list) -> str:
    return (
        "all" if not ranks else ", ".join(map(str, ranks[:16])) + (f" (+{len(ranks) - 16})" if len(ranks) > 16 else "")
    )


if require_run(ctx):
    st.text(f"run: {ctx.run['run']}")
    live_panel(ctx, verdict, ctx.run["path"])
    _data.landing_drawn(ctx.run["path"])
