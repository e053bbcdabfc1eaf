"""Per-rank heatmaps: rank x time for each metric, worst ranks first; stragglers listed below."""

import streamlit as st

from ranksight.collectors import Rollup
from ranksight.dashboard import _data
from ranksight.dashboard._charts import heatmap_chart, heatmap_scale_text
from ranksight.dashboard._queries import (
    HEATMAP_METRICS,
    RANK_ORDERS,
    heatmap,
    rank_order,
    rank_outliers,
    step_heatmaps,
)
from ranksight.dashboard._view import context, guard, live_panel, md_escape, ms, require_run

SOLO_ROWS = 16  # above the row limit, the worst ranks keep a row each; the rest are grouped
ctx = context()
st.title("Per-rank heatmaps")


def panel(path: str, metric: str, order: str, bins: int, max_rows: int) -> None:
    m = HEATMAP_METRICS[metric]
    with guard(m.label):
        ranks = _data.pull(path, rank_order, order)
        if not ranks:
            if metric == "step_s":
                st.info("no steps recorded yet: the first records appear after one flush interval (2 s by default)")
            return
        chunk = _data.rollup(path).chunk_steps
        if m.source == "steps":  # every step metric's panel takes its heatmap from one pull of them all
            hm = _data.pull(path, step_heatmaps, ranks, bins, max_rows, SOLO_ROWS, chunk)[metric]
        else:
            hm = _data.pull(path, heatmap, metric, ranks, bins, max_rows, SOLO_ROWS, chunk)
        st.subheader(m.label)
        if not hm["cells"]:
            st.caption(f"{m.label}: not recorded on this run (GPU signals are absent on a CPU job or without NVML)")
            return
        if hm["group"] > 1:
            st.caption(
                f"{len(ranks)} ranks: the {SOLO_ROWS} worst one per row, then {hm['group']} per row "
                "(each shows its worst member)"
            )
        st.vega_lite_chart(spec=heatmap_chart(hm), width="stretch")
        st.caption(f"rows: ranks worst first ({md_escape(order)}) · {heatmap_scale_text(hm)}")


def outliers(path: str) -> None:
    with guard("the straggler table"):
        rows = _data.pull(path, rank_outliers, 10)
        st.subheader("Least compute-efficient ranks")
        st.caption("compute score = fastest rank's compute time / this rank's (1.0 = as fast as the best)")
        st.dataframe(
            [
                {
                    "rank": r["rank"],
                    "node": r["node"],
                    "compute score": round(r["compute_score"] or 0, 3),
                    "mean compute": ms(r["compute_mean_s"]),
                    "mean step": ms(r["step_mean_s"]),
                    "mean data wait": ms(r["data_wait_mean_s"]),
                    "mean exposed comm": ms(r["comm_exposed_mean_s"]),
                }
                for r in rows
            ],
            hide_index=True,
            width="stretch",
        )


if require_run(ctx):
    st.text(f"run: {ctx.run['run']}")
    c = st.columns(3)
    order = c[0].selectbox("sort ranks by", list(RANK_ORDERS))
    bins = c[1].slider("columns at most (steps per column double when they fill)", 10, Rollup.max_columns, 60, step=10)
    max_rows = c[2].slider("rows at most (ranks are grouped above)", 16, 256, 128, step=16)
    live_panel(ctx, outliers, ctx.run["path"])
    for key in HEATMAP_METRICS:
        live_panel(ctx, panel, ctx.run["path"], key, order, bins, max_rows)
