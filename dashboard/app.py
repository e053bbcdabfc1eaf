"""The dashboard's entry script: pick the source and the run, then hand over to the page.

Served by ``ranksight dashboard`` (``streamlit run`` on this file); each page under ``pages/`` holds
layout only and reads data through ``_data`` (cached) and ``_queries`` (plain functions).
"""

import os

import streamlit as st

from ranksight.dashboard import _data, _source
from ranksight.dashboard._view import Context, md_escape, run_label

st.set_page_config(page_title="ranksight", page_icon="📉", layout="wide")

source = _source.from_env()
runs = tuple(_data.runs(source.root))
paths = [r["path"] for r in runs]

wanted = st.query_params.get("run") or source.run
if "run_path" not in st.session_state or st.session_state["run_path"] not in paths:
    match = [p for p in paths if os.path.basename(p) == wanted]
    st.session_state["run_path"] = match[0] if match else (paths[0] if paths else None)

with st.sidebar:
    st.markdown("### ranksight")
    if runs:
        st.selectbox(
            "Run",
            paths,
            key="run_path",
            format_func=lambda p: run_label(next(r for r in runs if r["path"] == p)),
        )
    else:
        st.caption(f"no runs under {md_escape(source.root)}")

selected = next((r for r in runs if r["path"] == st.session_state.get("run_path")), None)
if selected is not None:
    st.query_params["run"] = selected["run"]
st.session_state["_ranksight_ctx"] = Context(source, runs, selected)

here = os.path.dirname(os.path.abspath(__file__))
pages = [
    st.Page(os.path.join(here, "pages", "verdict.py"), title="Verdict", icon="🩺", url_path="verdict", default=True),
    st.Page(os.path.join(here, "pages", "runs.py"), title="Runs", icon="🗂️", url_path="runs"),
    st.Page(os.path.join(here, "pages", "breakdown.py"), title="Step-time breakdown", icon="⏱️", url_path="breakdown"),
    st.Page(os.path.join(here, "pages", "heatmaps.py"), title="Per-rank heatmaps", icon="🟥", url_path="heatmaps"),
    st.Page(os.path.join(here, "pages", "signals.py"), title="Signals", icon="📈", url_path="signals"),
    st.Page(os.path.join(here, "pages", "compare.py"), title="Compare two runs", icon="⚖️", url_path="compare"),
]
if source.prometheus:
    pages.append(
        st.Page(os.path.join(here, "pages", "prometheus.py"), title="Prometheus", icon="🔥", url_path="prometheus")
    )
with st.sidebar:
    if selected is not None:
        st.caption(
            f"● live: refreshing every {source.refresh_s:.0f} s"
            if selected["status"] == "live"
            else f"run {selected['status']}"
        )
st.navigation(pages).run()
