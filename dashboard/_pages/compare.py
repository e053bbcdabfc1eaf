"""Compare two runs (before / after a fix): step time, throughput, each share; findings appeared or cleared."""

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._queries import compare_runs, findings_delta
from ranksight.dashboard._view import context, guard, require_run, run_label

ctx = context()
st.title("Compare two runs")


def _fmt(v, unit):
    if v is None:
        return "—"
    return {"s": f"{1000 * v:.1f} ms", "ratio": f"{100 * v:.1f} %", "steps/s": f"{v:.2f} steps/s"}[unit]


def _fmt_delta(v, unit):
    if v is None:
        return "—"
    return {"s": f"{1000 * v:+.1f} ms", "ratio": f"{100 * v:+.1f} pt", "steps/s": f"{v:+.2f} steps/s"}[unit]


if require_run(ctx):
    others = ctx.other_runs()
    if not others:
        st.info("only one run so far: run the job again after a change (or `ranksight demo --fault none`) to compare")
    else:
        labels = {r["path"]: run_label(r) for r in ctx.runs}
        st.text(f"A (before): {labels[ctx.run['path']]}")
        b_path = st.selectbox("B (after)", [r["path"] for r in others], format_func=labels.get)
        with guard("the comparison"):
            rows = _data.pull_pair(ctx.run["path"], b_path, compare_runs)
            st.table(
                [
                    {
                        "metric": r["metric"],
                        "A": _fmt(r["a"], r["unit"]),
                        "B": _fmt(r["b"], r["unit"]),
                        "B - A": _fmt_delta(r["delta"], r["unit"]),
                        "relative": "—" if r["relative"] is None else f"{100 * r['relative']:+.1f} %",
                    }
                    for r in rows
                ]
            )
        with guard("the findings of both runs"):
            delta = findings_delta(_data.diagnosis(ctx.run["path"]), _data.diagnosis(b_path))
            c = st.columns(3)
            titles = ("cleared in B", "appeared in B", "in both")
            for col, key, title in zip(c, ("cleared", "appeared", "kept"), titles):
                col.markdown(f"**{title}**")
                col.text("\n".join(delta[key]) or "none")
