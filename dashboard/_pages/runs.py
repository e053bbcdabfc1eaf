"""Runs: every run under the root, live ones marked; the selected run's headline numbers."""

import time

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._queries import run_overview
from ranksight.dashboard._view import NO_RUNS, context, guard, live_panel, md_escape, md_table, ms

ctx = context()
st.title("Runs")
st.caption(f"reading runs from: {md_escape(ctx.source.root)}")
if not ctx.runs:
    st.info(NO_RUNS)
else:
    table = [
        {
            "status": "● live" if r["status"] == "live" else r["status"],
            "run": r["run"],
            "job": r["job"],
            "ranks": f"{r['ranks']}/{r['world_size']}",
            "steps": r["steps"],
            "duration s": round(r["duration_s"], 1),
            "last update": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_update_ns"] / 1e9)),
        }
        for r in ctx.runs
    ]
    # A markdown table, not a canvas: readable by screen readers and by a test, and cheap to send at each refresh.
    st.markdown(md_table(table))


def overview(path: str) -> None:
    with guard("the run overview"):
        o = _data.pull(path, run_overview)
        c = st.columns(4)
        c[0].metric("ranks", o["ranks"])
        c[1].metric("steps", o["steps"] or 0)
        c[2].metric("mean step time", ms(o["step_mean_s"]))
        c[3].metric("throughput", "—" if not o["throughput_steps_s"] else f"{o['throughput_steps_s']:.2f} steps/s")
        left_out = _data.skipped(path)
        if left_out:
            more = f" (and {len(left_out) - 1} more)" if len(left_out) > 1 else ""
            st.warning(f"left out, unreadable: {left_out[0]}{more}", icon="⚠️")


if ctx.run is not None:
    st.subheader("Selected run")
    st.text(ctx.run["run"])
    live_panel(ctx, overview, ctx.run["path"])
