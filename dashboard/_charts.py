"""The Vega-Lite charts of the pages after the landing page: plain dict specs for the ones a watched live page
draws again at each refresh (breakdown, heatmaps: building and validating an Altair chart cost 17 ms each, the
dict a fraction of a millisecond), Altair for the Signals page's faceted and layered charts.

Why a module of their own: importing altair takes a good part of a second on 2 cores, more while the
server's warm-up diagnoses; the Verdict page (the landing page, ``_view.stacked_by_rank_svg``) does without
it, so its first render does not wait for that import.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ._queries import PHASE_LABELS, rank_bars
from ._view import PHASE_COLORS, PHASE_ORDER


def _share_values(rows: list[dict], index: str) -> list[dict]:
    """Rows with ``<phase>_share`` figures -> one record per (index, phase) present, in phase order."""
    out = []
    for r in rows:
        for key, label in PHASE_LABELS.items():
            v = r.get(f"{key[:-2]}_share")
            if v is not None:
                out.append({index: r[index], "phase": label, "order": PHASE_ORDER.index(label), "share": float(v)})
    return out


def _phase_color(values: list[dict]) -> dict:
    """The phases present (H2D is absent on a CPU job: no legend entry for it), each in its fixed colour."""
    present = [p for p in PHASE_ORDER if p in {v["phase"] for v in values}] or PHASE_ORDER
    return {
        "field": "phase",
        "type": "nominal",
        "sort": PHASE_ORDER,
        "scale": {"domain": present, "range": [PHASE_COLORS[PHASE_ORDER.index(p)] for p in present]},
    }


def stacked_by_rank(rows: list[dict], named=()) -> dict:
    """Each rank's phase shares, a bar per rank; above ``BARS_AT_MOST`` ranks the ones that stand out
    (``named`` first) and one bar for the others' mean (``rank_bars``). A Vega-Lite spec as a plain dict: no
    Altair object to build and validate at each refresh (17 ms for two ranks)."""
    bars, title = rank_bars(rows, named)
    values = _share_values([{**r, "bar": label} for label, r in bars], "bar")
    return {
        "data": {"values": values},
        "mark": {"type": "bar"},
        "height": 320,
        "encoding": {
            "x": {
                "field": "bar",
                "type": "nominal",
                "sort": [label for label, _ in bars],
                "title": title,
                "axis": {"labelAngle": -90 if len(bars) > 16 else 0},
            },
            "y": {
                "field": "share",
                "type": "quantitative",
                "stack": "zero",
                "title": "share of step time",
                "axis": {"format": "%"},
            },
            "color": _phase_color(values),
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "bar", "title": "rank"},
                {"field": "phase"},
                {"field": "share", "type": "quantitative", "format": ".1%"},
            ],
        },
    }


def stacked_over_time(rows: list[dict]) -> dict:
    """Each phase's share over the run's time; the axis ends where the data does (not at a rounder number)."""
    values = _share_values(rows, "t_s")
    span = [min(v["t_s"] for v in values), max(v["t_s"] for v in values)] if values else [0.0, 1.0]
    return {
        "data": {"values": values},
        "mark": {"type": "area"},
        "height": 260,
        "encoding": {
            "x": {
                "field": "t_s",
                "type": "quantitative",
                "title": "seconds since the first step",
                "scale": {"domain": span, "nice": False},
            },
            "y": {
                "field": "share",
                "type": "quantitative",
                "stack": "normalize",
                "title": "share of step time",
                "axis": {"format": "%"},
            },
            "color": _phase_color(values),
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "t_s", "type": "quantitative", "format": ".1f"},
                {"field": "phase"},
                {"field": "share", "type": "quantitative", "format": ".1%"},
            ],
        },
    }


_UNIT_FORMAT = {"s": ".3f", "ratio": ".0%", "bytes": ".3s"}


def heatmap_scale_text(hm: dict) -> str:
    """What the heatmap's colours mean, in words (the scale is fixed for the run: ``_queries.colour_scale``)."""
    sc = hm["scale"]
    if hm["unit"] == "ratio":
        return "colour: 0-100 %"
    if not sc.get("high"):
        return "colour: no values yet"
    top = {"s": f"{1000 * sc['high']:.1f} ms", "bytes": f"{sc['high'] / 2**30:.2f} GiB"}[hm["unit"]]
    steps = f"steps {sc['first_step']}-{sc['last_step']}" if sc.get("first_step") is not None else "the steps so far"
    when = "fixed for the run" if sc.get("fixed") else "until the run passes that window, so far"
    return (
        f"colour: 0 to {top} (1.25 x the 95th percentile of {sc['basis']} over {steps} after warm-up; "
        f"{when}; higher values in the darkest colour)"
    )


def heatmap_axis_title(hm: dict) -> str:
    """'step (8 steps per column, about 0.4 s)': the column width as measured, in steps and seconds."""
    col, step_s = hm["col_steps"], hm.get("step_s")
    per = f"{col} step{'s' if col != 1 else ''} per column"
    if step_s:
        seconds = col * step_s
        per += f", about {seconds:.2f} s" if seconds < 1 else f", about {seconds:.1f} s"
    return f"step ({per})"


def heatmap_chart(hm: dict) -> dict:
    """A Vega-Lite spec (a plain dict: no Altair object to build and validate at each refresh) of one heatmap:
    step columns of a fixed width from step 0 to the chart's column budget (``column_steps``), with
    ticks, and a colour scale fixed for the run, clamped above."""
    col, bins = hm["col_steps"], hm["bins"]
    values = [
        {"label": c["label"], "row": c["row"], "x0": c["step"], "x1": c["step"] + col, "value": c["value"]}
        for c in hm["cells"]
    ]
    fmt = _UNIT_FORMAT[hm["unit"]]
    sc = hm["scale"]
    scale: dict = {"scheme": "orangered", "clamp": True, "reverse": hm["metric"] == "gpu_utilization_ratio"}
    if sc.get("high"):
        scale["domain"] = [sc["low"], sc["high"]]
    rows = max(1, len(hm["rows"]))
    return {
        "data": {"values": values},
        "mark": {"type": "rect"},
        "height": min(640, max(120, 6 * rows + 40)),
        "padding": {"left": 8, "top": 4, "right": 4, "bottom": 4},
        "encoding": {
            "x": {
                "field": "x0",
                "type": "quantitative",
                "title": heatmap_axis_title(hm),
                "scale": {"domain": [0, col * bins], "nice": False, "zero": True},
                "axis": {"tickCount": 10, "format": "d", "grid": False},
            },
            "x2": {"field": "x1"},
            "y": {
                "field": "label",
                "type": "nominal",
                "sort": {"field": "row", "op": "min"},
                "title": "rank",  # short: a vertical title longer than a few rows' height is cut off
                "axis": {"labelOverlap": True, "titlePadding": 6, "labelLimit": 90},
            },
            "color": {
                "field": "value",
                "type": "quantitative",
                "scale": scale,
                "title": hm["unit"],
                "legend": {"format": fmt},
            },
            "tooltip": [
                {"field": "label", "title": "rank"},
                {"field": "x0", "title": "from step", "type": "quantitative"},
                {"field": "value", "type": "quantitative", "format": fmt},
            ],
        },
    }


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
