"""The JavaScript a first visit to the dashboard's landing page fetches beyond what a Streamlit page of one line
does: Streamlit's browser code loads each element's code the first time a page shows that element, and on a
small machine the browser's compiling it is part of the first render (docs/scale.md "The Verdict page").

    python benchmarks/page_scripts.py RUN [--json benchmarks/results/cpu_page_scripts_demo.json]

Each page on a fresh server in a fresh headless Chromium (``dashboard_bench.page_on_fresh_server``); the bytes
are the responses' bodies, until the page is drawn with no placeholder left.
"""

from __future__ import annotations

import time

from _harness import cli, write_results
from dashboard_bench import RENDER_PAGES, page_on_fresh_server, time_visit_drawn


def scripts_of(run_path: str | None) -> dict[str, int]:
    """{script file name: bytes} a first visit fetched: of the landing page of ``run_path``, or of the
    one-line page (None)."""
    responses = []
    with page_on_fresh_server(run_path, RENDER_PAGES[""]) as (page, port):
        page.on("response", lambda r: responses.append(r) if r.url.endswith(".js") and r.ok else None)
        time_visit_drawn(page, f"http://127.0.0.1:{port}/", RENDER_PAGES[""])
        time.sleep(1.0)  # a script still arriving after the last placeholder went
        return {r.url.rsplit("/", 1)[-1]: len(r.body()) for r in list(responses)}


def main() -> None:
    parser = cli(__doc__)
    parser.add_argument("run", help="a run folder (the landing page opens it)")
    args = parser.parse_args()
    page, bare = scripts_of(args.run), scripts_of(None)
    extra = {name: size for name, size in page.items() if name not in bare}
    figures = {
        "landing_page_bytes": sum(page.values()),
        "one_line_page_bytes": sum(bare.values()),
        "extra_bytes": sum(extra.values()),
        "extra_scripts": dict(sorted(extra.items(), key=lambda kv: -kv[1])),
    }
    mb = {key: figures[key] / 2**20 for key in ("landing_page_bytes", "one_line_page_bytes", "extra_bytes")}
    print(f"landing page {mb['landing_page_bytes']:.2f} MB of scripts, one-line page", end=" ")
    print(f"{mb['one_line_page_bytes']:.2f} MB; beyond it {mb['extra_bytes']:.2f} MB:")
    for name, size in list(figures["extra_scripts"].items())[:8]:
        print(f"  {size / 1024:8.0f} KB  {name}")
    if args.json:
        write_results(args.json, figures)


if __name__ == "__main__":
    main()
