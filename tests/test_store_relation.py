"""The summary relation ``ingest`` keeps in the store is the relation of every step row it holds, whichever parts it
is made of: the store's relation before, the new files' digests, the rows of new files without one; its medians
exact where a rank's rows are in several parts."""

from __future__ import annotations

import math
import os
import shutil

import duckdb
import pytest

from ranksight.agent._node_spool import publish_node_spool
from ranksight.collectors import _summary, ingest
from ranksight.format.digest import DIGEST_DIR, chunk_steps_for, digest_paths

from .test_digests import WORLD, _published_run, _step_files, _write_steps

KEYS = {"sums": ("rank", "warm"), "medians": ("rank", "figure"), "steps": ("step", "warm")}


def _relation(run: str) -> dict[str, dict[tuple, dict]]:
    """{part: {key: row}} of the store's relation."""
    con = duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True)
    try:
        out = {}
        for part, table in _summary.SUMMARY_TABLES.items():
            cur = con.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, row)) for row in cur.fetchall()]
            out[part] = {tuple(r[k] for k in KEYS[part]): r for r in rows}
        return out
    finally:
        con.close()


def _from_rows_alone(run: str, into: str) -> dict:
    """The relation a store made from the rows alone holds: the same segments, no digest, one ingest."""
    shutil.copytree(run, into, ignore=shutil.ignore_patterns("store.duckdb", DIGEST_DIR))
    ingest(into)
    return _relation(into)


def _assert_same(made: dict, rows: dict) -> None:
    for part, by_key in rows.items():
        assert made[part].keys() == by_key.keys(), part
        for key, row in by_key.items():
            for column, want in row.items():
                got = made[part][key][column]
                if isinstance(want, float) and part != "medians":  # sums add in no fixed order
                    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (part, key, column, got, want)
                else:
                    assert got == want, (part, key, column, got, want)


def _drop_relation(run: str) -> None:
    con = duckdb.connect(os.path.join(run, "store.duckdb"))
    for table in _summary.SUMMARY_TABLES.values():
        con.execute(f"DROP TABLE {table}")
    con.close()


@pytest.mark.parametrize("kept", [True, False], ids=["relation-kept", "older-store"])
def test_a_second_ingest_keeps_the_relation_of_every_row(tmp_path, kept):
    """The store's ranks get more rows (their medians then the rows'), a rank arrives in one new file alone (its
    medians the digest's), and a new file has no digest (its rows read); a store without its relation (an older
    ingest's) has it made from all its rows."""
    run = _published_run(tmp_path, publishes=2)
    ingest(run)
    if not kept:
        _drop_relation(run)
    local = str(tmp_path / "local" / "run")
    _write_steps(local, (0, 1, 2, 3), range(80, 120))
    publish_node_spool(local, run, "nodeA")
    held = set(_step_files(run))
    _write_steps(local, (7,), range(0, 40))
    publish_node_spool(local, run, "nodeA")
    digests = digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run))
    newest = max(held, key=lambda name: os.path.getmtime(os.path.join(run, "steps", name)))
    os.remove(digests[newest])  # the third publish's file: its rows are read
    ingest(run)
    made = _relation(run)
    assert {rank for rank, _ in made["medians"]} == {0, 1, 2, 3, 7}
    _assert_same(made, _from_rows_alone(run, str(tmp_path / "rows")))


def test_a_first_ingest_of_digested_files_keeps_the_relation_of_their_rows(tmp_path):
    run = _published_run(tmp_path, publishes=3)
    ingest(run)
    _assert_same(_relation(run), _from_rows_alone(run, str(tmp_path / "rows")))
