"""Time each dashboard query on a synthetic 1,024-rank x 10,000-step store, and the first browser render.

    python benchmarks/dashboard_bench.py [--ranks 1024] [--steps 10000] [--dir /tmp/ranksight-bench] [--no-browser]
    python benchmarks/dashboard_bench.py --live 1000 [--open-after] [--json OUT]   # watching a live run
    python benchmarks/dashboard_bench.py --refresh-scale [--ranks 1024] [--json OUT]  # one refresh, by length

``--live STEPS``: the dashboard server's own CPU (``/proc``, apart from the browser) while three tabs of
headless Chromium (Verdict, Breakdown, Heatmaps) watch a real 2-rank CPU demo job of STEPS steps, opened on
the empty folder before the job starts (``--open-after``: on the run once it exists, which an older
dashboard needs to follow it at all), beside the same job run unwatched just before. ``--refresh-scale``:
the server's CPU for one refresh of a live ``--ranks``-rank node-spool run after one flush, at 1,000 to
8,000 steps (``refresh_at_scale``).

The store is written directly as Parquet segments with the record schema (a few big files, as a
compacted run would be): one straggler rank (compute x1.4) and a data-wait spike in the middle, plus
NVML utilization / kernel-busy / allocator samples every 2 s per rank. Targets: every panel's query
<= 300 ms on a 2-core machine, first full render in the browser <= 3 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import numpy as np
from _harness import cli, free_port, timed, write_results

STEP_S = 0.2
SAMPLE_EVERY_S = 2.0
SAMPLE_SERIES = ("gpu_utilization_ratio", "kernel_busy_ratio", "memory_reserved_bytes", "memory_fragmentation_ratio")


def make_store(run_path: str, ranks: int, steps: int, files: int = 8) -> None:
    """Write a synthetic run: rank metadata, steps and samples in ``files`` segments per kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ranksight.format.schema import arrow_schema

    for kind in ("ranks", "steps", "samples"):
        os.makedirs(os.path.join(run_path, kind), exist_ok=True)
    run = os.path.basename(run_path)
    t0 = 1_780_000_000 * 10**9
    now = time.time_ns()
    for r in range(ranks):
        meta = {"rank": r, "job": "bench", "run": run, "world_size": ranks, "status": "finished", "started_ns": now}
        meta.update(heartbeat_ns=now + int(steps * STEP_S * 1e9), steps=steps, flush_interval_s=2.0)
        with open(os.path.join(run_path, "ranks", f"rank-{r:05d}.json"), "w") as f:
            json.dump(meta, f)
    rng = np.random.default_rng(0)
    straggler = ranks * 3 // 5
    per_file = -(-ranks // files)
    for i, lo in enumerate(range(0, ranks, per_file)):
        rk = np.repeat(np.arange(lo, min(ranks, lo + per_file), dtype=np.int32), steps)
        st = np.tile(np.arange(steps, dtype=np.int64), len(rk) // steps)
        n = len(rk)
        data = np.where((st > steps // 2) & (st < steps // 2 + steps // 20), 0.06, 0.01) * rng.uniform(0.5, 1.5, n)
        compute = 0.12 * rng.uniform(0.95, 1.05, n) * np.where(rk == straggler, 1.4, 1.0)
        comm = np.maximum(0.0, 0.12 * 1.4 - compute) * 0.5 + 0.005
        opt, other = np.full(n, 0.01), np.full(n, 0.004)
        step_s = data + compute + comm + opt + other
        cols = {
            "job": pa.array(["bench"] * n),
            "run": pa.array([run] * n),
            "node": pa.array([f"node{r // 8:03d}" for r in range(lo, lo + per_file)]).take(
                pa.array((rk - lo).astype(np.int64))
            ),
            "rank": rk,
            "local_rank": rk % 8,
            "world_size": np.full(n, ranks, np.int32),
            "pid": 1000 + rk,
            "step": st,
            "time_ns": t0 + (st * STEP_S * 1e9).astype(np.int64) + rk.astype(np.int64) * 1000,
            "step_s": step_s,
            "data_wait_s": data,
            "h2d_s": np.full(n, 0.002),
            "compute_s": compute,
            "comm_exposed_s": comm,
            "allreduce_s": comm + 0.02,
            "optimizer_s": opt,
            "other_s": other,
            "buckets": np.full(n, 4, np.int32),
            "bucket_bytes": np.full(n, 100 << 20, np.int64),
            "gpu_compute_s": compute,
            "gpu_step_s": step_s - data,  # a host-bound rank: the GPU idles through the data wait
            "gpu_gap_s": data,
            "gpu_comm_exposed_s": comm,
            "gpu_optimizer_s": opt,
        }
        schema = arrow_schema("steps")
        # Columns the schema gained since (blocked collectives, CPU time): NULL, as an older agent writes them.
        table = pa.table(
            {f.name: pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema},
            schema=schema,
        )
        pq.write_table(table, os.path.join(run_path, "steps", f"bench_{i:03d}.parquet"), row_group_size=1 << 20)

        per_rank = int(steps * STEP_S / SAMPLE_EVERY_S)
        srk = np.repeat(np.arange(lo, min(ranks, lo + per_file), dtype=np.int32), per_rank)
        k = np.tile(np.arange(per_rank, dtype=np.int64), len(srk) // per_rank)
        m, frames = len(srk), []
        for name in SAMPLE_SERIES:
            if name.endswith("_bytes"):
                value = 40e9 + 1e9 * rng.uniform(0, 1, m)
            else:
                value = np.clip(rng.normal(0.8, 0.05, m) * np.where(srk == straggler, 1.0, 0.75), 0, 1)
            cols = {"job": pa.array(["bench"] * m), "run": pa.array([run] * m), "node": pa.array(["node"] * m)}
            cols.update(rank=srk, local_rank=srk % 8, world_size=np.full(m, ranks, np.int32), pid=1000 + srk)
            cols.update(time_ns=t0 + (k * SAMPLE_EVERY_S * 1e9).astype(np.int64))
            cols.update(step=(k * SAMPLE_EVERY_S / STEP_S).astype(np.int64), name=pa.array([name] * m), value=value)
            frames.append(pa.table(cols, schema=arrow_schema("samples")))
        pq.write_table(pa.concat_tables(frames), os.path.join(run_path, "samples", f"bench_{i:03d}.parquet"))


def time_queries(run_path: str, repeat: int = 3) -> dict[str, float]:
    """Median wall time (ms) of each panel's queries, as the dashboard runs them.

    Building the rollup (one pass over every step segment) is timed on its own: the dashboard does it
    once per run and server process, then only reads new segments.
    """
    from ranksight.dashboard import Rollup
    from ranksight.dashboard import _queries as q

    t = time.perf_counter()
    rollup = Rollup(run_path)
    out = {"rollup: first build (once per run)": (time.perf_counter() - t) * 1000}
    t = time.perf_counter()
    rollup.refresh()
    out["rollup: refresh, nothing new"] = (time.perf_counter() - t) * 1000
    from ranksight.rules import diagnose

    t = time.perf_counter()
    diagnose(run_path)  # the Verdict page's one call: the rules' own pass over the run
    out["rules: diagnose() for the Verdict page"] = (time.perf_counter() - t) * 1000
    con = rollup.cursor()
    order = q.rank_order(con)
    panels = {
        "runs: overview": lambda: q.run_overview(con),
        "breakdown: per rank": lambda: q.breakdown_per_rank(con),
        "breakdown: total": lambda: q.rollup_total(con),
        "breakdown: over time": lambda: q.breakdown_over_time(con),
        "heatmaps: rank order": lambda: q.rank_order(con),
        "heatmaps: outliers": lambda: q.rank_outliers(con),
        **{f"heatmap: {m}": (lambda m=m: q.heatmap(con, m, order)) for m in q.HEATMAP_METRICS},
        "signals: compile": lambda: q.compile_events(con),
        "signals: names present": lambda: q.sample_names_present(con),
        "signals: fragmentation": lambda: q.sample_series(con, q.FRAGMENTATION_SIGNALS),
        "signals: utilization": lambda: q.sample_per_rank(con, q.UTILIZATION_SIGNALS),
    }
    for name, fn in panels.items():
        out[name] = timed(fn, repeat)[0] * 1000
    return out


CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")
CHROMIUM_ARGS += ("--disable-component-update", "--disable-sync", "--no-first-run")
#: Page URL -> text that shows its content has been drawn.
RENDER_PAGES = {
    "": "Where step time goes",  # Verdict, the landing page: rules over the raw steps + rollup
    "breakdown": "All ranks:",
    "heatmaps": "Least compute-efficient ranks",
    "signals": "GPU utilization (NVML) beside kernel-busy share",
}


IDLE_JS = "!document.querySelector('[data-testid=\"stStatusWidget\"]')"
"""True once Streamlit shows no running-script widget: the page is drawn and idle."""


@contextlib.contextmanager
def _fresh_browser_page():
    """A page of a headless Chromium started for it alone (nothing cached), closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=list(CHROMIUM_ARGS))
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


_BARE_APP = """import streamlit as st
st.set_page_config(page_title="ranksight", layout="wide")
st.markdown("**{marker}**: a page with this line alone")
"""


@contextlib.contextmanager
def page_on_fresh_server(run_path: str | None, marker: str = ""):
    """(a headless Chromium page, the port) of a dashboard server started for ``run_path``, yielded the
    moment the server answers: its warm-up (diagnosis, rollup) may still be running. ``run_path`` None: a
    Streamlit app of one line holding ``marker``, served with the dashboard's own flags: what any Streamlit
    page costs a fresh browser here (the floor under the Verdict page's first render, as DuckDB's own
    queries are under the readers')."""
    import subprocess
    import tempfile

    from ranksight.commands.dashboard import start, wait_ready
    from ranksight.dashboard import serve_command

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ranksight-bare-") as folder:
        if run_path:
            proc = start(run_path, port, quiet=True)
        else:
            with open(os.path.join(folder, "bare.py"), "w") as f:
                f.write(_BARE_APP.format(marker=marker))
            flags = serve_command(port)[3:]  # after "python -m ranksight.dashboard._launch"
            proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", f.name, *flags],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_ready(proc, "127.0.0.1", port)  # server start-up is not part of the render
            with _fresh_browser_page() as page:
                yield page, port
        finally:
            proc.terminate()
            proc.wait(timeout=20)


DRAWN_JS = "!document.querySelector('[data-testid=\"stSkeleton\"]')"
"""True once no element is still a placeholder: Streamlit draws a table or chart as a grey skeleton until its
code has loaded, which can be after the script is idle."""


def time_visit_drawn(page, url: str, marker: str) -> tuple[float, float]:
    """(seconds until ``marker`` is drawn and Streamlit idle, as ``time_visit``; seconds until, beyond that,
    no element is a placeholder any more)."""
    t = time.perf_counter()
    idle = time_visit(page, url, marker)
    page.wait_for_function(DRAWN_JS, timeout=120000, polling=50)
    return idle, time.perf_counter() - t


def time_visit(page, url: str, marker: str) -> float:
    """Seconds from navigating to ``url`` until ``marker`` is drawn and Streamlit is idle."""
    t = time.perf_counter()
    page.goto(url)
    page.get_by_text(marker).first.wait_for(timeout=120000)
    page.wait_for_function(IDLE_JS, timeout=120000, polling=50)
    return time.perf_counter() - t


def time_first_render(run_path: str) -> dict[str, float]:
    """Seconds from navigation until each page's content is drawn and Streamlit is idle, in headless Chromium.

    A fresh server per run of this function, opened the moment it answers: the first page waits for
    the server's warm-up (diagnosis, rollup). The landing page is visited once more at the end.
    """
    out = {}
    with page_on_fresh_server(run_path) as (page, port):
        # The landing page again last: what a later visit costs once the server's warm-up is done.
        visits = [*RENDER_PAGES.items(), ("", RENDER_PAGES[""])]
        for i, (path, marker) in enumerate(visits):
            seconds = time_visit(page, f"http://127.0.0.1:{port}/{path}", marker)
            out["verdict, again" if i == len(visits) - 1 else (path or "verdict")] = seconds
    return out


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
    import subprocess

    cmd = [sys.executable, "-m", "ranksight", "demo", "--no-dashboard", "--fault", "none", "--steps", str(steps)]
    t = time.perf_counter()
    subprocess.run([*cmd, "--run-dir", root, "--run-id", run_id], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def watch_live(
    folder: str, steps: int = 2000, tabs: tuple[str, ...] = LIVE_TABS, refresh_s: float = 2.0, open_before: bool = True
) -> dict:
    """A healthy 2-rank demo run of ``steps`` steps watched by ``len(tabs)`` tabs of headless Chromium, opened
    on a dashboard server started before the job, beside the same job run with no dashboard.

    Figures: the server's CPU seconds over the watched run and as a share of one core, per tab and refresh;
    the job's median step watched and unwatched. The unwatched job runs first, so both find the machine alike.
    ``open_before``: the tabs are open on the empty folder before the job starts (else each opens on the run
    once its first rank file is there).
    """
    import shutil
    import tempfile
    import threading

    from ranksight.commands.dashboard import start, stop, wait_ready

    out: dict = {"steps": steps, "tabs": [t or "verdict" for t in tabs], "refresh_s": refresh_s}
    out["tabs_opened"] = "before the job" if open_before else "on the run's first rank file"
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
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=list(CHROMIUM_ARGS))
                pages = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in tabs]
                if open_before:
                    for page, tab in zip(pages, tabs):
                        page.goto(f"http://127.0.0.1:{port}/{tab}")
                        page.get_by_text("no runs yet").first.wait_for(timeout=60000)
                    time.sleep(2 * refresh_s)  # the tabs settle: idle watching of an empty folder
                cpu0, t0 = process_cpu_s(proc.pid), time.perf_counter()
                job = threading.Thread(target=lambda: out.update(watched_wall_s=run_demo_job(runs, "watched", steps)))
                job.start()
                if not open_before:  # each tab opened on the run as soon as its first rank file is there
                    ranks = os.path.join(runs, "watched", "ranks")
                    while job.is_alive() and not (os.path.isdir(ranks) and os.listdir(ranks)):
                        time.sleep(0.2)
                    for page, tab in zip(pages, tabs):
                        page.goto(f"http://127.0.0.1:{port}/{tab}?run=watched")
                job.join()
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


RANKS_PER_NODE = 8


def append_steps(run_path: str, ranks: int, first_step: int, steps: int, status: str = "running") -> int:
    """Append ``steps`` steps of every rank to a live run as the node spool publishes them: one file per node of
    8 ranks, its digest written before it, and one rank file per node (heartbeat now). Rank ``ranks - 1`` is
    1.3x slower in compute. Returns the files written."""
    import pyarrow as pa

    from ranksight.agent._node_spool import _write_durably
    from ranksight.format.digest_file import parquet_bytes, write_digest
    from ranksight.format.schema import arrow_schema

    schema = arrow_schema("steps")
    for sub in ("steps", "ranks"):
        os.makedirs(os.path.join(run_path, sub), exist_ok=True)
    rng = np.random.default_rng(first_step)
    now = time.time_ns()
    for first in range(0, ranks, RANKS_PER_NODE):
        members = np.arange(first, min(ranks, first + RANKS_PER_NODE), dtype=np.int32)
        n = len(members) * steps
        rank = np.repeat(members, steps)
        step = np.tile(np.arange(first_step, first_step + steps, dtype=np.int64), len(members))
        compute = rng.gamma(20.0, 0.005, n) * np.where(rank == ranks - 1, 1.3, 1.0)
        wait, exposed = rng.exponential(0.002, n), rng.exponential(0.005, n)
        opt, other = np.full(n, 0.01), np.full(n, 0.002)
        node = f"node{first // RANKS_PER_NODE:04d}"
        cols = {
            "job": pa.array(["bench"] * n),
            "run": pa.array(["live-run"] * n),
            "node": pa.array([node] * n),
            "rank": pa.array(rank),
            "local_rank": pa.array(rank % RANKS_PER_NODE),
            "world_size": pa.array(np.full(n, ranks, dtype=np.int32)),
            "pid": pa.array(1000 + rank),
            "step": pa.array(step),
            "time_ns": pa.array(now - (first_step + steps - step) * 100_000_000),
            "step_s": pa.array(wait + compute + exposed + opt + other),
            "data_wait_s": pa.array(wait),
            "compute_s": pa.array(compute),
            "comm_exposed_s": pa.array(exposed),
            "allreduce_s": pa.array(exposed * 3),
            "optimizer_s": pa.array(opt),
            "other_s": pa.array(other),
        }
        arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        name = f"{node}_m{first:020d}-{first_step:06d}.parquet"
        data = parquet_bytes(table)
        write_digest(table, os.path.join(run_path, "steps"), name, _write_durably)
        with open(os.path.join(run_path, "steps", name), "wb") as f:
            f.write(data)
        metas = [
            {"rank": int(r), "status": status, "heartbeat_ns": now, "steps": first_step + steps, "world_size": ranks,
             "job": "bench", "run": "live-run", "started_ns": now - (first_step + steps) * 100_000_000,
             "flush_interval_s": 2.0}
            for r in members
        ]  # fmt: skip
        with open(os.path.join(run_path, "ranks", f"node-{node}.json"), "w") as f:
            json.dump({"node": node, "ranks": metas}, f)
    return -(-ranks // RANKS_PER_NODE)


REFRESH_ARMS = ("kept", "judged each refresh")
"""``--refresh-scale``'s arms: the dashboard as it is (its verdict made again once the run has grown by
``_data.REJUDGE_GROWTH``, its reading refreshed with ``incremental=True``), and the same with the verdict made
at every refresh (``REJUDGE_GROWTH`` 0: what a refresh that judges costs). ``read again`` (not run by default):
the verdict at every refresh from a reading opened as before (``incremental=False``: the pending segments read
into memory at each refresh, the medians read from every row)."""


def refresh_at_scale(
    folder: str,
    ranks: int = 1024,
    lengths: tuple[int, ...] = (1000, 2000, 4000, 8000),
    flush_steps: int = 16,
    repeats: int = 5,
    arms: tuple[str, ...] = REFRESH_ARMS,
) -> dict:
    """The server's CPU for one refresh of a live ``ranks``-rank run that one flush (``flush_steps`` steps of
    every rank, one file per node) has added to, ``repeats`` times at each of ``lengths`` steps: the snapshot
    (listing, rank files, the rollup taking in the new files, the verdict) and the pulls of the Heatmaps and
    Breakdown pages. One server's state per arm, kept from length to length, as a dashboard watching the run
    keeps it; each arm follows the same run folder through a path of its own (a link), the arms taking turns
    after each flush. The run's history up to each length is written in blocks of 500 steps a node (as an
    ``ingest --every`` or a long flush interval leaves it); the refresh measured takes in one flush.

    Returns the rows (arm, steps, CPU seconds, load average) and, per arm, the median per length and the slope
    of CPU-s per 1,000 steps (Theil-Sen: the median of the slopes between every two refreshes at different
    lengths, with their quartiles and range), so "flat" is a measured statement."""
    import itertools
    import shutil

    from _harness import rotated, spread

    from ranksight.collectors import open_run
    from ranksight.dashboard import _data
    from ranksight.dashboard import _queries as q

    base = os.path.join(folder, f"live-{ranks}")
    shutil.rmtree(base, ignore_errors=True)
    run_path = os.path.join(base, "live-run")
    paths = {}
    for i, arm in enumerate(arms):
        os.makedirs(os.path.join(base, f"arm{i}"))
        paths[arm] = os.path.join(base, f"arm{i}", "live-run")
        os.symlink(run_path, paths[arm])

    growth = _data.REJUDGE_GROWTH

    def refresh(arm: str) -> dict:
        path = paths[arm]
        if arm == "read again" and path not in _data._followers:
            _data.open_run = lambda p, **kw: open_run(p, **{**kw, "incremental": False})  # this arm's reading
        if arm != "kept":
            _data.REJUDGE_GROWTH = 0  # the verdict made at every refresh
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            snap = _data.snapshot(path, refresh_s=0)
            snap_cpu = time.process_time() - cpu
        finally:
            _data.open_run = open_run
            _data.REJUDGE_GROWTH = growth
        chunk = _data.rollup(path).chunk_steps
        order = _data.pull(path, q.rank_order, "mean step time (slowest first)")
        for metric in ("step_s", "data_wait_s", "comm_exposed_s", "compute_s"):
            _data.pull(path, q.heatmap, metric, order, 60, 128, 16, chunk)
        for fn in (q.rank_outliers, q.rollup_total, q.breakdown_per_rank, q.breakdown_over_time, q.run_overview):
            _data.pull(path, fn)
        return {
            "refresh_cpu_s": time.process_time() - cpu,
            "refresh_wall_s": time.perf_counter() - wall,
            "snapshot_cpu_s": snap_cpu,
            "steps_shown": snap.steps,
            "verdict_steps": snap.verdict_steps,
            "verdict_rules": [f["rule"] for f in snap.diagnosis["findings"][:2]] if snap.diagnosis else snap.error,
        }

    rows, written, turn = [], 0, 0
    for length in lengths:
        while written < length - repeats * flush_steps:
            n = min(500, length - repeats * flush_steps - written)
            append_steps(run_path, ranks, written, n)
            written += n
        for arm in arms:
            refresh(arm)  # each arm's server has seen the run up to here
        for _ in range(repeats):
            append_steps(run_path, ranks, written, flush_steps)  # one flush arrives
            written += flush_steps
            for arm in rotated(list(arms), turn):
                row = {"arm": arm, "steps": written, **refresh(arm), "loadavg": os.getloadavg()}
                row["files"] = sum(n.endswith(".parquet") for n in os.listdir(os.path.join(run_path, "steps")))
                rows.append(row)
                print(f"{arm:10s} {ranks} ranks x {written} steps: refresh {row['refresh_cpu_s']:.3f} CPU s "
                      f"(snapshot {row['snapshot_cpu_s']:.3f}), {row['refresh_wall_s']:.3f} s wall, "
                      f"load {row['loadavg'][0]:.1f}", flush=True)  # fmt: skip
            turn += 1
    shutil.rmtree(base, ignore_errors=True)
    summary = {}
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        by_length = {}
        for length in lengths:
            at = [r for r in mine if length - repeats * flush_steps < r["steps"] <= length]
            by_length[length] = {
                "refresh_cpu_s": spread([r["refresh_cpu_s"] for r in at]),
                "snapshot_cpu_s": spread([r["snapshot_cpu_s"] for r in at]),
                "loadavg_1min": spread([r["loadavg"][0] for r in at]),
            }
        slopes = [
            1000 * (b["refresh_cpu_s"] - a["refresh_cpu_s"]) / (b["steps"] - a["steps"])
            for a, b in itertools.combinations(mine, 2)
            if b["steps"] - a["steps"] >= min(lengths)
        ]
        summary[arm] = {"by_length": by_length, "slope_cpu_s_per_1000_steps": spread(slopes)}
        judged = [r for r in mine if r["verdict_steps"] == r["steps_shown"]]
        summary[arm]["refreshes_that_judged"] = f"{len(judged)} of {len(mine)}"
        medians = [v["refresh_cpu_s"]["median"] for v in by_length.values()]
        slope = summary[arm]["slope_cpu_s_per_1000_steps"]
        quartiles = f"p25 {slope.get('p25', 0):+.3f}, p75 {slope.get('p75', 0):+.3f}"
        print(f"{arm}: median refresh {', '.join(f'{m:.2f}' for m in medians)} CPU-s at {lengths} steps; slope "
              f"{slope['median']:+.3f} CPU-s per 1,000 steps ({quartiles}); longest / shortest "
              f"{medians[-1] / medians[0]:.2f}x", flush=True)  # fmt: skip
    if "kept" in summary and "judged each refresh" in summary:
        summary["kept, per refresh over a verdict's cycle"] = _cycle_cost(rows, lengths, repeats, flush_steps, growth)
    return {
        "rows": rows,
        "arms": summary,
        "ranks": ranks,
        "flush_steps": flush_steps,
        "repeats": repeats,
        "rejudge_growth": growth,
    }


def _cycle_cost(rows: list[dict], lengths: tuple[int, ...], repeats: int, flush_steps: int, growth: float) -> dict:
    """The kept arm's CPU per refresh averaged over one cycle of its verdict: of the ``k`` refreshes from one
    verdict to the next (``k`` = the flushes of ``flush_steps`` in ``growth`` x the length), one judges (the
    ``judged each refresh`` arm's refresh, measured in the same turn) and ``k - 1`` keep the verdict (the kept
    arm's). Paired turn by turn, so each length gives ``repeats`` figures, and the slope over them as for an arm."""
    import itertools
    import math

    from _harness import spread

    out_rows, by_length = [], {}
    for length in lengths:
        at = {
            arm: [r for r in rows if r["arm"] == arm and length - repeats * flush_steps < r["steps"] <= length]
            for arm in ("kept", "judged each refresh")
        }
        k = max(1, math.ceil(max(1, growth * length) / flush_steps))
        figures = [
            {"steps": kept["steps"], "refresh_cpu_s": (judged["refresh_cpu_s"] + (k - 1) * kept["refresh_cpu_s"]) / k}
            for kept, judged in zip(at["kept"], at["judged each refresh"])
        ]
        out_rows += figures
        by_length[length] = {"refreshes_per_verdict": k, "refresh_cpu_s": spread([f["refresh_cpu_s"] for f in figures])}
    slopes = [
        1000 * (b["refresh_cpu_s"] - a["refresh_cpu_s"]) / (b["steps"] - a["steps"])
        for a, b in itertools.combinations(out_rows, 2)
        if b["steps"] - a["steps"] >= min(lengths)
    ]
    slope = spread(slopes)
    medians = [v["refresh_cpu_s"]["median"] for v in by_length.values()]
    quartiles = f"p25 {slope.get('p25', 0):+.3f}, p75 {slope.get('p75', 0):+.3f}"
    shown = ", ".join(f"{m:.2f}" for m in medians)
    print(
        f"kept, over a verdict's cycle: {shown} CPU-s per refresh; slope {slope['median']:+.3f} ({quartiles})",
        flush=True,
    )
    return {"by_length": by_length, "slope_cpu_s_per_1000_steps": slope}


def main(argv: list[str] | None = None) -> int:
    ap = cli(__doc__)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--dir", default="/tmp/ranksight-bench")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--live", type=int, metavar="STEPS", help="only the live watch: a STEPS-step 2-rank demo, 3 tabs")
    ap.add_argument("--open-after", action="store_true", help="live watch: open the tabs once the run exists")
    ap.add_argument("--refresh-scale", action="store_true", help="only one refresh's CPU at 1,024 ranks by length")
    ap.add_argument("--lengths", default="1000,2000,4000,8000", help="refresh-scale: run lengths in steps")
    ap.add_argument("--repeats", type=int, default=5, help="refresh-scale: refreshes measured at each length")
    ap.add_argument("--arms", default=",".join(REFRESH_ARMS), help="refresh-scale: arms, of " + ", ".join(REFRESH_ARMS))
    args = ap.parse_args(argv)
    if args.refresh_scale:
        os.makedirs(args.dir, exist_ok=True)
        lengths = tuple(int(n) for n in args.lengths.split(","))
        arms = tuple(a.strip() for a in args.arms.split(","))
        figures = refresh_at_scale(args.dir, args.ranks, lengths, repeats=args.repeats, arms=arms)
        if args.json:
            write_results(args.json, {"refresh_at_scale": figures}, arms=list(arms), rounds=args.repeats)
        return 0
    if args.live:
        os.makedirs(args.dir, exist_ok=True)
        figures = watch_live(args.dir, args.live, open_before=not args.open_after)
        for name, value in figures.items():
            if name == "pages_at_end":
                value = [" | ".join(text.splitlines()[:6]) for text in value]
            print(f"{name:44s} {value}", flush=True)
        if args.json:
            write_results(args.json, {"live_watch": figures})
        return 0
    run_path = os.path.join(args.dir, f"bench-{args.ranks}x{args.steps}")
    if not os.path.isdir(os.path.join(run_path, "steps")):
        t = time.perf_counter()
        make_store(run_path, args.ranks, args.steps)
        print(f"wrote {args.ranks} x {args.steps} store to {run_path} in {time.perf_counter() - t:.1f} s", flush=True)
    worst, queries, renders = 0.0, time_queries(run_path), {}
    for name, ms in queries.items():
        if name.startswith(("rollup", "rules")):
            print(f"{name:36s} {ms:8.1f} ms", flush=True)
            continue
        worst = max(worst, ms)
        print(f"{name:36s} {ms:8.1f} ms {'OK' if ms <= 300 else 'over 300 ms'}", flush=True)
    print(f"slowest panel query: {worst:.1f} ms (target 300 ms)")
    if not args.no_browser:
        renders = time_first_render(run_path)
        for page, secs in renders.items():
            print(f"render in Chromium: {page:26s} {secs:6.2f} s {'OK' if secs <= 3 else 'over 3 s'}", flush=True)
    if args.json:
        figures = {"ranks": args.ranks, "steps": args.steps, "query_ms": queries, "first_render_s": renders}
        write_results(args.json, {**figures, "slowest_panel_query_ms": worst})
    return 0


if __name__ == "__main__":
    sys.exit(main())
