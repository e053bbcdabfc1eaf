"""Prometheus: the latest per-rank values of every run the server scrapes (multi-node jobs)."""

import streamlit as st

from ranksight.collectors import PrometheusError
from ranksight.dashboard import _data
from ranksight.dashboard._view import context

ctx = context()
st.title("Prometheus")
st.text(f"server: {ctx.source.prometheus}")


@st.fragment(run_every=max(5.0, ctx.source.refresh_s))
def snapshot() -> None:
    try:
        snap = _data.prometheus_snapshot(ctx.source.prometheus)
    except PrometheusError as exc:
        st.error(str(exc).splitlines()[0])
        return
    if not snap["runs"]:
        st.info("Prometheus has no ranksight series yet: start the job with the Prometheus endpoint enabled")
    for run, ranks in snap["ranks"].items():
        st.subheader("run")
        st.text(run)
        st.dataframe(ranks, hide_index=True, width="stretch")


snapshot()
