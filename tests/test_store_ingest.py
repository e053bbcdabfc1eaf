"""Compaction semantics: incremental, idempotent, never double counting, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ranksight.agent import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import LIVE_FLUSHES, RunDirError, ingest, list_runs, open_run, prune
from ranksight.collectors._rundir import LOCK_NAME
from ranksight.format.schema import arrow_schema


def _writer(run_path: str, rank: int) -> SpoolWriter:
    ident = Identity(job="j", run=os.path.basename(run_path), node="n", rank=rank, local_rank=rank, world_size=2, pid=7)
    return SpoolWriter(run_path, ident)


def _steps(first: int, n: int) -> list[dict]:
    return [
        {"step": s, "time_ns": time.time_ns(), "step_s": 0.01, "data_wait_s": 0.001} for s in range(first, first + n)
    ]


def _meta(run_path: str, rank: int, status: str, silent_s: float = 0.0) -> None:
    heartbeat_ns = time.time_ns() - int(silent_s * 1e9)
    with open(os.path.join(run_path, "ranks", f"rank-{rank:05d}.json"), "w") as f:
        json.dump({"rank": rank, "status": status, "heartbeat_ns": heartbeat_ns, "flush_interval_s": 2.0}, f)


def _count(con, table: str = "steps") -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _view_sql(con, name: str) -> str:
    return con.execute("SELECT sql FROM duckdb_views() WHERE view_name = ?", [name]).fetchone()[0]


def _live_two_ranks(tmp_path) -> tuple[str, SpoolWriter, SpoolWriter]:
    """A running 2-rank run with 10 steps spooled per rank."""
    run = str(tmp_path / "run")
    w0, w1 = _writer(run, 0), _writer(run, 1)
    for rank, w in enumerate((w0, w1)):
        _meta(run, rank, "running")
        w.write("steps", _steps(0, 10))
    return run, w0, w1


def test_live_run_reads_store_plus_new_segments_once(tmp_path):
    run, w0, _ = _live_two_ranks(tmp_path)
    first = ingest(run)
    assert (first.segments, first.rows) == (2, 20)
    old_reader = open_run(run)  # attached to the first store
    w0.write("steps", _steps(10, 5))  # lands after the ingest
    assert _count(old_reader) == 25  # the view re-globs: new segment seen, ingested ones not twice
    assert _count(open_run(run)) == 25
    second = ingest(run)
    assert (second.segments, second.rows) == (1, 5)
    # The store file was replaced by rename: the old reader still pairs its store with its segments.
    assert _count(old_reader) == 25
    con = open_run(run)
    assert _count(con) == 25 and _count(con, "ranksight_store.steps") == 25
    assert con.execute("SELECT count(DISTINCT (rank, step)) FROM steps").fetchone()[0] == 25
    assert ingest(run).rows == 0


def test_finished_and_fully_ingested_run_reads_the_store_alone(tmp_path):
    run = str(tmp_path / "run")
    w = _writer(run, 0)
    _meta(run, 0, "running")
    w.write("steps", _steps(0, 8))
    ingest(run)
    assert "read_parquet" in _view_sql(open_run(run), "steps")  # still live: new segments may come
    _meta(run, 0, "finished")
    con = open_run(run)
    assert "read_parquet" not in _view_sql(con, "steps") and _count(con) == 8
    w.write("steps", _steps(8, 2))  # a late segment after all: it is pending, so it is read again
    assert _count(open_run(run)) == 10


@pytest.mark.parametrize("silent_flushes, live", [(LIVE_FLUSHES - 1, True), (LIVE_FLUSHES + 1, False)])
def test_list_runs_and_open_run_share_one_liveness_rule(tmp_path, silent_flushes, live):
    """A running rank is live until LIVE_FLUSHES flush intervals without a heartbeat: listed as live,
    and a compacted run keeps reading its spool (a segment may still come); then stopped, store alone."""
    run, _, _ = _live_two_ranks(tmp_path)
    ingest(run)
    for rank in (0, 1):
        _meta(run, rank, "running", silent_s=silent_flushes * 2.0)
    assert [r["status"] for r in list_runs(str(tmp_path))] == ["live" if live else "stopped"]
    assert ("read_parquet" in _view_sql(open_run(run), "steps")) == live


def test_young_run_and_reopened_connection(tmp_path):
    run = str(tmp_path / "run")
    _writer(run, 0)  # makes ranks/ only
    con = open_run(run)
    assert _count(con) == 0 and _count(con, "events") == 0
    _writer(run, 0).write("steps", _steps(0, 3))
    assert _count(open_run(run, con)) == 3  # the empty table is replaced by a view on the same connection
    ingest(run)
    assert _count(open_run(run, con)) == 3


def test_segments_from_an_older_agent_without_newer_columns(tmp_path):
    run = str(tmp_path / "run")
    os.makedirs(os.path.join(run, "steps"))
    os.makedirs(os.path.join(run, "ranks"))
    _meta(run, 0, "finished")
    schema = arrow_schema("steps")
    old = pa.schema([f for f in schema if f.name not in ("gpu_compute_s", "gpu_step_s")])
    values = {"job": "j", "run": "run", "node": "n"}
    table = pa.Table.from_pydict(
        {f.name: [values.get(f.name, None if pa.types.is_boolean(f.type) else 1)] * 4 for f in old}, schema=old
    )
    pq.write_table(table, os.path.join(run, "steps", "n_r00000_p1_000000.parquet"))
    assert open_run(run).execute("SELECT count(*), count(gpu_step_s) FROM steps").fetchone() == (4, 0)
    assert ingest(run).rows == 4
    assert open_run(run).execute("SELECT count(*), count(gpu_step_s) FROM steps").fetchone() == (4, 0)


def test_a_second_ingest_at_the_same_time_is_refused(tmp_path):
    import fcntl

    run = str(tmp_path / "run")
    _writer(run, 0).write("steps", _steps(0, 3))
    with open(os.path.join(run, LOCK_NAME), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RunDirError, match="another `ranksight ingest`"):
            ingest(run)
    assert ingest(run).rows == 3


def test_cli_ingest_prints_one_line_and_rejects_bad_paths(tmp_path):
    run = str(tmp_path / "run")
    _writer(run, 0).write("steps", _steps(0, 3))
    ok = subprocess.run([sys.executable, "-m", "ranksight", "ingest", run], capture_output=True, text=True)
    assert ok.returncode == 0 and "+3 rows" in ok.stdout and ok.stdout.count("\n") == 1
    bad = subprocess.run(
        [sys.executable, "-m", "ranksight", "ingest", str(tmp_path)], capture_output=True, text=True
    )  # the run root, not a run (and its only folder has no rank files yet: no run to pick)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and str(tmp_path) in bad.stderr
    assert "no runs under" in bad.stderr or "not a ranksight run directory" in bad.stderr
    corrupt = tmp_path / "corrupt"
    (corrupt / "ranks").mkdir(parents=True)
    (corrupt / "store.duckdb").write_bytes(b"not a database")
    with pytest.raises(RunDirError, match="cannot read the run's store"):
        open_run(str(corrupt))


def _per_kind(con) -> dict:
    return {k: _count(con, k) for k in ("steps", "buckets", "samples")}


def test_prune_deletes_only_what_the_store_holds_and_loses_no_row(tmp_path):
    run, w0, _ = _live_two_ranks(tmp_path)
    w0.write("samples", [{"time_ns": time.time_ns(), "step": 3, "name": "gpu_utilization_ratio", "value": 0.5}])
    with pytest.raises(RunDirError, match="no store to prune against"):
        prune(run)
    ingest(run)
    w0.write("steps", _steps(10, 5))  # after the ingest: not in the store, must stay
    before = _per_kind(open_run(run))
    kept = prune(run)  # default grace: just ingested, nothing goes yet
    assert (kept.files, kept.kept_recent) == (0, 3)
    done = prune(run, older_than_s=0)
    assert done.files == 3 and done.bytes > 0
    left = sorted(os.listdir(os.path.join(run, "steps")))
    assert len(left) == 1 and left[0].endswith("_000001.parquet")  # the un-ingested segment
    assert os.listdir(os.path.join(run, "samples")) == []
    assert _per_kind(open_run(run)) == before == {"steps": 25, "buckets": 0, "samples": 1}
    ingest(run)  # the last one too, then the spool is empty and the store holds everything
    prune(run, older_than_s=0)
    _meta(run, 0, "finished")
    _meta(run, 1, "finished")
    assert _per_kind(open_run(run)) == before


def test_cli_ingest_prune_reports_and_refuses_a_negative_grace(tmp_path):
    run = str(tmp_path / "run")
    _writer(run, 0).write("steps", _steps(0, 3))
    cmd = [sys.executable, "-m", "ranksight", "ingest", run, "--prune", "--prune-after", "0"]
    ok = subprocess.run(cmd, capture_output=True, text=True)
    assert ok.returncode == 0 and "pruned 1 spool segments" in ok.stdout, ok.stdout + ok.stderr
    assert os.listdir(os.path.join(run, "steps")) == []
    bad = subprocess.run(cmd[:-1] + ["-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "ranksight ingest: --prune-after must be >= 0, got -1"
