"""Step-time breakdown: stacked phase shares per rank and over time."""

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._charts import stacked_by_rank, stacked_over_time
from ranksight.dashboard._queries import breakdown_over_time, breakdown_per_rank, rollup_total
from ranksight.dashboard._view import (
    context,
    guard,
    live_panel,
    md_escape,
    ms,
    pct,
    require_run,
    share_sentence,
)

ctx = context()
st.title("Step-time breakdown")


def per_rank(path: str) -> None:
    with guard("the per-rank breakdown"):
        total = _data.pull(path, rollup_total)
        if not total["rows"]:
            st.info("no steps recorded yet")
            return
        st.markdown(f"**All ranks:** {md_escape(share_sentence(total))} · mean step {ms(total['step_mean_s'])}")
        if not total["h2d_measured"]:
            st.caption("H2D copy time is measured on GPUs only (absent on this run)")
        rows = _data.pull(path, breakdown_per_rank)
        st.vega_lite_chart(spec=stacked_by_rank(rows), width="stretch")
        with st.expander("per-rank table"):
            st.dataframe(
                [
                    {
                        "rank": r["rank"],
                        "node": r["node"],
                        "steps": r["steps"],
                        "mean step": ms(r["step_mean_s"]),
                        "worst step": ms(r["step_max_s"]),
                        "data wait": pct(r["data_wait_share"]),
                        "compute": pct(r["compute_share"]),
                        "exposed comm": pct(r["comm_exposed_share"]),
                        "optimizer": pct(r["optimizer_share"]),
                        "other": pct(r["other_share"]),
                        "all-reduce (overlapped or not)": pct(r["allreduce_share"]),
                    }
                    for r in rows
                ],
                hide_index=True,
                width="stretch",
            )


def over_time(path: str) -> None:
    with guard("the breakdown over time"):
        rows = _data.pull(path, breakdown_over_time)
        if rows:
            st.subheader("Over time (all ranks)")
            st.vega_lite_chart(spec=stacked_over_time(rows), width="stretch")


if require_run(ctx):
    st.text(f"run: {ctx.run['run']}")
    live_panel(ctx, per_rank, ctx.run["path"])
    live_panel(ctx, over_time, ctx.run["path"])
