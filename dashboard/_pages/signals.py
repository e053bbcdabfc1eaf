"""Signals: graph breaks and recompiles with reasons; allocator fragmentation; GPU util beside kernel-busy share."""

import streamlit as st

from ranksight.dashboard import _data
from ranksight.dashboard._charts import series_chart, util_chart
from ranksight.dashboard._queries import (
    FRAGMENTATION_SIGNALS,
    UTILIZATION_SIGNALS,
    compile_events,
    sample_per_rank,
    sample_series,
)
from ranksight.dashboard._view import context, guard, live_panel, require_run

ctx = context()
st.title("Signals")


def compile_panel(path: str) -> None:
    with guard("graph breaks and recompiles"):
        st.subheader("Graph breaks and recompiles")
        rows = _data.pull(path, compile_events)
        if not rows:
            st.caption("none recorded (the model is not compiled, or compiled without breaks)")
            return
        st.dataframe(
            [{k: r[k] for k in ("kind", "reason", "count", "ranks", "first_step", "last_step")} for r in rows],
            hide_index=True,
            width="stretch",
        )


def memory_panel(path: str) -> None:
    with guard("allocator signals"):
        st.subheader("Allocator fragmentation and retries")
        rows = _data.pull(path, sample_series, FRAGMENTATION_SIGNALS)
        if not rows:
            st.caption("absent: the CUDA caching allocator is sampled on GPU jobs only")
            return
        st.altair_chart(series_chart(rows), width="stretch")


def util_panel(path: str) -> None:
    with guard("GPU utilization"):
        st.subheader("GPU utilization (NVML) beside kernel-busy share")
        rows = _data.pull(path, sample_per_rank, UTILIZATION_SIGNALS)
        if not rows:
            st.caption("absent: NVML utilization and the sampled kernel window exist on GPU jobs only")
            return
        st.altair_chart(util_chart(rows), width="stretch")
        st.caption(
            "NVML counts time when any kernel ran; kernel-busy share is the union of kernel intervals "
            "in a sampled window. A high NVML value over a low busy share means short, sparse kernels."
        )


if require_run(ctx):
    st.text(f"run: {ctx.run['run']}")
    for body in (compile_panel, memory_panel, util_panel):
        live_panel(ctx, body, ctx.run["path"])
