"""The Altair (Vega-Lite) charts of the pages after the landing page.

Why a module of their own: importing altair takes a good part of a second on 2 cores, more while the
server's warm-up diagnoses; the Verdict page (the landing page, ``_view.stacked_by_rank_svg``) does without
it, so its first render does not wait for that import.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._queries import PHASE_LABELS, rank_bars
from ._view import PHASE_COLORS, PHASE_ORDER


def shares_long(rows: list[dict], index: str) -> pd.DataFrame:
    """Rows with ``<phase>_share`` columns -> long frame (index, phase, share) for stacked charts."""
    recs = []
    for r in rows:
        for key, label in PHASE_LABELS.items():
            v = r.get(f"{key[:-2]}_share")
            if v is not None:
                recs.append({index: r[index], "phase": label, "share": float(v)})
    return pd.DataFrame(recs, columns=[index, "phase", "share"])


def _phase_colors(df: pd.DataFrame) -> alt.Scale:
    """The phases present (H2D is absent on a CPU job: no legend entry for it), each in its fixed colour."""
    present = [p for p in PHASE_ORDER if p in set(df["phase"])] or PHASE_ORDER
    return alt.Scale(domain=present, range=[PHASE_COLORS[PHASE_ORDER.index(p)] for p in present])


def stacked_by_rank(rows: list[dict], named=()) -> alt.Chart:
    """Each rank's phase shares, a bar per rank; above ``BARS_AT_MOST`` ranks the ones that stand out
    (``named`` first) and one bar for the others' mean (``rank_bars``)."""
    bars, title = rank_bars(rows, named)
    df = shares_long([{**r, "bar": label} for label, r in bars], "bar")
    x = alt.X(
        "bar:N", sort=[label for label, _ in bars], title=title, axis=alt.Axis(labelAngle=-90 if len(bars) > 16 else 0)
    )
    field = alt.Tooltip("bar:N", title="rank")
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("share:Q", stack="zero", title="share of step time", axis=alt.Axis(format="%")),
            color=alt.Color("phase:N", sort=PHASE_ORDER, scale=_phase_colors(df)),
            order=alt.Order("phase_order:Q"),
            tooltip=[field, "phase", alt.Tooltip("share:Q", format=".1%")],
        )
        .transform_calculate(phase_order=f"indexof({PHASE_ORDER!r}, datum.phase)")
        .properties(height=320)
    )


def stacked_over_time(rows: list[dict]) -> alt.Chart:
    df = shares_long(rows, "t_s")
    return (
        alt.Chart(df)
        .mark_area()
        .encode(
            x=alt.X("t_s:Q", title="seconds since the first step"),
            y=alt.Y("share:Q", stack="normalize", title="share of step time", axis=alt.Axis(format="%")),
            color=alt.Color("phase:N", sort=PHASE_ORDER, scale=_phase_colors(df)),
            order=alt.Order("phase_order:Q"),
            tooltip=[alt.Tooltip("t_s:Q", format=".1f"), "phase", alt.Tooltip("share:Q", format=".1%")],
        )
        .transform_calculate(phase_order=f"indexof({PHASE_ORDER!r}, datum.phase)")
        .properties(height=260)
    )


def heatmap_chart(hm: dict) -> alt.Chart:
    df = pd.DataFrame(hm["cells"], columns=["row", "bin", "t_s", "value", "label"])
    fmt = {"s": ".3f", "ratio": ".0%", "bytes": ".3s"}[hm["unit"]]
    scheme = alt.Scale(scheme="orangered", reverse=hm["metric"] == "gpu_utilization_ratio")
    rows = max(1, len(hm["rows"]))
    last = max(hm["cells"], key=lambda c: c["bin"], default=None)
    per_bin = last["t_s"] / last["bin"] if last and last["bin"] else None
    x_title = "time →" + (f" ({per_bin:.1f} s per column)" if per_bin else "")
    return (
        alt.Chart(df)
        .mark_rect()
        .encode(
            x=alt.X("bin:O", title=x_title, axis=alt.Axis(labels=False, ticks=False)),
            y=alt.Y(
                "label:N",
                sort=alt.EncodingSortField(field="row", op="min"),
                title="rank (worst first)",
                axis=alt.Axis(labelOverlap=True),
            ),
            color=alt.Color("value:Q", scale=scheme, title=hm["unit"], legend=alt.Legend(format=fmt)),
            tooltip=["label", alt.Tooltip("t_s:Q", title="from s", format=".1f"), alt.Tooltip("value:Q", format=fmt)],
        )
        .properties(height=min(640, max(120, 6 * rows + 40)))
    )


def series_chart(rows: list[dict]) -> alt.Chart:
    df = pd.DataFrame(rows, columns=["name", "bin", "t_s", "mean", "min", "max"])
    base = alt.Chart(df).encode(x=alt.X("t_s:Q", title="seconds since the first sample"))
    band = base.mark_area(opacity=0.25).encode(y="min:Q", y2="max:Q", color="name:N")
    line = base.mark_line().encode(y=alt.Y("mean:Q", title="mean over ranks (band: min-max)"), color="name:N")
    layered = (band + line).properties(height=140, width=600)
    return layered.facet(row=alt.Row("name:N", title=None)).resolve_scale(y="independent")


def util_chart(rows: list[dict]) -> alt.Chart:
    df = pd.DataFrame(rows, columns=["rank", "name", "mean"])
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=alt.X("rank:O"),
            xOffset="name:N",
            y=alt.Y("mean:Q", title="mean ratio", axis=alt.Axis(format="%")),
            color="name:N",
            tooltip=["rank", "name", alt.Tooltip("mean:Q", format=".1%")],
        )
        .properties(height=260)
    )
