"""What the dashboard's server costs while it follows a live run: tabs on a small job, one refresh at 1,024 ranks.

    python -m benchmarks dashboard_bench --live 1000 [--json OUT]
    python -m benchmarks dashboard_bench --refresh-scale [--ranks 1024] [--lengths ...] [--repeats 5] [--json OUT]

``--live STEPS``: the server's own CPU (``/proc``, apart from the browser's) while three tabs of headless
Chromium (Verdict, Breakdown, Heatmaps) watch a real 2-rank CPU demo job of STEPS steps, opened on the empty
folder before the job starts, beside the same job run unwatched just before. ``--refresh-scale``: the server's
CPU for one refresh of a live ``--ranks``-rank node-spool run after one flush, at each of ``--lengths`` steps
(``refresh_at_scale``). The Chromium helpers here also time the Verdict page for ``scale.py --sections store``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _harness import cli, free_port, rotated, spread, write_results
from scale import build_spool

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")
CHROMIUM_ARGS += ("--disable-component-update", "--disable-sync", "--no-first-run")
LANDING = "Where step time goes"
"""Text on the Verdict page (the landing page) that shows its content has been drawn."""
IDLE_JS = "!document.querySelector('[data-testid=\"stStatusWidget\"]')"
"""True once Streamlit shows no running-script widget: the page is drawn and idle."""
DRAWN_JS = "!document.querySelector('[data-testid=\"stSkeleton\"]')"
"""True once no element is still a placeholder: Streamlit draws a table or chart as a grey skeleton until its
code has loaded, which can be after the script is idle."""

_BARE_APP = """import streamlit as st
st.set_page_config(page_title="ranksight", layout="wide")
st.markdown("**{marker}**: a page with this line alone")
"""


def _browser(pw):
    return pw.chromium.launch(executable_path="/usr/bin/chromium", args=list(CHROMIUM_ARGS))


@contextlib.contextmanager
def page_on_fresh_server(run_path: str | None, marker: str = ""):
    """(a page of a headless Chromium started for it alone, the port) of a dashboard server started for
    ``run_path``, yielded the moment the server answers: its warm-up (diagnosis, rollup) may still be running.
    ``run_path`` None: a Streamlit app of one line holding ``marker``, served with the dashboard's own flags:
    what any Streamlit page costs a fresh browser here (the floor under the Verdict page's first render)."""
    from playwright.sync_api import sync_playwright

    from ranksight.commands.dashboard import start, wait_ready
    from ranksight.dashboard import serve_command

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ranksight-bare-") as folder:
        if run_path:
            proc = start(run_path, port, quiet=True)
        else:
            app = os.path.join(folder, "bare.py")
            with open(app, "w") as f:
                f.write(_BARE_APP.format(marker=marker))
            flags = serve_command(port)[3:]  # after "python -m ranksight.dashboard._launch"
            proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", app, *flags],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_ready(proc, "127.0.0.1", port)  # server start-up is not part of the render
            with sync_playwright() as pw:
                browser = _browser(pw)
                try:
                    yield browser.new_page(viewport={"width": 1400, "height": 1000}), port
                finally:
                    browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def time_visit_drawn(page, url: str, marker: str) -> tuple[float, float]:
    """(seconds from navigating to ``url`` until ``marker`` is drawn and Streamlit is idle; seconds until, beyond
    that, no element is a placeholder any more)."""
    t = time.perf_counter()
    page.goto(url)
    page.get_by_text(marker).first.wait_for(timeout=120000)
    page.wait_for_function(IDLE_JS, timeout=120000, polling=50)
    idle = time.perf_counter() - t
    page.wait_for_function(DRAWN_JS, timeout=120000, polling=50)
    return idle, time.perf_counter() - t


# ------------------------------------------------------------------ --live


LIVE_TABS = ("", "breakdown", "heatmaps")
"""The pages a person watching a live run keeps open: the Verdict, the breakdown and the heatmaps."""


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) and its waited-for children, from /proc:
    the server's own cost, apart from the browser's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def job_median_step_ms(run_path: str) -> float:
    """The job's median step time after warm-up, over every rank (what the user sees the job do)."""
    import duckdb

    from ranksight.format.warmup import WARMUP_STEPS

    glob = os.path.join(run_path, "steps", "*.parquet")
    sql = f"SELECT median(step_s) FROM read_parquet('{glob}', union_by_name=true) WHERE step >= {WARMUP_STEPS}"
    return duckdb.connect().execute(sql).fetchone()[0] * 1000


def run_demo_job(root: str, run_id: str, steps: int) -> float:
    """Run the 2-rank CPU demo job (no dashboard of its own) into ``root``; its wall seconds."""
    cmd = [sys.executable, "-m", "ranksight", "demo", "--no-dashboard", "--fault", "none", "--steps", str(steps)]
    t = time.perf_counter()
    subprocess.run([*cmd, "--run-dir", root, "--run-id", run_id], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def watch_live(folder: str, steps: int = 2000, tabs: tuple[str, ...] = LIVE_TABS, refresh_s: float = 2.0) -> dict:
    """A healthy 2-rank demo run of ``steps`` steps watched by ``len(tabs)`` tabs of headless Chromium, open on
    the empty folder of a dashboard server started before the job, beside the same job run with no dashboard.

    Figures: the server's CPU seconds over the watched run and as a share of one core, per tab and refresh;
    the job's median step watched and unwatched. The unwatched job runs first, so both find the machine alike.
    """
    from playwright.sync_api import sync_playwright

    from ranksight.commands.dashboard import start, stop, wait_ready

    out: dict = {"steps": steps, "tabs": [t or "verdict" for t in tabs], "refresh_s": refresh_s}
    out["tabs_opened"] = "before the job"
    root = tempfile.mkdtemp(prefix="ranksight-live-", dir=folder)
    try:
        runs = os.path.join(root, "runs")
        os.makedirs(runs)
        out["unwatched_wall_s"] = run_demo_job(os.path.join(root, "alone"), "alone", steps)
        out["unwatched_median_step_ms"] = job_median_step_ms(os.path.join(root, "alone", "alone"))
        port = free_port()
        proc = start(runs, port, refresh_s=refresh_s, quiet=True)
        try:
            wait_ready(proc, "127.0.0.1", port)
            with sync_playwright() as pw:
                browser = _browser(pw)
                pages = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in tabs]
                for page, tab in zip(pages, tabs):
                    page.goto(f"http://127.0.0.1:{port}/{tab}")
                    page.get_by_text("no runs yet").first.wait_for(timeout=60000)
                time.sleep(2 * refresh_s)  # the tabs settle: idle watching of an empty folder
                cpu0, t0 = process_cpu_s(proc.pid), time.perf_counter()
                out["watched_wall_s"] = run_demo_job(runs, "watched", steps)
                cpu1, t1 = process_cpu_s(proc.pid), time.perf_counter()
                out["pages_at_end"] = [p.locator("[data-testid='stMain']").first.inner_text()[:4000] for p in pages]
                browser.close()
        finally:
            stop(proc)
        out["watched_median_step_ms"] = job_median_step_ms(os.path.join(root, "runs", "watched"))
        out["server_cpu_s"] = cpu1 - cpu0
        out["server_cpu_share_of_one_core"] = (cpu1 - cpu0) / (t1 - t0)
        out["server_cpu_ms_per_tab_refresh"] = 1000 * (cpu1 - cpu0) / ((t1 - t0) / refresh_s * len(tabs))
        out["median_step_ratio_watched_to_unwatched"] = out["watched_median_step_ms"] / out["unwatched_median_step_ms"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------ --refresh-scale


def append_steps(run_path: str, ranks: int, first_step: int, steps: int) -> int:
    """Append ``steps`` steps of every rank to a live run as the node spool publishes them (``scale.build_spool``
    with ``live``: ~0.1 s steps ending now, a file and its digest per node of 8 ranks, rank files heartbeating
    now). Returns the files written."""
    return build_spool(run_path, ranks, steps, per_node=True, first_step=first_step, live=True)[0]


ARMS = ("kept", "judged each refresh")
"""``--refresh-scale``'s arms: the dashboard as it is (its verdict made again once the run has grown by
``_data.REJUDGE_GROWTH``), and the same with the verdict made at every refresh (``REJUDGE_GROWTH`` 0)."""


def slope(rows: list[dict], shortest: int) -> dict:
    """CPU-s per 1,000 steps, Theil-Sen: the ``spread`` of the slopes between every two rows at least
    ``shortest`` steps apart, so "flat" is a measured statement."""
    return spread(
        [
            1000 * (b["refresh_cpu_s"] - a["refresh_cpu_s"]) / (b["steps"] - a["steps"])
            for a, b in itertools.combinations(rows, 2)
            if b["steps"] - a["steps"] >= shortest
        ]
    )


def _show(name: str, by_length: dict, s: dict) -> None:
    medians = ", ".join(f"{v['refresh_cpu_s']['median']:.2f}" for v in by_length.values())
    print(f"{name}: {medians} CPU-s per refresh at {tuple(by_length)} steps; slope {s['median']:+.3f} "
          f"(p25 {s.get('p25', 0):+.3f}, p75 {s.get('p75', 0):+.3f})", flush=True)  # fmt: skip


def refresh_at_scale(
    folder: str, ranks: int = 1024, lengths: tuple[int, ...] = (1000, 2000, 4000, 8000), flush_steps: int = 16,
    repeats: int = 5,
) -> dict:  # fmt: skip
    """The server's CPU for one refresh of a live ``ranks``-rank run that one flush (``flush_steps`` steps of
    every rank, one file per node) has added to, ``repeats`` times at each of ``lengths`` steps: the snapshot
    (listing, rank files, the rollup taking in the new files, the verdict) and the pulls of the Heatmaps and
    Breakdown pages. One server's state per arm, kept from length to length, as a dashboard watching the run
    keeps it; each arm follows the same run folder through a path of its own (a link), the arms taking turns
    after each flush. The history up to each length is written in blocks of 500 steps a node (as an
    ``ingest --every`` or a long flush interval leaves it); the refresh measured takes in one flush.

    Returns the rows and, per arm, the median per length and the ``slope``; and the kept arm's CPU per refresh
    over one cycle of its verdict (``_cycle_cost``)."""
    from ranksight.dashboard import _data
    from ranksight.dashboard import _queries as q

    base = os.path.join(folder, f"live-{ranks}")
    shutil.rmtree(base, ignore_errors=True)
    run_path = os.path.join(base, "live-run")
    paths = {}
    for i, arm in enumerate(ARMS):
        os.makedirs(os.path.join(base, f"arm{i}"))
        paths[arm] = os.path.join(base, f"arm{i}", "live-run")
        os.symlink(run_path, paths[arm])
    growth = _data.REJUDGE_GROWTH

    def refresh(arm: str) -> dict:
        path = paths[arm]
        _data.REJUDGE_GROWTH = growth if arm == "kept" else 0  # 0: the verdict made at every refresh
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            snap = _data.snapshot(path, refresh_s=0)
            snap_cpu = time.process_time() - cpu
        finally:
            _data.REJUDGE_GROWTH = growth
        chunk = _data.rollup(path).chunk_steps
        order = _data.pull(path, q.rank_order, "mean step time (slowest first)")
        _data.pull(path, q.step_heatmaps, order, 60, 128, 16, chunk)  # as the Heatmaps page pulls its step metrics
        for fn in (q.rank_outliers, q.rollup_total, q.breakdown_per_rank, q.breakdown_over_time, q.run_overview):
            _data.pull(path, fn)
        rules = [f["rule"] for f in snap.diagnosis["findings"][:2]] if snap.diagnosis else snap.error
        return {"refresh_cpu_s": time.process_time() - cpu, "refresh_wall_s": time.perf_counter() - wall,
                "snapshot_cpu_s": snap_cpu, "steps_shown": snap.steps, "verdict_steps": snap.verdict_steps,
                "verdict_rules": rules}  # fmt: skip

    rows, written, turn = [], 0, 0
    for length in lengths:
        while written < length - repeats * flush_steps:
            n = min(500, length - repeats * flush_steps - written)
            append_steps(run_path, ranks, written, n)
            written += n
        for arm in ARMS:
            refresh(arm)  # each arm's server has seen the run up to here
        for _ in range(repeats):
            append_steps(run_path, ranks, written, flush_steps)  # one flush arrives
            written += flush_steps
            for arm in rotated(list(ARMS), turn):
                row = {"arm": arm, "steps": written, **refresh(arm), "loadavg": os.getloadavg()}
                row["files"] = sum(n.endswith(".parquet") for n in os.listdir(os.path.join(run_path, "steps")))
                rows.append(row)
                print(f"{arm:10s} {ranks} ranks x {written} steps: refresh {row['refresh_cpu_s']:.3f} CPU s "
                      f"(snapshot {row['snapshot_cpu_s']:.3f}), {row['refresh_wall_s']:.3f} s wall, "
                      f"load {row['loadavg'][0]:.1f}", flush=True)  # fmt: skip
            turn += 1
    shutil.rmtree(base, ignore_errors=True)

    def at(arm_rows: list[dict], length: int) -> list[dict]:
        return [r for r in arm_rows if length - repeats * flush_steps < r["steps"] <= length]

    summary = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        by_length = {}
        for length in lengths:
            here = at(mine, length)
            by_length[length] = {key: spread([r[key] for r in here]) for key in ("refresh_cpu_s", "snapshot_cpu_s")}
            by_length[length]["loadavg_1min"] = spread([r["loadavg"][0] for r in here])
        judged = sum(r["verdict_steps"] == r["steps_shown"] for r in mine)
        summary[arm] = {"by_length": by_length, "slope_cpu_s_per_1000_steps": slope(mine, min(lengths)),
                        "refreshes_that_judged": f"{judged} of {len(mine)}"}  # fmt: skip
        _show(arm, by_length, summary[arm]["slope_cpu_s_per_1000_steps"])
    summary["kept, per refresh over a verdict's cycle"] = _cycle_cost(rows, lengths, at, flush_steps, growth)
    return {"rows": rows, "arms": summary, "ranks": ranks, "flush_steps": flush_steps, "repeats": repeats,
            "rejudge_growth": growth}  # fmt: skip


def _cycle_cost(rows: list[dict], lengths: tuple[int, ...], at, flush_steps: int, growth: float) -> dict:
    """The kept arm's CPU per refresh averaged over one cycle of its verdict: of the ``k`` refreshes from one
    verdict to the next (``k`` = the flushes of ``flush_steps`` in ``growth`` x the length), one judges (the
    ``judged each refresh`` arm's refresh, measured in the same turn) and ``k - 1`` keep the verdict (the kept
    arm's). Paired turn by turn, so each length gives ``repeats`` figures, and the ``slope`` over them."""
    out_rows, by_length = [], {}
    for length in lengths:
        kept, judged = (at([r for r in rows if r["arm"] == arm], length) for arm in ARMS)
        k = max(1, math.ceil(max(1, growth * length) / flush_steps))
        figures = [
            {"steps": a["steps"], "refresh_cpu_s": (b["refresh_cpu_s"] + (k - 1) * a["refresh_cpu_s"]) / k}
            for a, b in zip(kept, judged)
        ]
        out_rows += figures
        by_length[length] = {"refreshes_per_verdict": k, "refresh_cpu_s": spread([f["refresh_cpu_s"] for f in figures])}
    s = slope(out_rows, min(lengths))
    _show("kept, over a verdict's cycle", by_length, s)
    return {"by_length": by_length, "slope_cpu_s_per_1000_steps": s}


def main(argv: list[str] | None = None) -> int:
    ap = cli(__doc__)
    ap.add_argument("--dir", default="/tmp/ranksight-bench")
    ap.add_argument("--live", type=int, metavar="STEPS", help="a STEPS-step 2-rank demo watched by 3 tabs")
    ap.add_argument("--refresh-scale", action="store_true", help="one refresh's CPU at --ranks ranks by length")
    ap.add_argument("--ranks", type=int, default=1024, help="refresh-scale: ranks")
    ap.add_argument("--lengths", default="1000,2000,4000,8000", help="refresh-scale: run lengths in steps")
    ap.add_argument("--repeats", type=int, default=5, help="refresh-scale: refreshes measured at each length")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    if args.refresh_scale:
        lengths = tuple(int(n) for n in args.lengths.split(","))
        figures = refresh_at_scale(args.dir, args.ranks, lengths, repeats=args.repeats)
        if args.json:
            write_results(args.json, {"refresh_at_scale": figures}, arms=list(ARMS), rounds=args.repeats)
    elif args.live:
        figures = watch_live(args.dir, args.live)
        for name, value in figures.items():
            if name == "pages_at_end":
                value = [" | ".join(text.splitlines()[:6]) for text in value]
            print(f"{name:44s} {value}", flush=True)
        if args.json:
            write_results(args.json, {"live_watch": figures})
    else:
        ap.error("--live STEPS or --refresh-scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
