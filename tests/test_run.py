"""``collectors.open_run(path) -> Run``: the one object a reader holds, with the figures the CLI and ``diagnose``
read from it."""

from __future__ import annotations

import duckdb
import pytest

from ranksight.collectors import Run, ingest, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.format.phases import breakdown_total
from ranksight.rules import diagnose

from .test_dashboard import write_run


def _same(a: list[dict], b: list[dict]) -> None:
    """Equal rows, floats to within DuckDB's summing order."""
    assert [sorted(r) for r in a] == [sorted(r) for r in b] and a
    for x, y in zip(a, b):
        assert x == {k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in y.items()}


def test_a_run_gives_the_shared_figures_once_per_reading(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20)
    run = open_run(path)
    assert isinstance(run, Run) and run.path == path
    rows = run.breakdown()
    _same(rows, step_breakdown(open_run(path)))
    assert run.breakdown() is rows  # kept for the reading: asked twice, read once
    assert run.total() == breakdown_total(rows)
    assert [m.rank for m in run.ranks] == [0, 1]
    assert sorted(run.features()) == [0, 1] and run.features()[0]["steps"] == 15
    assert set(run.context()) == {0, 1}
    assert run.skipped == []
    # SQL over the views, as on the connection it owns
    assert run.execute("SELECT count(*) FROM steps").fetchone()[0] == 40
    assert isinstance(run.con, duckdb.DuckDBPyConnection)


def test_a_window_is_the_last_seconds_of_the_runs_steps(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20)
    run = open_run(path)
    end = run.end_ns
    assert end == run.execute("SELECT max(time_ns) FROM steps").fetchone()[0]
    assert run.since_ns(None) is None and run.since_ns(1.0) == int(end - 1.0 * 1e9)  # as diagnose --since counts it
    recent = run.breakdown(window=1e-6)
    _same(recent, step_breakdown(run, since_ns=run.since_ns(1e-6)))
    assert recent != run.breakdown()


def test_a_run_counts_its_steps_and_sums_them_in_stretches(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20)
    run = open_run(path)
    assert run.steps_recorded() == {0: 20, 1: 20} and run.last_step == 19
    whole = run.stretches(1 << 62)  # one stretch per rank, every step kept: the breakdown's sums at no warm-up
    assert [(r["stretch"], r["rank"], r["last_step"]) for r in whole] == [(0, 0, 19), (0, 1, 19)]
    for r, b in zip(whole, run.breakdown(warmup_steps=0)):
        assert r["compute_share"] == pytest.approx(b["compute_share"]) and r["step_time_s"] == b["step_median_s"]
    assert len(run.stretches(5)) == 8 and all(r["gpu_utilization"] is None for r in whole)
    series = run.step_series()
    assert len(series) == 15 and [t for t, _ in series] == sorted(t for t, _ in series)


def test_a_run_over_given_segments_reads_only_those(tmp_path):
    from ranksight.collectors import open_segments, segment_files

    path = write_run(str(tmp_path / "r"), 2, 20, segment="a")
    write_run(path, 2, 20, first_step=20, segment="b")
    files = segment_files(path, "steps")
    run = open_segments(path, {"steps": files[:1], "samples": []})
    assert sum(run.steps_recorded().values()) < sum(open_run(path).steps_recorded().values())
    assert run.refresh(force=True) is False and run.execute("SELECT count(*) FROM samples").fetchone()[0] == 0


def test_refresh_takes_in_new_segments_and_only_then(tmp_path):
    path = str(tmp_path / "live")
    write_run(path, 2, 20, segment="a", status="running")
    run = open_run(path)
    first = run.breakdown()
    assert run.refresh() is False and run.breakdown() is first
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    assert run.refresh() is True
    assert [r["steps"] for r in run.breakdown()] == [35, 35]
    assert run.refresh() is False


def test_one_place_says_where_the_summary_relation_comes_from(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20)
    assert open_run(path).summary().read_from == ("rows",)  # a spool without digests
    ingest(path)  # a finished run's store: its rows and their relation, kept by ingest
    run = open_run(path)
    assert run.summary().read_from == ("store",) and run.summary(window=1.0).read_from == ("rows",)
    _same(run.breakdown(), step_breakdown(run.con))  # a bare connection reads the rows: same figures


def test_diagnose_reads_the_same_figures_as_the_run(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20, data_wait_s=0.05)
    result = diagnose(path)
    _same(result["breakdown"]["ranks"], open_run(path).breakdown())


def test_the_rollup_lives_on_the_run_and_folds_only_new_segments(tmp_path):
    from ranksight.dashboard import _queries as q

    path = str(tmp_path / "live")
    write_run(path, 2, 20, segment="a", status="running")
    run = open_run(path)
    rollup = run.rollup()
    assert run.rollup() is rollup and rollup.run is run
    version = rollup.version
    write_run(path, 2, 20, first_step=20, segment="b", status="running")
    assert run.rollup() is rollup and rollup.version == version + 1
    assert [r["steps"] for r in q.breakdown_per_rank(rollup.cursor())] == [35, 35]
    assert q.rollup_total(rollup.cursor())["rows"] == run.total()["rows"] == 70


def test_diagnose_takes_a_run_and_shares_its_figures(tmp_path):
    path = write_run(str(tmp_path / "r"), 2, 20, data_wait_s=0.05)
    run = open_run(path)
    rows = run.breakdown()
    result = diagnose(run)
    assert result["breakdown"]["ranks"] is rows  # the verdict read the breakdown the Run kept
    assert result["run"] == diagnose(path)["run"]
