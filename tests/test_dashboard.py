"""Dashboard: loaders and rollup without Streamlit, every page through AppTest, the CLI command.

One real demo run (2 gloo ranks, planted input-bound loader) is recorded per module; synthetic
stores written with the record schema cover what a small CPU job cannot (1,024 ranks, a straggler,
GPU samples, odd run names, a corrupt segment).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ranksight.collectors import PHASES, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.dashboard import APP_PATH, Rollup, resolve
from ranksight.dashboard import _queries as q
from ranksight.format.phases import breakdown_total
from ranksight.format.schema import arrow_schema

DEMO_STEPS = 30


# ---------------------------------------------------------------- synthetic stores


def write_run(
    path: str,
    ranks: int,
    steps: int,
    *,
    straggler: int = -1,
    data_wait_s: float = 0.01,
    status: str = "finished",
    first_step: int = 0,
    segment: str = "seg",
    samples: bool = False,
    flush_interval_s: float = 1.0,
) -> str:
    """Write rank metadata and one steps segment (and optional GPU samples) with the real schema."""
    os.makedirs(os.path.join(path, "ranks"), exist_ok=True)
    os.makedirs(os.path.join(path, "steps"), exist_ok=True)
    now = time.time_ns()
    run = os.path.basename(path)
    for r in range(ranks):
        meta = {
            "rank": r,
            "job": "synthetic",
            "run": run,
            "world_size": ranks,
            "status": status,
            "started_ns": now - 10**10,
            "heartbeat_ns": now,
            "steps": first_step + steps,
            "flush_interval_s": flush_interval_s,
        }
        with open(os.path.join(path, "ranks", f"rank-{r:05d}.json"), "w") as f:
            json.dump(meta, f)
    rk = np.repeat(np.arange(ranks, dtype=np.int32), steps)
    st = np.tile(np.arange(first_step, first_step + steps, dtype=np.int64), ranks)
    n = len(rk)
    compute = np.where(rk == straggler, 0.2, 0.1)
    comm = np.where(rk == straggler, 0.0, 0.1)
    cols = {
        "job": ["synthetic"] * n,
        "run": [run] * n,
        "node": [f"n{r // 8}" for r in rk],
        "rank": rk,
        "local_rank": rk % 8,
        "world_size": np.full(n, ranks, np.int32),
        "pid": 100 + rk,
        "step": st,
        "time_ns": now - 10**10 + st * 10**8,
        "step_s": data_wait_s + compute + comm + 0.01,
        "data_wait_s": np.full(n, data_wait_s),
        "h2d_s": [None] * n,
        "compute_s": compute,
        "comm_exposed_s": comm,
        "allreduce_s": comm,
        "optimizer_s": np.full(n, 0.01),
        "other_s": np.zeros(n),
        "buckets": np.ones(n, np.int32),
        "bucket_bytes": np.full(n, 1000, np.int64),
        "gpu_compute_s": [None] * n,
        "gpu_step_s": [None] * n,
    }
    schema = arrow_schema("steps")
    pq.write_table(  # columns not given (the GPU ones) are null, as on a CPU job
        pa.table({f.name: pa.array(cols.get(f.name, [None] * n), type=f.type) for f in schema}, schema=schema),
        os.path.join(path, "steps", f"{segment}.parquet"),
    )
    if samples:
        os.makedirs(os.path.join(path, "samples"), exist_ok=True)
        srk = np.repeat(np.arange(ranks, dtype=np.int32), 5)
        m = len(srk)
        util = np.where(srk == straggler, 0.95, 0.6)
        sschema = arrow_schema("samples")
        t = {
            "job": ["synthetic"] * m,
            "run": [run] * m,
            "node": ["n"] * m,
            "rank": srk,
            "local_rank": srk,
            "world_size": np.full(m, ranks, np.int32),
            "pid": 100 + srk,
            "time_ns": now - 10**10 + np.tile(np.arange(5), ranks) * 10**9,
            "step": np.zeros(m, np.int64),
            "name": ["gpu_utilization_ratio"] * m,
            "value": util,
        }
        pq.write_table(
            pa.table({f.name: pa.array(t[f.name], type=f.type) for f in sschema}, schema=sschema),
            os.path.join(path, "samples", f"{segment}.parquet"),
        )
    return path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A real 2-rank gloo run with an input-bound loader."""
    pytest.importorskip("torch")
    from ranksight.commands.demo_job import DemoConfig, run_demo

    root = str(tmp_path_factory.mktemp("runs"))
    return run_demo(DemoConfig(fault="input", steps=DEMO_STEPS, run_dir=root, run_id="demo-input"))


# ---------------------------------------------------------------- loaders, no Streamlit


def test_rollup_shares_match_the_shared_step_breakdown(demo_run):
    rollup = Rollup(demo_run)
    ours = {r["rank"]: r for r in q.breakdown_per_rank(rollup.cursor())}
    ref = {r["rank"]: r for r in step_breakdown(open_run(demo_run))}
    assert sorted(ours) == sorted(ref) == [0, 1]
    for rank, r in ref.items():
        assert ours[rank]["steps"] == r["steps"] == DEMO_STEPS - 5
        assert ours[rank]["step_mean_s"] == pytest.approx(r["step_mean_s"], rel=1e-9)
        for p in PHASES:
            if p in ("h2d_s", "gpu_ahead_s"):  # CPU job: absent, not zero, in both
                assert ours[rank][f"{p[:-2]}_share"] is None and r[f"{p[:-2]}_share"] is None
            else:
                assert ours[rank][f"{p[:-2]}_share"] == pytest.approx(r[f"{p[:-2]}_share"], rel=1e-9, abs=1e-12)
    total = q.rollup_total(rollup.cursor())
    from_diagnosis = breakdown_total(list(ref.values()))  # what the Verdict page shows
    assert from_diagnosis["rows"] == total["rows"]
    for p in PHASES:
        if p in ("h2d_s", "gpu_ahead_s"):
            assert from_diagnosis[f"{p[:-2]}_share"] is None and total[f"{p[:-2]}_share"] is None
        else:
            assert from_diagnosis[f"{p[:-2]}_share"] == pytest.approx(total[f"{p[:-2]}_share"], rel=1e-9)
    assert from_diagnosis["h2d_measured"] is False
    assert total["data_wait_share"] > 0.15, total  # the planted slow loader (compute varies with machine load)


def test_rollup_reads_only_new_segments_and_adds_up(tmp_path):
    path = str(tmp_path / "live")
    write_run(path, 4, 20, segment="a", status="running")
    rollup = Rollup(path)
    v0 = rollup.version
    assert rollup.refresh() is False and rollup.version == v0  # nothing new: no work
    write_run(path, 4, 20, first_step=20, segment="b", status="running", data_wait_s=0.05)
    assert rollup.refresh() is True and rollup.version == v0 + 1
    grown = q.breakdown_per_rank(rollup.cursor())
    fresh = q.breakdown_per_rank(Rollup(path).cursor())
    assert [r["steps"] for r in grown] == [35] * 4  # 40 steps minus 5 warm-up
    for a, b in zip(grown, fresh):
        assert a["data_wait_share"] == pytest.approx(b["data_wait_share"], rel=1e-12)
    assert q.run_overview(rollup.cursor())["steps"] == 40


def test_a_followed_rollup_merges_its_rows_and_reads_the_same(tmp_path, monkeypatch):
    """A long live run followed file by file: the rollup merges its rows past the head (so every page query
    scans a bounded table) and every panel reads what an unmerged rollup of the same files reads."""
    from ranksight.collectors import _rollup

    path = str(tmp_path / "long")
    rollup = None
    for i in range(24):
        write_run(path, 4, 50, first_step=50 * i, segment=f"s{i:02d}", status="running", data_wait_s=0.01 + 0.001 * i)
        if rollup is None:
            rollup = Rollup(path)
        rollup.refresh()
    rows, last = rollup.cursor().execute("SELECT count(*), max(step_max) FROM rollup").fetchone()
    fine = 5 + _rollup.FINE_STEPS
    assert last == 1199 and rows <= 4 * (fine + _rollup.MAX_COLUMNS)  # 4,800 rows unmerged
    monkeypatch.setattr(_rollup.Rollup, "_compact_if_grown", lambda self: None)
    plain = Rollup(path)
    assert plain.cursor().execute("SELECT count(*) FROM rollup").fetchone()[0] == 4 * 1200
    a, b = rollup.cursor(), plain.cursor()

    def same(x: dict, y: dict) -> None:
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == (pytest.approx(y[k], rel=1e-12) if isinstance(y[k], float) else y[k]), k

    for fn in (q.breakdown_per_rank, q.rank_outliers):  # ranks of equal figures tie: compared rank by rank
        for x, y in zip(*(sorted(fn(c), key=lambda r: r["rank"]) for c in (a, b)), strict=True):
            same(x, y)
    same(q.rollup_total(a), q.rollup_total(b))
    same(q.run_overview(a), q.run_overview(b))
    # The order sorts the per-rank means compared above; this job's ranks tie, so only its members are compared.
    assert sorted(q.rank_order(a)) == sorted(q.rank_order(b)) == [0, 1, 2, 3]
    for bins in (10, 60, 120):
        for metric in ("step_s", "data_wait_s"):
            x, y = (q.heatmap(c, metric, [0, 1, 2, 3], bins, chunk_steps=rollup.chunk_steps) for c in (a, b))
            assert x["col_steps"] == y["col_steps"] and x["scale"] == y["scale"]
            assert [(c["row"], c["bin"]) for c in x["cells"]] == [(c["row"], c["bin"]) for c in y["cells"]]
            assert [c["value"] for c in x["cells"]] == pytest.approx([c["value"] for c in y["cells"]], rel=1e-12)


def _same_breakdown(rollup_con, path) -> None:
    ours = q.breakdown_per_rank(rollup_con)
    ref = step_breakdown(open_run(path))
    assert [r["steps"] for r in ours] == [r["steps"] for r in ref] and ours
    for a, b in zip(ours, ref):
        assert a["data_wait_share"] == pytest.approx(b["data_wait_share"], rel=1e-12)


def test_rollup_keeps_a_short_ranks_warm_steps_as_step_breakdown_does(tmp_path):
    """One warm-up rule (``ranksight.format.warmup``): a rank with no more rows than the warm-up keeps them
    all, also when some of them came after it (steps 3 to 7 here: 5 rows, 2 of them warm)."""
    path = write_run(str(tmp_path / "late"), 2, 5, first_step=3)
    _same_breakdown(Rollup(path).cursor(), path)
    assert [r["steps"] for r in q.breakdown_per_rank(Rollup(path).cursor())] == [5, 5]
    assert q.rollup_total(Rollup(path).cursor())["rows"] == breakdown_total(step_breakdown(open_run(path)))["rows"]


def test_rollup_of_a_run_whose_spool_was_pruned_reads_the_store(tmp_path):
    from ranksight.collectors import ingest, prune

    path = write_run(str(tmp_path / "stored"), 4, 20, samples=True)
    ingest(path)
    prune(path, older_than_s=0)  # the store alone holds the steps now
    assert os.listdir(os.path.join(path, "steps")) == []
    rollup = Rollup(path)
    _same_breakdown(rollup.cursor(), path)
    assert q.sample_names_present(rollup.cursor()) == ["gpu_utilization_ratio"]


def test_live_rollup_counts_every_segment_once_across_ingest_and_prune(tmp_path):
    from ranksight.collectors import ingest, prune

    path = str(tmp_path / "live")
    write_run(path, 4, 20, segment="a", status="running")
    rollup = Rollup(path)  # folds segment a from the spool
    write_run(path, 4, 20, first_step=20, segment="b", status="running", data_wait_s=0.05)
    ingest(path)  # a and b into the store ...
    prune(path, older_than_s=0)  # ... and both spool files gone before the rollup ever read b
    assert rollup.refresh() is True
    _same_breakdown(rollup.cursor(), path)
    write_run(path, 4, 20, first_step=40, segment="c", status="running")
    assert rollup.refresh() is True  # c from the spool
    ingest(path)
    rollup.refresh()  # a new store with c in it: not counted again
    _same_breakdown(rollup.cursor(), path)
    assert [r["steps"] for r in q.breakdown_per_rank(rollup.cursor())] == [55] * 4


def test_rollup_picks_up_a_kind_that_appears_later(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 10)
    rollup = Rollup(path)
    assert q.sample_names_present(rollup.cursor()) == []
    write_run(path, 2, 10, first_step=10, segment="b", samples=True)
    rollup.refresh()
    assert q.sample_names_present(rollup.cursor()) == ["gpu_utilization_ratio"]


def test_heatmap_at_1024_ranks_groups_rows_and_keeps_the_straggler_on_top(tmp_path):
    path = write_run(str(tmp_path / "big"), 1024, 12, straggler=613, samples=True)
    con = Rollup(path).cursor()
    order = q.rank_order(con, "mean compute (most first)")
    assert order[0] == 613 and sorted(order) == list(range(1024))
    hm = q.heatmap(con, "compute_s", order, bins=6, max_rows=128)
    assert hm["group"] == 8 and len(hm["rows"]) == 128
    assert hm["rows"][0]["label"] == "r613 +7" and 613 in hm["rows"][0]["ranks"]
    top = [c["value"] for c in hm["cells"] if c["row"] == 0]
    rest = [c["value"] for c in hm["cells"] if c["row"] != 0]
    assert min(top) == pytest.approx(0.2) and max(rest) == pytest.approx(0.1)  # the group shows its worst member
    util = q.heatmap(con, "gpu_utilization_ratio", order, bins=5, max_rows=128)
    assert {c["row"] for c in util["cells"]} == set(range(128))
    assert all(c["value"] == pytest.approx(0.6) for c in util["cells"] if c["row"] != 0)
    assert q.rank_outliers(con, 3)[0]["rank"] == 613
    assert q.rank_outliers(con, 3)[0]["compute_score"] == pytest.approx(0.5)


def test_the_step_heatmaps_of_one_scan_are_each_metrics_heatmap_alone(tmp_path):
    """The Heatmaps page pulls every step metric's heatmap from one scan (``step_heatmaps``): each is the one its
    metric gives alone, cells, rows and colour scale."""
    path = write_run(str(tmp_path / "big"), 64, 30, straggler=5)
    con = Rollup(path).cursor()
    order = q.rank_order(con, "mean compute (most first)")
    together = q.step_heatmaps(con, order, 7, 16, 4)
    assert list(together) == list(q.STEP_METRICS)
    for metric, hm in together.items():
        assert hm == q.step_heatmaps(con, order, 7, 16, 4, metrics=(metric,))[metric]
        assert hm["cells"] and {c["row"] for c in hm["cells"]} == set(range(16)) and hm["metric"] == metric
    assert together["compute_s"]["cells"][0]["label"] == "r5"  # the straggler's row comes first
    with pytest.raises(ValueError, match="not a step metric"):
        q.step_heatmaps(con, order, metrics=("gpu_utilization_ratio",))


def test_unknown_names_are_refused_not_pasted_into_sql(tmp_path):
    con = Rollup(write_run(str(tmp_path / "r"), 2, 6)).cursor()
    with pytest.raises(ValueError, match="unknown metric"):
        q.heatmap(con, "step_s; DROP TABLE rollup", [0, 1])
    with pytest.raises(ValueError, match="unknown rank order"):
        q.rank_order(con, "rank; --")
    with pytest.raises(ValueError, match="unknown sample names"):
        q.sample_series(con, ("x') OR 1=1 --",))
    assert q.run_overview(con)["ranks"] == 2  # table still there


def test_server_warm_up_hands_over_the_diagnosis_and_rollup_once(demo_run, monkeypatch):
    from ranksight.collectors import spool_signature
    from ranksight.dashboard import _launch, _warm
    from ranksight.rules import diagnose

    monkeypatch.setenv("RANKSIGHT_DASHBOARD_PATH", os.path.dirname(demo_run))  # a runs root: the newest run opens first
    assert _launch.first_run_path() == demo_run
    _warm.start(demo_run)
    signature, _ = _warm.finished(demo_run)
    assert signature == spool_signature(demo_run)
    assert _warm.take_diagnosis(demo_run, (0, 0)) is None  # made from other segments: not used
    warm = _warm.take_diagnosis(demo_run, signature)
    fresh = diagnose(demo_run)  # the same run again (sums may differ in the last bits: parallel aggregation)
    assert [f["rule"] for f in warm["findings"]] == [f["rule"] for f in fresh["findings"]]
    assert warm["findings"][0]["rule"] == "input-bound"
    assert warm["breakdown"]["ranks"][0]["data_wait_share"] == pytest.approx(
        fresh["breakdown"]["ranks"][0]["data_wait_share"], rel=1e-9
    )
    assert _warm.take_diagnosis(demo_run, signature) is None  # handed over once
    # The rollup (a scan of every step row) waits for the landing page to be drawn and a grace for the browser
    # to draw it (a redraw does not restart the wait), or for a page needing it.
    time.sleep(1.0)
    job = _warm._jobs[demo_run]
    assert not job.rollup_done.is_set()
    _warm.release(demo_run, after_s=30.0)
    timer = job.release_timer
    _warm.release(demo_run, after_s=0.5)
    assert job.release_timer is timer and not job.released.is_set()
    time.sleep(1.0)
    assert not job.released.is_set() and not job.rollup_done.is_set()
    _warm.release(demo_run)
    assert job.released.is_set()
    timer.cancel()
    rollup = _warm.take_rollup(demo_run)  # waits for it
    assert rollup is not None and rollup.version >= 1
    assert _warm.take_rollup(demo_run) is None


def test_the_landing_page_draws_without_importing_altair_and_the_others_with_it(tmp_path):
    """The Verdict page's chart is SVG and its tables markdown: its first render waits for neither altair's
    import nor pandas' (docs/scale.md)."""
    run = write_run(str(tmp_path / "runs" / "r"), 2, 8)
    code = (
        "import os, sys; os.environ['RANKSIGHT_DASHBOARD_PATH'] = sys.argv[1]\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"at = AppTest.from_file({APP_PATH!r}, default_timeout=60).run()\n"
        "assert not at.exception, at.exception\n"
        "assert any(\"data-chart='stacked-shares'\" in m.value for m in at.markdown)\n"
        "print('verdict', 'altair' in sys.modules, 'pandas' in sys.modules)\n"
        "at.switch_page('_pages/breakdown.py').run()\n"
        "assert not at.exception, at.exception\n"
        "print('breakdown', 'altair' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verdict False False" in out.stdout and "breakdown True" in out.stdout, out.stdout


def test_resolve_takes_a_run_or_a_root(tmp_path):
    run = write_run(str(tmp_path / "r1"), 1, 3)
    assert resolve(run).root == str(tmp_path) and resolve(run).run == "r1"
    assert resolve(str(tmp_path)).run is None


def test_dashboard_imports_and_renders_without_torch(tmp_path):
    """The serving machine may have no torch: block it and run the app end to end."""
    run = write_run(str(tmp_path / "runs" / "r"), 2, 8)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import os; os.environ['RANKSIGHT_DASHBOARD_PATH'] = sys.argv[1]\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"at = AppTest.from_file({APP_PATH!r}, default_timeout=60).run()\n"
        "for p in ('runs', 'breakdown', 'heatmaps', 'signals', 'compare'):\n"
        "    assert not at.exception, at.exception\n"
        "    at.switch_page(f'_pages/{p}.py').run()\n"
        "assert not at.exception, at.exception\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


# ---------------------------------------------------------------- every page through AppTest


def _app(monkeypatch, path: str):
    """Start the app on ``path``; the variable stays set for later reruns and page switches."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RANKSIGHT_DASHBOARD_PATH", path)
    return AppTest.from_file(APP_PATH, default_timeout=60).run()


def _texts(at) -> str:
    parts = [
        e.value
        for kind in ("title", "markdown", "caption", "text", "info", "warning", "error", "success", "code")
        for e in getattr(at, kind)
    ]
    return "\n".join(str(p) for p in parts)


PAGES = ("runs", "verdict", "breakdown", "heatmaps", "signals", "compare")


def test_verdict_shows_the_planted_fault_first(demo_run, monkeypatch):
    at = _app(monkeypatch, demo_run)  # a run folder opens that run on the Verdict page
    assert not at.exception
    text = _texts(at)
    assert "demo-input" in text
    assert "Where step time goes" in text and "data wait" in text
    from ranksight.rules import diagnose

    findings = diagnose(demo_run)["findings"]
    assert findings and findings[0]["rule"] == "input-bound", findings  # the root cause comes first
    headers = [m.value for m in at.markdown if m.value.startswith("####")]
    assert headers and "input\\-bound" in headers[0]
    # The fix's code as written, in a preformatted block (st.html: no syntax highlighter for the browser to load).
    codes = [_code_of(h.value) for h in at.html if h.value.startswith("<pre")]
    assert codes and codes[0].strip() == findings[0]["fix"]["snippet"].strip()
    assert not at.code and not at.table  # the landing page loads neither element's JavaScript


def test_landing_page_tables_and_code_show_their_text_literally():
    """``md_table`` and ``code_html`` (the landing page's tables and fix snippet): markdown and HTML in a run's
    text stay text, a cell stays on its line, a missing value is an empty cell."""
    from ranksight.dashboard._view import code_html, md_table

    table = md_table([{"item": "a|b *c*", "value": None}, {"item": "two\nlines", "value": 3}])
    lines = table.split("\n")
    assert len(lines) == 4 and lines[0] == "| item | value |" and lines[1] == "|---|---|"
    assert lines[2] == "| a\\|b \\*c\\* |  |" and lines[3] == "| two lines | 3 |"
    assert md_table([]) == ""
    snippet = "loader = DataLoader(ds, pin_memory=True)  # <script>alert(1)</script> & more\n    x = a < b"
    block = code_html(snippet)
    assert "<script>" not in block and block.startswith("<pre") and _code_of(block) == snippet


def _code_of(block: str) -> str:
    """The text of a ``<pre><code>`` block as the browser shows it."""
    import html

    return html.unescape(re.search(r"<code>(.*)</code>", block, re.S).group(1))


def test_verdict_draws_each_ranks_breakdown_beside_the_first_finding_with_its_cost(demo_run, monkeypatch):
    from ranksight.rules import diagnose

    at = _app(monkeypatch, demo_run)
    assert not at.exception
    diag = diagnose(demo_run)
    first, beside = at.columns[0], at.columns[1]
    assert any("input\\-bound" in m.value for m in first.markdown)  # the first finding, in the left column
    speedup = diag["findings"][0]["speedup"]
    assert speedup > 1.1
    from ranksight.dashboard import fix_gain_text
    from ranksight.dashboard._view import md_escape

    gain = fix_gain_text(diag["findings"][0])  # from the finding's speedup, "(estimate)" when the rule estimates it
    assert gain.startswith(f"fixing this could make steps up to {speedup:.2f}× faster")
    assert f"**{md_escape(gain)}**" in [m.value for m in first.markdown]
    charts = [m.value for m in beside.markdown if "data-chart='stacked-shares'" in m.value]
    assert len(charts) == 1  # drawn as SVG: the landing page loads no Vega
    bars = svg_bars(charts[0])
    assert sorted(bars) == ["0", "1"] and all(abs(sum(b.values()) - 1) < 1e-5 for b in bars.values())  # phases add up
    wait = {r["rank"]: r["data_wait_share"] for r in diag["breakdown"]["ranks"]}
    for rank, phases in bars.items():
        assert phases["data wait"] == pytest.approx(wait[int(rank)], abs=1e-6)
        assert "H2D copy" not in phases  # CPU job: absent, not a zero bar


def svg_bars(svg: str) -> dict[str, dict[str, float]]:
    """{bar: {phase: share}} of a ``_svg.stacked_bars`` chart, read back from its segments' attributes."""
    import html

    found: dict[str, dict[str, float]] = {}
    for bar, phase, share in re.findall(r"data-bar='([^']*)' data-phase='([^']*)' data-share='([^']*)'", svg):
        found.setdefault(html.unescape(bar), {})[html.unescape(phase)] = float(share)
    return found


def test_a_chart_of_many_ranks_draws_those_unlike_the_rest_and_the_named_and_sums_up_the_others():
    from ranksight.dashboard._queries import BARS_AT_MOST, STANDOUT_BARS, standout_ranks
    from ranksight.dashboard._view import stacked_by_rank_svg

    def row(rank, wait):
        return {
            "rank": rank,
            "data_wait_share": wait,
            "h2d_share": None,
            "compute_share": 0.8 - wait,
            "comm_exposed_share": 0.1,
            "optimizer_share": 0.05,
            "other_share": 0.05,
        }

    few = [row(r, 0.1) for r in range(BARS_AT_MOST)]
    assert standout_ranks(few) == (few, None)  # a bar each
    rows = [row(r, 0.1 + 0.0001 * (r % 7)) for r in range(1000)]
    for r in (17, 500, 999):
        rows[r] = row(r, 0.5)  # three ranks that wait for data five times as long
    kept, rest = standout_ranks(rows, named=[3])
    ranks = [r["rank"] for r in kept]
    assert len(kept) == STANDOUT_BARS and ranks == sorted(ranks)
    assert {3, 17, 500, 999} <= set(ranks)  # the named rank, and the ranks furthest from the median rank's mix
    others = [r for r in rows if r["rank"] not in ranks]
    assert rest["ranks"] == len(others) == 1000 - STANDOUT_BARS and rest["h2d_share"] is None
    assert rest["data_wait_share"] == pytest.approx(sum(r["data_wait_share"] for r in others) / len(others))
    bars = svg_bars(stacked_by_rank_svg(rows, named=[3]))
    assert len(bars) == STANDOUT_BARS + 1 and bars["500"]["data wait"] == pytest.approx(0.5)
    assert bars[f"rest ({len(others)})"]["data wait"] == pytest.approx(rest["data_wait_share"], abs=1e-6)
    from ranksight.dashboard._charts import stacked_by_rank

    chart_bars = [v["bar"] for v in stacked_by_rank(rows, named=[3])["data"]["values"]]  # the Breakdown page's
    assert list(dict.fromkeys(chart_bars)) == list(bars)


def test_run_picker_tells_runs_of_one_job_apart(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    written = time.time()
    write_run(str(root / "3f2a9c1e-7b4d-4e0f-9a51-8c2d6e1f0b7a"), 2, 10)
    write_run(str(root / "3f2a9c1e-7b4d-4e0f-9a51-8c2d6e1f0b7b"), 4, 12, status="running")
    # write_run starts its runs 10 s before it writes them
    starts = {time.localtime(t - 10) for t in (written, time.time())}
    at = _app(monkeypatch, str(root))
    assert not at.exception
    options = at.selectbox[0].options
    assert len(options) == 2 and len(set(options)) == 2
    for label in options:  # status, start time and job lead, short enough for the sidebar; then the long id
        status, start, job = label.split(" · ")[:3]
        assert status in ("finished", "● live") and start in {time.strftime("%m-%d %H:%M", t) for t in starts}
        assert job == "synthetic" and len(" · ".join((status, start, job))) <= 34  # what Chromium's sidebar shows
    assert {o.split(" · ")[0] for o in options} == {"finished", "● live"}
    shown = [t.value for t in at.sidebar.text]  # the full id and start time, as text
    full = {f"3f2a9c1e-7b4d-4e0f-9a51-8c2d6e1f0b7b\nstarted {time.strftime('%Y-%m-%d %H:%M:%S', t)}" for t in starts}
    assert full & set(shown), shown


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_the_demo_run(demo_run, page, monkeypatch):
    at = _app(monkeypatch, os.path.dirname(demo_run))
    at.switch_page(f"_pages/{page}.py").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    text = _texts(at)
    if page == "runs":
        assert any("demo\\-input" in m.value and m.value.startswith("| status | run |") for m in at.markdown)
        assert any(m.label == "steps" and m.value == str(DEMO_STEPS) for m in at.metric)
    if page == "breakdown":
        assert "All ranks:" in text and "H2D copy time is measured on GPUs only" in text
    if page == "heatmaps":
        assert "GPU utilization (NVML): not recorded" in text  # CPU job: absent, and said so
    if page == "signals":
        assert "absent: NVML utilization" in text
    if page == "compare":
        assert "only one run so far" in text


def test_compare_page_with_two_runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_run(str(root / "before"), 2, 20, data_wait_s=0.2)
    write_run(str(root / "after"), 2, 20, data_wait_s=0.01)
    at = _app(monkeypatch, str(root / "before"))
    at.switch_page("_pages/compare.py").run()
    assert not at.exception and not at.error
    table = at.table[0].value
    row = table[table["metric"] == "data wait share"].iloc[0]
    assert row["B - A"].startswith("-") and row["B - A"].endswith("pt")
    # The page shows what `ranksight compare` computes: the same function over the two diagnoses.
    from ranksight.dashboard import compare, speedup_sentence
    from ranksight.rules import diagnose

    expected = compare(diagnose(str(root / "before")), diagnose(str(root / "after")))
    assert expected["speedup"] > 1.5
    assert f"**{speedup_sentence(expected)}**" in [m.value for m in at.markdown]
    findings = at.table[1].value
    input_bound = findings[findings["finding"] == "input-bound"].iloc[0]
    changed = {f["rule"]: f for f in expected["findings"]["changed"]}["input-bound"]  # 48 % -> 4 % data wait
    assert input_bound["change"] == "changed" and changed["cost_share_b"] < changed["cost_share_a"] / 5
    assert input_bound["cost A"] == f"{100 * changed['cost_share_a']:.0f} %"


def test_empty_root_says_what_to_do(tmp_path, monkeypatch):
    at = _app(monkeypatch, str(tmp_path / "nothing-here"))
    assert not at.exception
    assert "no runs yet: add `ranksight.init()` to your loop, or run `ranksight demo`" in _texts(at)
    at.switch_page("_pages/runs.py").run()
    assert not at.exception and "no runs yet" in _texts(at)


def test_corrupt_segment_is_left_out_and_named_in_one_line(tmp_path, monkeypatch):
    """A damaged segment costs its own rows only: every page draws the rest, and the Runs page names it."""
    path = write_run(str(tmp_path / "runs" / "broken"), 2, 10)
    with open(os.path.join(path, "steps", "zz-garbage.parquet"), "wb") as f:
        f.write(b"this is not parquet")
    at = _app(monkeypatch, path)
    assert not at.exception and not at.error
    at.switch_page("_pages/runs.py").run()
    assert not at.exception and not at.error
    assert any(m.label == "steps" and m.value == "10" for m in at.metric)  # the readable segment, all of it
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("left out, unreadable: ") and "zz-garbage.parquet" in warnings[0]


def test_foreign_directory_is_not_mistaken_for_runs(tmp_path, monkeypatch):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    at = _app(monkeypatch, str(tmp_path))
    assert not at.exception and "no runs yet" in _texts(at)


def test_run_names_with_quotes_and_html_are_shown_as_text(tmp_path, monkeypatch):
    # No square brackets: collectors' glob() would read them as a pattern (reported to the lead).
    name = 'it\'s <img src=x onerror=alert(1)> <b>bold **x** $y$ :smile: "q"'
    path = write_run(str(tmp_path / "runs" / name), 2, 10)
    rollup = Rollup(path)  # the path is quoted for DDL and bound as a parameter for reads
    assert q.run_overview(rollup.cursor())["ranks"] == 2
    at = _app(monkeypatch, path)
    assert not at.exception and not at.error
    assert f"run: {name}" in [t.value for t in at.text]  # st.text: never rendered as markup
    for m in at.markdown:
        assert "<img" not in m.value and "<b>" not in m.value


# ---------------------------------------------------------------- command line


def test_cli_refuses_a_taken_port_with_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "ranksight", "dashboard", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "pick another --port" in out.stderr


def test_cli_refuses_a_file_as_run_dir(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("x")
    out = subprocess.run(
        [sys.executable, "-m", "ranksight", "dashboard", str(f)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "not a directory" in out.stderr


def test_run_folder_without_ranks_yet_is_skipped(tmp_path, monkeypatch):
    """A run folder being created (ranks/ not there yet) is listed as nothing, not an error."""
    src = write_run(str(tmp_path / "runs" / "r"), 2, 6)
    shutil.rmtree(os.path.join(src, "ranks"))
    at = _app(monkeypatch, str(tmp_path / "runs"))
    assert not at.exception and "no runs yet" in _texts(at)


def _write_kind(path: str, kind: str, rows: list[dict]) -> None:
    """Write one segment of ``kind`` with the record schema (identity columns filled in)."""
    schema = arrow_schema(kind)
    ident = {
        "job": "synthetic",
        "run": os.path.basename(path),
        "node": "n0",
        "local_rank": 0,
        "world_size": 2,
        "pid": 1,
    }
    full = [{**ident, **r} for r in rows]
    os.makedirs(os.path.join(path, kind), exist_ok=True)
    table = pa.table({f.name: pa.array([r.get(f.name) for r in full], type=f.type) for f in schema}, schema=schema)
    pq.write_table(table, os.path.join(path, kind, f"{kind}-extra.parquet"))


def test_signals_page_shows_gpu_and_compile_signals(tmp_path, monkeypatch):
    path = write_run(str(tmp_path / "runs" / "gpu"), 2, 10)
    t0 = time.time_ns()
    samples = []
    for rank in (0, 1):
        for i in range(6):
            t = t0 + i * 10**9
            samples += [
                {"rank": rank, "time_ns": t, "step": i, "name": "gpu_utilization_ratio", "value": 0.9},
                {"rank": rank, "time_ns": t, "step": i, "name": "kernel_busy_ratio", "value": 0.35},
                {"rank": rank, "time_ns": t, "step": i, "name": "memory_fragmentation_ratio", "value": 0.1 * i},
                {"rank": rank, "time_ns": t, "step": i, "name": "memory_alloc_retries_total", "value": float(i // 2)},
            ]
    _write_kind(path, "samples", samples)
    reason = "data dependent operator: aten._local_scalar_dense <script>"
    _write_kind(
        path,
        "compile",
        [
            {"rank": r, "time_ns": t0, "step": 9, "kind": "graph_break", "reason": reason, "detail": "x", "count": 2}
            for r in (0, 1)
        ]
        + [{"rank": 0, "time_ns": t0, "step": 19, "kind": "recompile", "reason": "size mismatch", "count": 1}],
    )
    con = Rollup(path).cursor()
    per_rank = {(r["rank"], r["name"]): r["mean"] for r in q.sample_per_rank(con, q.UTILIZATION_SIGNALS)}
    assert per_rank[(1, "gpu_utilization_ratio")] == pytest.approx(0.9)
    assert per_rank[(1, "kernel_busy_ratio")] == pytest.approx(0.35)
    series = q.sample_series(con, q.FRAGMENTATION_SIGNALS, bins=6)
    assert max(s["max"] for s in series if s["name"] == "memory_fragmentation_ratio") == pytest.approx(0.5)
    events = q.compile_events(con)
    assert events[0] == {**events[0], "kind": "graph_break", "reason": reason, "count": 4, "ranks": 2}

    at = _app(monkeypatch, path)
    at.switch_page("_pages/signals.py").run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert table.iloc[0]["reason"] == reason and table.iloc[0]["count"] == 4  # shown as data, not markup
    assert "absent" not in _texts(at)
    at.switch_page("_pages/heatmaps.py").run()
    assert not at.exception and "GPU utilization (NVML): not recorded" not in _texts(at)


def test_a_young_run_with_no_steps_yet_renders_every_page(tmp_path, monkeypatch):
    path = tmp_path / "runs" / "young"
    (path / "ranks").mkdir(parents=True)
    now = time.time_ns()
    meta = {
        "rank": 0,
        "job": "j",
        "run": "young",
        "world_size": 2,
        "status": "running",
        "started_ns": now,
        "heartbeat_ns": now,
        "steps": 0,
        "flush_interval_s": 2.0,
    }
    (path / "ranks" / "rank-00000.json").write_text(json.dumps(meta))
    at = _app(monkeypatch, str(path))
    for page in PAGES:
        at.switch_page(f"_pages/{page}.py").run()
        assert not at.exception and not at.error, (page, [e.value for e in at.error])
        if page in ("verdict", "breakdown", "heatmaps"):
            assert "no steps recorded yet" in _texts(at), page
