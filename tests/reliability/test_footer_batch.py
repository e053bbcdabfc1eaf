"""Many segments are judged one per schema (DuckDB reads every file's schema in one pass, one file of each schema
is judged): the verdicts must be exactly those of judging every file alone, damaged and foreign files included."""

from __future__ import annotations

import os
import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ranksight.collectors import _segment_checks, open_run
from ranksight.collectors._segment_checks import scan_segments

from ._damage import DAMAGES, STEPS, first_segment, write_run

COPIES = 70  # a big spool's many files of one schema


@pytest.fixture
def one_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANKSIGHT_DISABLED", raising=False)


def _many_segments(run: str) -> list[str]:
    """Copies of a real segment under other names, as a big spool holds many files of one schema."""
    source = first_segment(run)
    paths = []
    for i in range(COPIES):
        path = os.path.join(run, "steps", f"copy-{i:03d}.parquet")
        shutil.copyfile(source, path)
        paths.append(path)
    return paths


def _alone(run: str) -> tuple[list[str], dict[str, str]]:
    """(readable segments, damaged ones and why) judging each file by itself."""
    folder = os.path.join(run, "steps")
    good, bad = [], {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".parquet") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        problem = _segment_checks._judge(folder, "steps", [name])[name][0]  # one file: a group of its own
        if problem is None:
            good.append(path)
        else:
            bad[path] = problem
    return good, bad


@pytest.mark.parametrize("on_reader", [False, True], ids=["own-connection", "reader-connection"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_many_segments_get_the_verdicts_each_would_get_alone(tmp_path, one_rank, damage, on_reader, monkeypatch):
    """Also when the footers are read on the connection that then reads the files (``open_run``'s, whose
    Parquet metadata cache keeps them): a damaged file is judged as alone there too, and the connection
    still reads the good ones."""
    run = write_run(str(tmp_path))
    _many_segments(run)
    bad = DAMAGES[damage](run)
    footers_parsed = []
    parse = _segment_checks._judge_schema
    monkeypatch.setattr(_segment_checks, "_judge_schema", lambda *a: footers_parsed.append(a) or parse(*a))
    reader = None
    if on_reader:
        reader = duckdb.connect()
        reader.execute("SET parquet_metadata_cache = true")
    good, skipped = scan_segments(run, "steps", con=reader)
    assert len(footers_parsed) <= 2  # one file of each schema, not one per file
    monkeypatch.setattr(_segment_checks, "_judge_schema", parse)
    assert len(good) + len(skipped) > COPIES
    expected_good, expected_bad = _alone(run)
    assert good == expected_good
    assert {s.path: s.reason for s in skipped} == expected_bad
    assert list(expected_bad) == [bad]
    if reader is not None:
        rows = reader.execute("SELECT count(*) FROM read_parquet($good, union_by_name=true)", {"good": good})
        assert rows.fetchone()[0] == sum(pq.read_metadata(p).num_rows for p in good)


def test_a_footer_damaged_inside_among_many_fails_only_its_own_file(tmp_path, one_rank):
    """PAR1 at both ends but a garbled footer: DuckDB's batch read fails, every file is then judged alone."""
    run = write_run(str(tmp_path))
    copies = _many_segments(run)
    with open(copies[7], "rb") as f:
        data = bytearray(f.read())
    footer = int.from_bytes(data[-8:-4], "little")
    data[len(data) - 8 - footer : len(data) - 8] = b"\x07" * footer
    with open(copies[7], "wb") as f:
        f.write(data)
    good, skipped = scan_segments(run, "steps")
    assert [s.path for s in skipped] == [copies[7]] and "not a readable Parquet file" in skipped[0].reason
    assert copies[7] not in good and len(good) == COPIES  # the run's own segment(s) and the other copies
    con = open_run(run)
    per_file = pq.read_table(copies[0]).num_rows
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == STEPS + (COPIES - 1) * per_file


def test_files_of_one_schema_with_nullable_identity_are_judged_each(tmp_path, one_rank):
    """A schema whose identity columns may hold NULL is not enough to judge by: one file of it with a NULL
    rank is left out, the files of the same schema whose ranks are all there are read."""
    run = write_run(str(tmp_path))
    table = pq.read_table(first_segment(run))
    i = table.schema.get_field_index("rank")
    nullable = pa.field("rank", pa.int32(), nullable=True)
    filled = table.set_column(i, nullable, table.column("rank").cast(pa.int32()))
    emptied = table.set_column(i, nullable, pa.array([None] * table.num_rows, pa.int32()))
    folder = os.path.join(run, "steps")
    for k in range(COPIES):
        pq.write_table(filled, os.path.join(folder, f"filled-{k:03d}.parquet"))
    holes = [os.path.join(folder, f"holes-{k}.parquet") for k in range(3)]
    for path in holes:
        pq.write_table(emptied, path)
    good, skipped = scan_segments(run, "steps")
    assert sorted(s.path for s in skipped) == holes
    assert all("rows without their identity" in s.reason for s in skipped)
    assert len(good) == COPIES + 1
