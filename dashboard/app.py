"""The dashboard's entry script: pick the source and the run, then hand over to the page.

Served by ``ranksight dashboard`` (``streamlit run`` on this file); each page under ``_pages/`` holds
layout only and reads data through ``_data`` (cached) and ``_queries`` (plain functions).
"""

import hashlib
import os

import streamlit as st

from ranksight.dashboard import _data, _source
from ranksight.dashboard._view import Context, clock_text, md_escape, page_mark, run_label, run_started

IDLE_TICKS = 5  # while no run is live, the clock ticks this many refresh intervals apart (to see a new run)

st.set_page_config(page_title="ranksight", layout="wide")

source = _source.from_env()
paths = [r["path"] for r in _data.runs(source.root)]

picker = st.session_state.get("_run_picker")
picked = st.session_state.get(picker) if picker else None
if picked in paths:  # the run chosen in the picker last drawn
    st.session_state["run_path"] = picked
wanted = st.query_params.get("run") or source.run
if "run_path" not in st.session_state or st.session_state["run_path"] not in paths:
    match = [p for p in paths if os.path.basename(p) == wanted]
    st.session_state["run_path"] = match[0] if match else (paths[0] if paths else None)
# The selected run's snapshot first: the runs listed below then tell it as the snapshot does.
snap = _data.snapshot(st.session_state["run_path"], source.refresh_s) if st.session_state["run_path"] else None
runs = tuple(_data.runs(source.root))
mark = page_mark(runs, snap)

with st.sidebar:
    st.markdown("### ranksight")
    if runs:
        # The browser keeps a picker's shown label until its choice changes: a picker keyed by the runs'
        # statuses is drawn anew when one changes, so a run that finished says so there too.
        statuses = "|".join(f"{r['path']}={r['status']}" for r in runs)
        st.session_state["_run_picker"] = "run_picker_" + hashlib.sha1(statuses.encode()).hexdigest()[:12]
        st.selectbox(
            "Run",
            paths,
            index=paths.index(st.session_state["run_path"]),
            key=st.session_state["_run_picker"],
            format_func=lambda p: run_label(next(r for r in runs if r["path"] == p)),
            help="job · start time · status · size · run id",
        )
        chosen = next((r for r in runs if r["path"] == st.session_state.get("run_path")), None)
        if chosen is not None:  # in full: the id, which a narrow sidebar cuts off in the picker, and the start
            st.text(f"{chosen['run']}\nstarted {run_started(chosen)}")
        if snap is not None and chosen is not None and snap.path == chosen["path"]:
            st.caption(md_escape(clock_text(snap)))
    else:
        st.caption(f"no runs under {md_escape(source.root)}")

selected = next((r for r in runs if r["path"] == st.session_state.get("run_path")), None)
if selected is not None:
    st.query_params["run"] = selected["run"]
    _data.prefetch(selected["path"])
else:
    snap = None
st.session_state["_ranksight_ctx"] = Context(source, runs, selected, snap)
st.session_state["_ranksight_mark"] = mark
watching = not runs or any(r["status"] == "live" for r in runs)


@st.fragment(run_every=source.refresh_s * (1 if watching else IDLE_TICKS))
def clock() -> None:
    """The page's clock: each tick asks the (shared, cheap) snapshot whether anything changed, and runs the
    whole page again only if so; otherwise it redraws this one line. While nothing is live it ticks
    ``IDLE_TICKS`` times slower, to notice a new run."""
    path = st.session_state.get("run_path")
    now = _data.snapshot(path, source.refresh_s) if path and selected is not None else None
    if page_mark(_data.runs(source.root), now) != st.session_state.get("_ranksight_mark"):
        st.rerun()
    if now is not None:
        st.caption(md_escape(clock_text(now)))


clock()

here = os.path.dirname(os.path.abspath(__file__))
pages = [
    st.Page(
        os.path.join(here, "_pages", "verdict.py"),
        title="Verdict",
        icon=":material/stethoscope:",
        url_path="verdict",
        default=True,
    ),
    st.Page(os.path.join(here, "_pages", "runs.py"), title="Runs", icon=":material/folder_open:", url_path="runs"),
    st.Page(
        os.path.join(here, "_pages", "breakdown.py"),
        title="Step-time breakdown",
        icon=":material/timer:",
        url_path="breakdown",
    ),
    st.Page(
        os.path.join(here, "_pages", "heatmaps.py"),
        title="Per-rank heatmaps",
        icon=":material/grid_on:",
        url_path="heatmaps",
    ),
    st.Page(
        os.path.join(here, "_pages", "signals.py"), title="Signals", icon=":material/monitoring:", url_path="signals"
    ),
    st.Page(
        os.path.join(here, "_pages", "compare.py"),
        title="Compare two runs",
        icon=":material/compare_arrows:",
        url_path="compare",
    ),
]
if source.prometheus:
    pages.append(
        st.Page(
            os.path.join(here, "_pages", "prometheus.py"),
            title="Prometheus",
            icon=":material/database:",
            url_path="prometheus",
        )
    )
with st.sidebar:
    if selected is not None:
        st.caption(
            f"● live: refreshing every {source.refresh_s:.0f} s"
            if selected["status"] == "live"
            else f"run {selected['status']}"
        )
st.navigation(pages).run()
