"""Watching a live run: one snapshot per refresh shared by every part of the page, a clock that says which,
provisional verdicts, and heatmaps whose columns and colours hold still while the run grows.

Synthetic runs written with the record schema (``write_run``); the browser test of a real job is in
``test_dashboard_live_browser.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from ranksight.dashboard import APP_PATH, Rollup, _data
from ranksight.dashboard import _queries as q
from ranksight.dashboard._view import clock_text
from ranksight.rules import PROVISIONAL_BELOW_STEPS, provisional, provisional_text
from tests.test_dashboard import write_run


def test_a_snapshot_is_kept_until_a_file_changes_and_then_takes_in_the_new_steps(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    first = _data.snapshot(path, refresh_s=0)
    assert (first.status, first.steps, first.serial, first.error) == ("live", 20, 1, None), first
    assert first.diagnosis is not None
    assert _data.snapshot(path, refresh_s=0) is first  # nothing written: the same snapshot, no reading
    _data.pull(path, q.run_overview)  # a page builds the rollup
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    second = _data.snapshot(path, refresh_s=0)
    assert second.serial == 2 and second.steps == 40
    # The verdict, the charts' figures and the clock come from the same refresh.
    assert max(r["steps"] for r in second.diagnosis["breakdown"]["ranks"]) == 40 - 5
    assert _data.pull(path, q.run_overview)["steps"] == 40
    # Within one refresh interval, tabs share the snapshot without looking at the files.
    write_run(path, 2, 20, first_step=40, segment="c", status="running")
    assert _data.snapshot(path, refresh_s=3600) is second
    assert _data.snapshot(path, refresh_s=0).steps == 60


def test_the_runs_list_tells_a_followed_run_as_its_snapshot_does(tmp_path):
    root = tmp_path / "runs"
    path = write_run(str(root / "run"), 2, 20, status="running")
    snap = _data.snapshot(path, refresh_s=0)
    listed = next(r for r in _data.runs(str(root)) if r["path"] == path)
    assert (listed["status"], listed["steps"], listed["last_update_ns"]) == (snap.status, snap.steps, snap.as_of_ns)
    write_run(path, 2, 20, first_step=20, segment="b", status="finished")
    end = _data.snapshot(path, refresh_s=0)
    assert end.status == "finished" and end.steps == 40
    listed = next(r for r in _data.runs(str(root)) if r["path"] == path)
    assert listed["status"] == "finished" and listed["steps"] == 40


def test_clock_text_says_step_and_as_of_with_its_age(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    snap = _data.snapshot(path, refresh_s=0)
    text = clock_text(snap, now_ns=snap.as_of_ns + 3_400_000_000)
    as_of = time.strftime("%H:%M:%S", time.localtime(snap.as_of_ns / 1e9))
    assert text == f"● live · step 20 of the run, as of {as_of} (3 s ago)"


def test_a_live_verdict_from_too_few_steps_is_provisional_and_a_finished_one_is_not(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 12, status="running")
    note = _data.provisional_note(path)
    assert note == provisional_text(12 - 5) and "rests on 7 steps after warm-up" in note
    assert str(PROVISIONAL_BELOW_STEPS) in note
    write_run(path, 2, PROVISIONAL_BELOW_STEPS, first_step=12, segment="b", status="running")
    _data.snapshot(path, refresh_s=0)  # the next refresh
    assert provisional(_data.diagnosis(path)) is None and _data.provisional_note(path) is None


def _diagnose_cli(path: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ranksight", "diagnose", path], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ranksight_diagnose_labels_a_live_runs_early_verdict_provisional(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 8, status="running")
    lines = _diagnose_cli(path).splitlines()
    assert lines[1] == provisional_text(3), lines[:3]  # right under the run's name, above the verdict
    write_run(path, 2, 8, status="finished")  # the same steps, the run ended: the verdict is what it is
    assert "provisional" not in _diagnose_cli(path)


def test_heatmap_columns_keep_their_width_in_steps_and_double_when_full(tmp_path):
    assert [q.column_steps(last, 10) for last in (0, 9, 10, 19, 20, 39, 40)] == [1, 1, 2, 2, 4, 4, 8]
    assert q.column_steps(100, 10, chunk_steps=64) == 64
    path = write_run(str(tmp_path / "run"), 2, 15, status="running")
    con = Rollup(path).cursor()
    hm = q.heatmap(con, "step_s", [0, 1], bins=10)
    assert hm["col_steps"] == 2 and {c["step"] for c in hm["cells"]} == set(range(0, 15, 2))
    write_run(path, 2, 4, first_step=15, segment="b", status="running")  # 19 steps: still 2 per column
    con = Rollup(path).cursor()
    again = q.heatmap(con, "step_s", [0, 1], bins=10)
    first_row = [c["step"] for c in again["cells"] if c["row"] == 0]
    assert again["col_steps"] == 2 and first_row[:8] == [c["step"] for c in hm["cells"] if c["row"] == 0]
    assert first_row == list(range(0, 20, 2))  # one more column, the others where they were


def test_heatmap_colour_scale_is_fixed_from_steps_after_warm_up(tmp_path):
    path = str(tmp_path / "run")
    write_run(path, 2, 5, data_wait_s=5.0, status="running")  # slow warm-up steps: no say in the scale
    write_run(path, 2, 60, first_step=5, segment="b", status="running")
    con = Rollup(path).cursor()
    scale = q.colour_scale(con, "data_wait_s")
    step_s = 0.01 + 0.1 + 0.1 + 0.01  # write_run's step: data wait, compute, comm, optimizer
    assert scale["high"] == pytest.approx(1.25 * step_s) and scale["fixed"] and scale["first_step"] == 5
    write_run(path, 2, 40, first_step=65, data_wait_s=1.0, segment="c", status="running")  # a later slowdown
    con = Rollup(path).cursor()
    assert q.colour_scale(con, "data_wait_s") == scale  # the colours keep their meaning
    assert q.colour_scale(con, "gpu_utilization_ratio")["high"] == 1.0


def _app(monkeypatch, path: str):
    monkeypatch.setenv("RANKSIGHT_DASHBOARD_PATH", path)
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(APP_PATH, default_timeout=60).run()


@pytest.mark.parametrize("page", ["verdict", "runs", "breakdown", "heatmaps", "signals"])
def test_every_page_and_the_sidebar_show_the_same_clock(tmp_path, monkeypatch, page):
    path = write_run(str(tmp_path / "runs" / "live"), 2, 12, status="running")
    at = _app(monkeypatch, os.path.dirname(path))
    if page != "verdict":
        at.switch_page(f"_pages/{page}.py").run()
    assert not at.exception, at.exception
    main = [c.value for c in at.main.caption if "of the run, as of" in c.value]
    side = [c.value for c in at.sidebar.caption if "of the run, as of" in c.value]
    assert len(main) == 1 and len(side) == 1, (main, side)
    assert main[0].split(" (")[0] == side[0].split(" (")[0]  # the same step and as of; the age is drawn apart
    assert "step 12 of the run" in main[0].replace("\\", "")
    if page == "verdict":
        assert any("provisional: rests on 7 steps" in w.value for w in at.warning)
    if page == "runs":
        assert any("| 12 |" in m.value for m in at.markdown)  # the table's steps: the clock's


def test_the_cpu_budget_holds_refreshes_back_but_not_the_end_of_the_run(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    first = _data.snapshot(path, refresh_s=0)
    follower = _data._follower(path)
    follower.cpu_at = time.process_time() - 100.0  # as if the server had been busy since the last snapshot
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    time.sleep(0.2)  # past a refresh interval of 0.1 s, within the 60 the budget may hold a snapshot back
    assert _data.snapshot(path, refresh_s=0.1) is first  # new steps wait for the budget
    write_run(path, 2, 20, first_step=20, segment="b", status="finished")
    time.sleep(0.2)
    end = _data.snapshot(path, refresh_s=0.1)
    assert end.status == "finished" and end.steps == 40  # the end does not wait


def test_a_live_verdict_is_made_again_once_the_run_grew_by_a_tenth_and_the_page_says_which_step_it_is_of(
    tmp_path, monkeypatch
):
    path = write_run(str(tmp_path / "runs" / "live"), 2, 100, status="running")
    first = _data.snapshot(path, refresh_s=0)
    assert (first.steps, first.verdict_steps) == (100, 100) and _data.verdict_note(path) is None
    assert _data.rejudge_at(100) == 110 and _data.rejudge_at(0) == 1
    write_run(path, 2, 9, first_step=100, segment="b", status="running")  # 109 steps: under 10 % more
    kept = _data.snapshot(path, refresh_s=0)
    assert kept.serial == 2 and kept.steps == 109  # the clock moves on ...
    assert kept.verdict_steps == 100 and kept.diagnosis is first.diagnosis  # ... the verdict is the last one's
    note = _data.verdict_note(path)
    assert note.startswith("verdict of step 100 (as of ") and "made again from step 110" in note
    at = _app(monkeypatch, os.path.dirname(path))
    assert not at.exception, at.exception
    assert any(c.value.startswith("verdict of step 100") for c in at.main.caption), [c.value for c in at.main.caption]
    write_run(path, 2, 1, first_step=109, segment="c", status="running")  # 110: judged again
    again = _data.snapshot(path, refresh_s=0)
    assert (again.steps, again.verdict_steps) == (110, 110) and _data.verdict_note(path) is None
    assert max(r["steps"] for r in again.diagnosis["breakdown"]["ranks"]) == 110 - 5
    write_run(path, 2, 1, first_step=110, segment="d", status="finished")  # ended: judged at once, whatever grew
    end = _data.snapshot(path, refresh_s=0)
    assert (end.status, end.steps, end.verdict_steps) == ("finished", 111, 111)
    assert max(r["steps"] for r in end.diagnosis["breakdown"]["ranks"]) == 111 - 5


def test_a_rollup_given_the_snapshots_listing_folds_the_new_segments_named_there_and_lists_nothing(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    rollup = Rollup(path)
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    _, listing = _data.run_listing(path)
    write_run(path, 2, 20, first_step=40, segment="c", status="running")  # written after the listing
    assert rollup.refresh(listing) and q.run_overview(rollup.cursor())["steps"] == 40  # "c" not looked at yet
    assert not rollup.refresh(listing)
    _, listing = _data.run_listing(path)
    assert rollup.refresh(listing) and q.run_overview(rollup.cursor())["steps"] == 60
    # The per-rank totals add each refresh's rows to the last ones': the same sums, added in another order.
    grown, fresh = (q.breakdown_per_rank(r.cursor()) for r in (rollup, Rollup(path)))
    assert [r.keys() for r in grown] == [r.keys() for r in fresh]
    for a, b in zip(grown, fresh, strict=True):
        assert a == {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in b.items()}


def test_a_folder_listing_lists_again_only_where_the_folder_may_have_changed_and_misses_no_file(tmp_path):
    folder = tmp_path / "steps"
    folder.mkdir()
    (folder / "a.parquet").write_bytes(b"")
    listing = _data.FolderListing(str(folder), _data._is_segment)
    assert listing.look() and listing.names == {"a.parquet"}
    # A file added in the same mtime tick as the listing (a coarse filesystem): the folder's mtime did not move.
    tick = os.stat(folder).st_mtime_ns
    (folder / "b.parquet").write_bytes(b"")
    (folder / ".tmp-c.parquet").write_bytes(b"")  # being written: not a segment
    os.utime(folder, ns=(tick, tick))
    assert listing.look() and listing.names == {"a.parquet", "b.parquet"}

    def settled() -> None:  # the folder's mtime further in the past than the slack: its listing can be trusted
        old = time.time_ns() - 10 * _data.LISTING_SLACK_NS
        os.utime(folder, ns=(old, old))
        listing.look()

    settled()
    listed = listing.listings
    assert not listing.look() and not listing.look() and listing.listings == listed  # one stat each, no listing
    (folder / "d.parquet").write_bytes(b"")
    assert listing.look() and listing.names == {"a.parquet", "b.parquet", "d.parquet"}
    settled()
    # Compacted: two files replaced by one (their names gone), and a temporary file renamed into place.
    (folder / "ab.parquet").write_bytes(b"")
    os.remove(folder / "a.parquet")
    os.remove(folder / "b.parquet")
    os.replace(folder / ".tmp-c.parquet", folder / "c.parquet")
    assert listing.look() and listing.names == {"ab.parquet", "c.parquet", "d.parquet"}
    settled()
    os.remove(folder / "d.parquet")
    assert listing.look() and listing.names == {"ab.parquet", "c.parquet"}
    shutil.rmtree(folder)  # gone (a run folder moved away), then back
    assert listing.look() and listing.names == frozenset()
    folder.mkdir()
    (folder / "e.parquet").write_bytes(b"")
    assert listing.look() and listing.names == {"e.parquet"}


def test_a_snapshot_sees_a_segment_written_in_the_same_mtime_tick_as_its_last_listing(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    _data.snapshot(path, refresh_s=0)
    assert _data.pull(path, q.run_overview)["steps"] == 20  # a page builds the rollup
    steps = os.path.join(path, "steps")
    tick = os.stat(steps).st_mtime_ns
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    os.utime(steps, ns=(tick, tick))  # the new segment in the same mtime tick as the last listing
    snap = _data.snapshot(path, refresh_s=0)
    assert snap.steps == 40 and _data.pull(path, q.run_overview)["steps"] == 40
    assert max(r["steps"] for r in snap.diagnosis["breakdown"]["ranks"]) == 40 - 5
    # Settled folders are not listed again: a refresh lists the folder a segment arrived in, and no other.
    old = time.time_ns() - 10 * _data.LISTING_SLACK_NS
    for name in os.listdir(path):
        os.utime(os.path.join(path, name), ns=(old, old))
    _data.snapshot(path, refresh_s=0)
    folders = _data._follower(path).listing.folders
    listed = {kind: folder.listings for kind, folder in folders.items()}
    write_run(path, 2, 20, first_step=40, segment="c", status="running")
    snap = _data.snapshot(path, refresh_s=0)
    assert snap.steps == 60 and _data.pull(path, q.run_overview)["steps"] == 60
    assert {kind: folder.listings - listed[kind] for kind, folder in folders.items()} == {
        kind: int(kind == "steps") for kind in folders
    }


def test_a_rollup_finds_a_refreshs_few_new_digests_one_stat_each_not_by_listing_them_all(tmp_path, monkeypatch):
    import importlib

    from ranksight.collectors import _rollup

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    bench = importlib.import_module("dashboard_bench")
    path = str(tmp_path / "live-run")
    for first in range(0, 100, 10):
        bench.append_steps(path, 16, first, 10)  # a file and its digest per node of 8 ranks and flush: 20 files
    rollup = Rollup(path)
    assert rollup.digested == 20
    listed = []
    digest_paths = _rollup.digest_paths
    monkeypatch.setattr(_rollup, "digest_paths", lambda *a: (listed.append(a), digest_paths(*a))[1])
    bench.append_steps(path, 16, 100, 16)
    assert rollup.refresh() and rollup.digested == 22 and not listed

    def rounded(rows: list[dict]) -> list[dict]:  # sums added in another order differ in the last bits
        return [{k: round(v, 12) if isinstance(v, float) else v for k, v in row.items()} for row in rows]

    assert rounded(q.breakdown_per_rank(rollup.cursor())) == rounded(q.breakdown_per_rank(Rollup(path).cursor()))
    assert listed  # the fresh rollup's first refresh, with every file new, listed the folder


def test_a_followed_runs_rollup_answers_the_pulls_on_one_duckdb_thread(tmp_path):
    path = write_run(str(tmp_path / "run"), 2, 20, status="running")
    _data.snapshot(path, refresh_s=0)
    rollup = _data.rollup(path)
    assert rollup.cursor().execute("SELECT current_setting('threads')").fetchone()[0] == 1
    assert _data.pull(path, q.run_overview)["steps"] == 20
