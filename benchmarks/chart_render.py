"""The per-rank step-time chart drawn two ways in headless Chromium, side by side: the Altair (Vega-Lite) chart
the Breakdown page draws and the inline SVG the Verdict page draws, from the same breakdown rows.

Why: the Verdict page is the landing page, and what it costs the browser to draw its chart adds to every
first render. Two one-chart Streamlit apps run at once on loopback; each round opens each page in turn and
times navigation until the chart's marks are on screen (Vega's canvas, or the SVG's first segment), so
both pay the same page load and differ only in the chart. ``--cold`` opens each visit in a new browser
context (nothing cached: a user's first visit); without it the browser keeps Vega's code between visits.

    python benchmarks/chart_render.py RUN --rounds 9 --cold --json benchmarks/results/cpu_chart_render_1024_cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import free_port, write_results  # noqa: E402
from dashboard_bench import CHROMIUM_ARGS, serve_app  # noqa: E402

_APP = """
import json, sys
import streamlit as st
from ranksight.dashboard.{module} import {function}
rows = json.load(open({rows!r}))
st.markdown("**Step time per rank**")
{draw}
"""
_DRAW = {
    "vega": (
        "_charts",
        "stacked_by_rank",
        'st.altair_chart(stacked_by_rank(rows), width="stretch")',
        "[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg.marks",
    ),
    "svg": (
        "_view",
        "stacked_by_rank_svg",
        "st.markdown(stacked_by_rank_svg(rows), unsafe_allow_html=True)",
        "svg[data-chart='stacked-shares'] rect[data-bar]",
    ),
}


def _drawn(page, selector: str) -> None:
    """Wait until an element of ``selector`` has an area on screen, looking every 20 ms (a locator's wait
    looks less and less often, up to every 0.5 s: too coarse for what is measured here)."""
    page.wait_for_function(
        "s => { const e = document.querySelector(s); if (!e) return false;"
        " const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }",
        arg=selector,
        polling=20,
        timeout=60000,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="each visit in a new browser context (no cache)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown

    con = open_run(args.run, follow_spool=False)
    rows = step_breakdown(con)
    con.close()
    times: dict[str, list[float]] = {kind: [] for kind in _DRAW}
    with tempfile.TemporaryDirectory(prefix="chart-render-") as tmp:
        rows_path = os.path.join(tmp, "rows.json")
        with open(rows_path, "w") as f:
            json.dump(rows, f)
        servers = {}
        try:
            for kind, (module, function, draw, _) in _DRAW.items():
                app = os.path.join(tmp, f"app_{kind}.py")
                with open(app, "w") as f:
                    f.write(_APP.format(module=module, function=function, rows=rows_path, draw=draw))
                port = free_port()
                servers[kind] = (serve_app(app, port), port)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=list(CHROMIUM_ARGS))
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                for kind, (_, port) in servers.items():  # once each first: the servers' own first runs
                    page.goto(f"http://127.0.0.1:{port}/")
                    _drawn(page, _DRAW[kind][3])
                for _ in range(args.rounds):
                    for kind, (_, port) in servers.items():
                        if args.cold:  # a browser context of its own: nothing cached, as for a first visit
                            page.context.close()
                            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                        t = time.perf_counter()
                        page.goto(f"http://127.0.0.1:{port}/")
                        _drawn(page, _DRAW[kind][3])
                        times[kind].append(time.perf_counter() - t)
                browser.close()
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=20)
    summary = {kind: statistics.median(ts) for kind, ts in times.items()}
    print(
        f"{len(rows)} ranks{' (cold)' if args.cold else ''}: navigation to chart drawn, median of {args.rounds}: "
        + ", ".join(f"{kind} {s:.2f} s" for kind, s in summary.items())
    )
    if args.json:
        figures = {"run": args.run, "ranks": len(rows), "rounds": args.rounds, "cold": args.cold, "median_s": summary,
                   "times_s": times}  # fmt: skip
        write_results(args.json, figures, arms=list(_DRAW), rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
