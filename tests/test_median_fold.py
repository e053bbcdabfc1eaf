"""A reading refreshed again and again (``open_run(incremental=True)``, the live dashboard's) takes the per-rank
medians from those its process keeps (``collectors/_median_fold.py``), fed only the files added since: the
same numbers as a fresh reading of the same files, whose medians DuckDB takes from the rows.

The spool is the node spool's, as ``benchmarks/dashboard_bench.py --refresh-scale`` writes it: a file per node
of 8 ranks and flush, its digest beside it, so each rank's rows are in several files and no file's own
median stands for the rank's.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

from ranksight.collectors import _median_fold, open_run
from ranksight.rules import diagnose

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    folder = os.path.join(ROOT, "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("dashboard_bench")


@pytest.fixture(autouse=True)
def no_kept_folds():
    _median_fold._folds.clear()
    _median_fold._too_big.clear()
    yield
    _median_fold._folds.clear()
    _median_fold._too_big.clear()


@pytest.fixture
def rows_read(monkeypatch) -> list[int]:
    """The row count of each ``take_in`` call the fold makes (one per figure and reading of new files)."""
    counts: list[int] = []
    take_in = _median_fold._Fold.take_in
    monkeypatch.setattr(
        _median_fold._Fold, "take_in", lambda self, f, r, v: (counts.append(len(r)), take_in(self, f, r, v))
    )
    return counts


def _fresh(path: str) -> tuple[dict, dict]:
    """The verdict and features of a fresh reading of ``path``, medians from the rows (no fold kept)."""
    kept = dict(_median_fold._folds)
    _median_fold._folds.clear()
    run = open_run(path, follow_spool=False)
    try:
        assert run.summary().read_from == ("digests",)
        return diagnose(run), run.features()
    finally:
        run.close()
        _median_fold._folds.clear()
        _median_fold._folds.update(kept)


def test_a_refreshed_reading_takes_the_rows_medians_reading_only_the_new_files(bench, tmp_path, monkeypatch, rows_read):
    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 20)
    bench.append_steps(path, 16, 20, 20)  # each rank's rows in two files: no file's median is the rank's
    run = open_run(path, follow_spool=False, incremental=True)
    try:
        assert run.summary().read_from == ("digests",)
        assert (diagnose(run), run.features()) == _fresh(path)
        assert rows_read and set(rows_read) == {16 * (40 - 5)}  # every rank's steps after warm-up, per figure
        (fold,) = _median_fold._folds.values()
        files = len(fold.files)
        assert files == 4 and fold.count > 0  # one file per node of 8 and flush
        # Flushes of 16 and 15 steps: each rank's count of steps after warm-up goes odd, even, odd.
        for first, steps in ((40, 16), (56, 15)):
            bench.append_steps(path, 16, first, steps)
            rows_read.clear()
            assert run.refresh()
            assert (diagnose(run), run.features()) == _fresh(path)
            (fold,) = _median_fold._folds.values()
            # Only the new files were read: two more, and the values of their steps alone.
            assert len(fold.files) == files + 2 and set(rows_read) == {16 * steps}
            files = len(fold.files)
    finally:
        run.close()


def test_a_file_gone_from_the_spool_starts_the_fold_again(bench, tmp_path):
    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 40)
    bench.append_steps(path, 16, 40, 20)
    run = open_run(path, follow_spool=False, incremental=True)
    try:
        diagnose(run)
        gone = sorted(n for n in os.listdir(os.path.join(path, "steps")) if n.endswith(".parquet"))[-1]
        os.remove(os.path.join(path, "steps", gone))  # as a prune after ingest would, here without the store
        assert run.refresh()
        assert (diagnose(run), run.features()) == _fresh(path)
        (fold,) = _median_fold._folds.values()
        assert len(fold.files) == 3
    finally:
        run.close()


def test_the_folds_median_is_duckdbs_median_of_the_rows():
    import duckdb

    rng = np.random.default_rng(7)
    con = duckdb.connect()
    fold = _median_fold._Fold(("period",))
    # Ranks past 16 bits are sorted another way than the ones below; rows come in any order, some without a value.
    for n, first_rank in ((1, 0), (2, 0), (3, 0), (10, 0), (11, 0), (64, 0), (11, 70_000), (64, 65_530)):
        ranks = rng.permutation(np.repeat(np.arange(first_rank, first_rank + 20, dtype=np.int64), n))
        values = rng.gamma(2.0, 0.01, len(ranks)) * 10 ** rng.uniform(-3, 3, len(ranks))
        values[::7] = np.round(values[::7], 2)  # ties
        values[5::13] = np.nan  # NULL: left out, as ``median`` leaves it
        fold.values["period"].clear()
        fold.take_in("period", ranks, values)
        kept = ~np.isnan(values)
        assert fold.medians()["period"] == _duckdb_medians(con, ranks[kept], values[kept]), (n, first_rank)


def test_the_dashboards_live_verdict_of_a_node_spool_is_a_fresh_readings_after_each_refresh(bench, tmp_path):
    from ranksight.dashboard import _data

    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 20)
    bench.append_steps(path, 16, 20, 20)
    for first in (40, 56):
        snap = _data.snapshot(path, refresh_s=0)
        assert snap.status == "live" and snap.steps == first
        assert snap.diagnosis == _fresh(path)[0]
        bench.append_steps(path, 16, first, 16)
    assert _data._follower(path).run is not None and _median_fold._folds  # judged incrementally, not re-read


def test_a_run_past_the_bound_has_its_medians_read_from_the_rows_without_folding_again(bench, tmp_path, monkeypatch):
    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 20)
    bench.append_steps(path, 16, 20, 20)
    monkeypatch.setattr(_median_fold, "KEPT_MEDIAN_VALUES", 100)
    run = open_run(path, follow_spool=False, incremental=True)
    try:
        assert (diagnose(run), run.features()) == _fresh(path)
        assert not _median_fold._folds and _median_fold._too_big
        taken = []
        monkeypatch.setattr(_median_fold._Fold, "take_in", lambda *a: taken.append(a))
        bench.append_steps(path, 16, 40, 16)
        assert run.refresh()
        assert (diagnose(run), run.features()) == _fresh(path) and not taken
    finally:
        run.close()


def _duckdb_medians(con, ranks, values) -> dict:
    rows = con.execute(
        "SELECT r, median(v) FROM (SELECT unnest($r) AS r, unnest($v) AS v) GROUP BY r",
        {"r": ranks.tolist(), "v": values.tolist()},
    ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("drift", [0.0, 0.02])
def test_a_fold_cut_to_bands_around_its_medians_keeps_them_exact_and_starts_again_where_one_leaves(monkeypatch, drift):
    """Past its bound the fold keeps each rank's values nearest the median and counts the rest: the medians stay
    DuckDB's of every row. A run whose figures keep rising (``drift``) moves its medians out of the bands: the fold
    says so (None), and one started again from every value finds them."""
    import duckdb

    monkeypatch.setattr(_median_fold, "BAND_AT_LEAST", 8)
    rng = np.random.default_rng(11)
    con = duckdb.connect()
    fold, every_rank, every_value, cut, lost = _median_fold._Fold(("period",)), [], [], 0, 0
    for batch in range(60):
        ranks = np.repeat(np.arange(6, dtype=np.int64), 16)
        values = rng.gamma(20.0, 0.005, len(ranks)) * (1 + drift * batch) * np.where(ranks == 5, 1.3, 1.0)
        values[::5] = np.round(values[::5], 2)  # ties, also with the band's ends
        every_rank.append(ranks)
        every_value.append(values)
        fold.take_in("period", ranks, values)
        found = fold.medians()
        if found is None:  # as ``folded_medians`` does: every value again into a fold not cut
            lost += 1
            fold = _median_fold._Fold(("period",))
            fold.take_in("period", np.concatenate(every_rank), np.concatenate(every_value))
            found = fold.medians()
        assert found["period"] == _duckdb_medians(con, np.concatenate(every_rank), np.concatenate(every_value))
        if fold.count > 6 * 200:  # the bound: 200 values a rank
            assert fold.trim(6 * 100)
            cut += 1
            assert fold.count == 6 * 100 and all(len(v) == 100 for v in fold.values["period"].values())
    assert cut >= 3
    assert (lost > 0) == (drift > 0), lost


def test_a_reading_past_the_bound_keeps_its_fold_cut_and_reads_only_the_new_files(
    bench, tmp_path, monkeypatch, rows_read
):
    monkeypatch.setattr(_median_fold, "BAND_AT_LEAST", 8)
    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 40)
    bench.append_steps(path, 16, 40, 40)
    # 16 ranks x 75 steps after warm-up x 2 figures: 2,400 values, cut to 32 series x 18 at the first reading.
    monkeypatch.setattr(_median_fold, "KEPT_MEDIAN_VALUES", 1200)
    run = open_run(path, follow_spool=False, incremental=True)
    try:
        assert (diagnose(run), run.features()) == _fresh(path)
        (fold,) = _median_fold._folds.values()
        assert fold.count <= 600 and any(fold.below["period"].values()) and not _median_fold._too_big
        for first in (80, 96, 112, 128):
            bench.append_steps(path, 16, first, 16)
            rows_read.clear()
            assert run.refresh()
            assert (diagnose(run), run.features()) == _fresh(path)
            (fold,) = _median_fold._folds.values()
            assert set(rows_read) == {16 * 16}  # the new files alone: no median left its band
    finally:
        run.close()


@pytest.mark.parametrize("rebuilt_after", [1, 3])
def test_a_median_that_leaves_its_band_has_the_fold_read_every_file_again(
    bench, tmp_path, monkeypatch, rebuilt_after, rows_read
):
    """A band of one value cannot hold a median as the run grows: each reading reads every file again where the
    bands held for ``REBUILT_AFTER_READINGS`` (here 1); where they must hold longer, the fold is dropped at once
    and the medians are read from the rows, every reading exact."""
    monkeypatch.setattr(_median_fold, "REBUILT_AFTER_READINGS", rebuilt_after)
    monkeypatch.setattr(_median_fold, "BAND_AT_LEAST", 1)
    path = str(tmp_path / "live-run")
    bench.append_steps(path, 16, 0, 20)
    bench.append_steps(path, 16, 20, 20)
    monkeypatch.setattr(_median_fold, "KEPT_MEDIAN_VALUES", 64)  # a band of one value a rank and figure
    run = open_run(path, follow_spool=False, incremental=True)
    try:
        assert (diagnose(run), run.features()) == _fresh(path)
        assert _median_fold._folds and not _median_fold._too_big
        everything = 16 * (40 - 5)
        for first in (40, 56, 72):
            bench.append_steps(path, 16, first, 16)
            rows_read.clear()
            assert run.refresh()
            assert (diagnose(run), run.features()) == _fresh(path)
            everything += 16 * 16
            if rebuilt_after == 1:  # 16 new values a rank moved a median out of its band: every file read again
                assert set(rows_read) == {16 * 16, everything}, rows_read
            else:  # dropped at the first (the new files read, then given up), and not folded again
                assert set(rows_read) == ({16 * 16} if first == 40 else set()), rows_read
                assert not _median_fold._folds and _median_fold._too_big
    finally:
        run.close()
