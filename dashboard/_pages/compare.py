"""Compare two runs (before / after a fix): the step-time speedup, figures side by side, findings' changes.

The figures come from ``ranksight.dashboard._compare.compare`` over the two runs' diagnoses: the same
function ``ranksight compare A B`` prints.
"""

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._compare import compare, speedup_sentence
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


def _cost(c):
    return "—" if c is None else f"{100 * c:.0f} %"


def _speedup(s):
    return "—" if not s else f"{s:.2f}×"


def _findings_table(found: dict) -> list[dict]:
    rows = []
    for f in found["disappeared"]:
        rows.append(
            {
                "finding": f["rule"],
                "change": "gone in B",
                "severity": f["severity"],
                "cost A": _cost(f["cost_share"]),
                "cost B": "—",
                "fix worth (A → B)": f"{_speedup(f['speedup'])} → —",
            }
        )
    for f in found["appeared"]:
        rows.append(
            {
                "finding": f["rule"],
                "change": "new in B",
                "severity": f["severity"],
                "cost A": "—",
                "cost B": _cost(f["cost_share"]),
                "fix worth (A → B)": f"— → {_speedup(f['speedup'])}",
            }
        )
    for key, label in (("changed", "changed"), ("unchanged", "unchanged")):
        for f in found[key]:
            severity = (
                f["severity_b"] if f["severity_a"] == f["severity_b"] else f"{f['severity_a']} → {f['severity_b']}"
            )
            rows.append(
                {
                    "finding": f["rule"],
                    "change": label,
                    "severity": severity,
                    "cost A": _cost(f["cost_share_a"]),
                    "cost B": _cost(f["cost_share_b"]),
                    "fix worth (A → B)": f"{_speedup(f['speedup_a'])} → {_speedup(f['speedup_b'])}",
                }
            )
    return rows


if require_run(ctx):
    others = ctx.other_runs()
    if not others:
        st.info("only one run so far: run the job again after a change (or `ranksight demo --fault none`) to compare")
    else:
        labels = {r["path"]: run_label(r) for r in ctx.runs}
        st.text(f"A (before): {labels[ctx.run['path']]}")
        b_path = st.selectbox("B (after)", [r["path"] for r in others], format_func=labels.get)
        with guard("the comparison"), st.spinner("diagnosing both runs ..."):
            result = compare(_data.diagnosis(ctx.run["path"]), _data.diagnosis(b_path))
            for name, path in (("A", ctx.run["path"]), ("B", b_path)):
                if note := _data.verdict_note(path):  # a live run's verdict trails its clock (REJUDGE_GROWTH)
                    st.caption(f"{name}: {note}")
            st.markdown(f"**{speedup_sentence(result)}**")
            st.table(
                [
                    {
                        "metric": m["metric"],
                        "A": _fmt(m["a"], m["unit"]),
                        "B": _fmt(m["b"], m["unit"]),
                        "B - A": _fmt_delta(m["delta"], m["unit"]),
                        "relative": "—" if m["relative"] is None else f"{100 * m['relative']:+.1f} %",
                    }
                    for m in result["metrics"]
                    if m["a"] is not None or m["b"] is not None
                ]
            )
            st.subheader("Findings")
            st.caption(
                "cost: the share of step time a rule says its fix gives back; "
                "fix worth: how much faster steps could get by fixing it"
            )
            rows = _findings_table(result["findings"])
            if rows:
                st.table(rows)
            else:
                st.text("no findings in either run")
