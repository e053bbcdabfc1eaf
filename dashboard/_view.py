"""Shared page pieces: the selected run, safe text, error guard, live panels and the landing page's chart.

Every page is drawn from one ``_data.Snapshot`` of the selected run (``Context.snapshot``); the clock line
(``clock_text``) says which.

Text that comes from a run (run ids, job names, reasons, rule output) goes through ``md_escape`` or
a plain-text element, so quotes, markdown or HTML in it are shown, never rendered.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import streamlit as st

from ranksight.format.markdown import markdown_table

from . import _data
from ._queries import PHASE_LABELS, rank_bars
from ._source import Source
from ._svg import stacked_bars

NO_RUNS = "no runs yet: add `ranksight.init()` to your loop, or run `ranksight demo`"
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$&:])")


def md_escape(text: object) -> str:
    """Escape markdown and HTML so ``text`` shows literally inside st.markdown / headers."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def md_table(rows: list[dict]) -> str:
    """A markdown table of ``rows`` (dicts with the first row's keys as headers: the page's own names), every
    cell escaped (``markdown_table``). Why not ``st.table``: the landing page draws it with the markdown
    element it loads anyway, where ``st.table`` has the browser fetch and compile Arrow's table code (1 MB of
    JavaScript)."""
    if not rows:
        return ""
    names = list(rows[0])
    return markdown_table(names, ([row.get(n) for n in names] for row in rows), cell=_cell)


def _cell(value: object) -> str:
    """One table cell: escaped, on one line, empty for None."""
    return "" if value is None else md_escape(" ".join(str(value).splitlines()))


def code_html(code: str, *, wrap: bool = False) -> str:
    """``code`` as a preformatted block for ``st.html``. Why not ``st.code``: its syntax highlighter is 1.5 MB of
    JavaScript a first visit fetches and compiles; the text stays
    selectable, in a monospace block. ``wrap`` folds long lines at the block's edge instead of scrolling them
    out of sight (a narrow column); copying still gives the lines as written."""
    from html import escape

    style = _CODE_STYLE
    if wrap:
        style = style.replace("white-space: pre", "white-space: pre-wrap; overflow-wrap: anywhere")
    return f"<pre style='{style}'><code>{escape(code)}</code></pre>"


_CODE_STYLE = (
    "background: rgba(128, 128, 128, 0.1); padding: 0.75rem 1rem; border-radius: 0.5rem;"
    " font-size: 0.85rem; overflow-x: auto; white-space: pre"
)


@dataclass(frozen=True)
class Context:
    """What every page needs: the source, the runs found, the one selected and its snapshot (the refresh
    every part of the page shows)."""

    source: Source
    runs: tuple[dict, ...]
    run: dict | None
    snapshot: _data.Snapshot | None = None

    @property
    def live(self) -> bool:
        return bool(self.run and self.run["status"] == "live")

    def other_runs(self) -> list[dict]:
        return [r for r in self.runs if self.run is None or r["path"] != self.run["path"]]


def context() -> Context:
    """The Context the app script stored for this rerun."""
    return st.session_state["_ranksight_ctx"]


def run_started(run: dict, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """When the run started, local time (``list_runs`` gives the last update and the duration since the start)."""
    import time

    started_ns = run["last_update_ns"] - int(run["duration_s"] * 1e9)
    return time.strftime(fmt, time.localtime(started_ns / 1e9))


def run_label(run: dict) -> str:
    """A run's name in pickers: status, start time (month-day hour:minute) and job first, short enough for
    the sidebar, so runs are told apart where a picker cuts the label (a long job name is what is cut);
    then size and the run id."""
    mark = {"live": "● live", "finished": "finished", "stopped": "stopped"}.get(run["status"], run["status"])
    started = run_started(run, "%m-%d %H:%M")
    return f"{mark} · {started} · {run['job']} · {run['ranks']} ranks × {run['steps']} steps · {run['run']}"


@contextlib.contextmanager
def guard(what: str):
    """Show a one-line error instead of a traceback when a run cannot be read."""
    import duckdb

    try:
        yield
    except (_data.RunDirError, duckdb.Error, OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        st.error(f"cannot show {what}: {first}", icon="⚠️")


def require_run(ctx: Context) -> bool:
    """Say what to do when there is no run to show; True when there is one."""
    if ctx.run is None:
        st.info(NO_RUNS if not ctx.runs else "pick a run in the sidebar")
        st.caption(f"reading runs from: {md_escape(ctx.source.root)}")
        return False
    return True


def live_panel(ctx: Context, body, *args) -> None:
    """Draw ``body(*args)``: once per page run. A live run's page is run again, whole, by the clock
    (``clock_fragment``) when a refresh brings something new, so every panel shows the same refresh."""
    body(*args)


def clock_text(snap, now_ns: int | None = None) -> str:
    """'● live · step 812 of the run, as of 09:12:03 (1 s ago)': what every page and the sidebar say of the
    run's progress, from one ``_data.Snapshot``."""
    import time

    now_ns = time.time_ns() if now_ns is None else now_ns
    mark = {"live": "● live", "finished": "finished", "stopped": "stopped"}.get(snap.status, snap.status)
    if not snap.as_of_ns:
        return f"{mark} · no step recorded yet"
    ago = max(0, round((now_ns - snap.as_of_ns) / 1e9))
    clock = time.strftime("%H:%M:%S", time.localtime(snap.as_of_ns / 1e9))
    return f"{mark} · step {snap.steps} of the run, as of {clock} ({ago} s ago)"


def page_mark(runs, snap) -> tuple:
    """What a page shows that a refresh can change: each run's status and steps (the picker, the Runs table)
    and the selected run's snapshot. The clock runs the page again only when this changed."""
    return (tuple((r["path"], r["status"], r["steps"]) for r in runs), None if snap is None else snap.key)


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def ms(x) -> str:
    return "—" if x is None else f"{1000 * x:.1f} ms"


def share_sentence(total: dict) -> str:
    """'data wait 52.4 % · compute 40.4 % · ...', largest first; absent phases left out."""
    parts = []
    for key, label in PHASE_LABELS.items():
        v = total.get(f"{key[:-2]}_share")
        if v is not None and not (key == "h2d_s" and not total.get("h2d_measured")):
            parts.append((v, label))
    return " · ".join(f"{label} {pct(v)}" for v, label in sorted(parts, reverse=True))


PHASE_ORDER = list(PHASE_LABELS.values())
PHASE_COLORS = ["#e45756", "#f58518", "#4c78a8", "#b279a2", "#54a24b", "#bab0ac"]


def stacked_by_rank_svg(rows: list[dict], named=()) -> str:
    """``_charts.stacked_by_rank`` as inline SVG (``_svg``): the landing page draws it without Vega and altair."""
    bars, title = rank_bars(rows, named)
    shares = [(label, {PHASE_LABELS[p]: r.get(f"{p[:-2]}_share") for p in PHASE_LABELS}) for label, r in bars]
    return stacked_bars(shares, PHASE_ORDER, dict(zip(PHASE_ORDER, PHASE_COLORS)), title)
