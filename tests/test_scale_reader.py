"""open_run(follow_spool=False) over many small segments reads them once at open, into the connection:
the same rows as the views read at each query, once each, beside a store, damaged files left out."""

from __future__ import annotations

import duckdb

from ranksight.agent._identity import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import ingest, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.collectors._spool_reader import MATERIALIZE_FROM_FILES


def _write(run: str, ranks: int, segments_per_rank: int, first: int = 0) -> None:
    for rank in range(ranks):
        w = SpoolWriter(run, Identity("t", "r", "n0", rank, rank, ranks, 100 + rank))
        for seg in range(segments_per_rank):
            s0 = first + seg * 4
            w.write("steps", [{"step": s, "time_ns": s, "step_s": 0.01 * (1 + rank)} for s in range(s0, s0 + 4)])


def _counts(con) -> list[tuple]:
    return con.execute("SELECT rank, count(*), count(DISTINCT step) FROM steps GROUP BY rank ORDER BY rank").fetchall()


def _rounded(rows: list[dict]) -> list[dict]:
    return [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def test_many_pending_segments_read_once_match_the_views(tmp_path):
    run = str(tmp_path / "r")
    _write(run, 4, 80)  # 320 segments: past the threshold
    assert 4 * 80 >= MATERIALIZE_FROM_FILES
    named, following = open_run(run, follow_spool=False), open_run(run)
    assert _counts(named) == _counts(following) == [(r, 320, 320) for r in range(4)]
    assert _rounded(step_breakdown(named)) == _rounded(step_breakdown(following))  # summed in another order
    read = "SELECT count(*) FROM duckdb_tables() WHERE temporary AND starts_with(table_name, '_pending_')"
    assert named.execute(read).fetchone()[0] == 1
    # Opening again on the same connection replaces what it read.
    _write(run, 4, 10, first=320)
    open_run(run, named, follow_spool=False)
    assert _counts(named) == [(r, 360, 360) for r in range(4)]


def test_beside_a_store_and_a_damaged_segment_every_row_once(tmp_path):
    run = str(tmp_path / "r")
    _write(run, 4, 40)
    ingest(run)
    _write(run, 4, 80, first=160)
    with open(f"{run}/steps/n0_r00009_p1-bad_000000.parquet", "wb") as f:
        f.write(b"PAR1 damaged PAR1")
    con = open_run(run, follow_spool=False)
    assert _counts(con) == [(r, 480, 480) for r in range(4)]
    assert [s.path.rsplit("/", 1)[1] for s in con.skipped] == ["n0_r00009_p1-bad_000000.parquet"]


def test_a_connection_the_caller_attached_gets_no_table_of_ours(tmp_path):
    run = str(tmp_path / "r")
    _write(run, 4, 70)
    con = duckdb.connect(str(tmp_path / "mine.duckdb"))
    open_run(run, con, follow_spool=False)
    assert _counts(con) == [(r, 280, 280) for r in range(4)]
    con.close()
    mine = duckdb.connect(str(tmp_path / "mine.duckdb"))
    assert not [t for (t,) in mine.execute("SELECT table_name FROM duckdb_tables()").fetchall() if "pending" in t]


def _view_sql(con) -> str:
    return con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'steps'").fetchone()[0]


def test_files_of_one_schema_are_read_as_one_and_files_of_several_by_their_names(tmp_path):
    """Read with ``union_by_name``, DuckDB binds every file by its names at each query; files of one schema
    are read as one instead, and a file of another schema (an older agent's, a column of another type) sends
    the view back to binding by name: every row once, a column a file lacks NULL in its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = str(tmp_path / "r")
    _write(run, 2, 3)
    con = open_run(run, follow_spool=False)
    assert "union_by_name = false" in _view_sql(con)
    assert _counts(con) == [(0, 12, 12), (1, 12, 12)]
    first = sorted((tmp_path / "r" / "steps").glob("*.parquet"))[0]
    table = pq.read_table(first)
    older = table.drop_columns(["cpu_s"]).set_column(
        table.schema.get_field_index("step"), "step", pa.array(range(100, 100 + table.num_rows), pa.int64())
    )
    pq.write_table(older, tmp_path / "r" / "steps" / "n0_r00000_p1-older_000000.parquet")
    con = open_run(run, follow_spool=False)
    assert "union_by_name = true" in _view_sql(con)
    assert _counts(con) == [(0, 12 + table.num_rows, 12 + table.num_rows), (1, 12, 12)]
    assert con.execute("SELECT count(*) FROM steps WHERE step >= 100 AND cpu_s IS NULL").fetchone()[0] == 4
    (tmp_path / "r" / "steps" / "n0_r00000_p1-older_000000.parquet").unlink()
    narrower = table.set_column(table.schema.get_field_index("step"), "step", table.column("step").cast(pa.int32()))
    pq.write_table(narrower.slice(0, 0), tmp_path / "r" / "steps" / "n0_r00000_p1-narrow_000000.parquet")
    con = open_run(run, follow_spool=False)
    assert "union_by_name = true" in _view_sql(con)
    assert con.execute("SELECT typeof(step) FROM steps LIMIT 1").fetchone()[0] == "BIGINT"
    assert _counts(con) == [(0, 12, 12), (1, 12, 12)]
