"""The verdict read from the node spool's digests (``ranksight.format.verdict_digest``): the features ``diagnose()``
judges are those of the rows -- sums, counts, minima, medians and per-step comparisons exact -- and no step row is
read for them where each rank's rows are in one file (the medians are the rows' otherwise); where the digests
cannot answer as the rows would, the rows are read."""

from __future__ import annotations

import math
import os
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from ranksight.agent._node_spool import publish_node_spool
from ranksight.collectors import _tables, ingest, open_run
from ranksight.collectors._digest_queries import medians
from ranksight.collectors._digest_source import covering_digests, verdict_digests
from ranksight.collectors._run import run_features
from ranksight.collectors._tables import VERDICT_PART_TABLES
from ranksight.format.digest import DIGEST_DIR, chunk_steps_for, digest_paths
from ranksight.format.verdict_digest import MEDIANS
from ranksight.rules import diagnose

from .test_digests import RANKS, WORLD, _published_run, _step_files, _write_steps, still_running, zero_part

FROM_MEDIANS = ("step_median_s", "compute_median_s", "straggler_score", "compute_vs_median")
"""Features read from medians (exact, from the files' medians or the rows')."""


def _from_rows(read, run: str):
    """``read(run)`` with the spool's digests set aside: the rows read instead."""
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    try:
        return read(run)
    finally:
        os.rename(digests + "-aside", digests)


def _features_from_rows(run: str) -> dict[int, dict]:
    return _from_rows(run_features, run)


def _diagnosed_from_rows(run: str) -> dict:
    return _from_rows(diagnose, run)


def _findings(verdict: dict) -> list[tuple]:
    return [(f["rule"], f["ranks"], f["severity"]) for f in verdict["findings"]]


def _assert_same_features(a: dict[int, dict], b: dict[int, dict]) -> None:
    assert a.keys() == b.keys()
    for rank in a:
        assert a[rank].keys() == b[rank].keys()
        for k, x in a[rank].items():
            y = b[rank][k]
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15), (rank, k, x, y)
            else:
                assert x == y, (rank, k, x, y)


def _features_reading_no_row(run: str, monkeypatch) -> dict[int, dict]:
    """``run_features(run)``, asserting that no feature query read the step rows (the row queries keep their
    rows in a ``kept`` CTE), but for the medians of ranks whose rows are in several files
    (``_digest_queries._rows_medians``)."""
    sql_run = []
    original = _tables.query

    def recorded(con, sql, params=()):
        sql_run.append(sql)
        return original(con, sql, params)

    for module in ("ranksight.collectors._queries", "ranksight.collectors._features"):
        monkeypatch.setattr(f"{module}.query", recorded)
    features = run_features(run)
    monkeypatch.undo()
    assert sql_run and not [sql for sql in sql_run if "kept AS (SELECT" in sql]
    return features


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-rows", "gpu-rows"])
def test_the_verdict_features_from_digests_are_the_rows_and_read_no_row(tmp_path, gpu, monkeypatch):
    run = _published_run(tmp_path, gpu=gpu)
    from_digests = _features_reading_no_row(run, monkeypatch)
    _assert_same_features(from_digests, _features_from_rows(run))
    f = from_digests[3]  # the slow rank: named from the per-step comparison across ranks
    assert f["slowest_step_share"] == 1.0 and f["compute_vs_median"] > 1.3
    assert f["straggler_cost_share"] is not None and f["comm_floor_share"] is not None
    # and the verdict itself is the same
    verdict = _findings(diagnose(run))
    assert verdict and verdict == _findings(_diagnosed_from_rows(run))


def test_another_warm_up_than_the_digests_reads_the_rows(tmp_path):
    """The digests keep the default warm-up's first steps apart; a verdict with another warm-up reads rows."""
    run = _published_run(tmp_path)
    con = open_run(run, follow_spool=False)
    parts = verdict_digests(con, "medians", "steps")
    assert parts is not None and medians(con, parts, 3) is None
    con.close()
    from_digests = run_features(run, warmup_steps=3)
    assert from_digests[0]["steps"] == 117
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    rows = run_features(run, warmup_steps=3)
    os.rename(digests + "-aside", digests)
    _assert_same_features(from_digests, rows)
    assert all(from_digests[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)


def test_a_rank_with_no_more_steps_than_the_warm_up_sends_the_verdict_to_the_rows(tmp_path):
    run = _published_run(tmp_path, publishes=1)
    _write_steps(str(tmp_path / "local" / "run"), [7], range(3))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    con = open_run(run, follow_spool=False)
    parts = verdict_digests(con, "medians")
    assert parts is not None and medians(con, parts, 5) is None
    con.close()
    from_digests = run_features(run)
    assert from_digests[7]["steps"] == 3
    rows = _features_from_rows(run)
    for rank in from_digests:  # read from the rows: exact, medians included
        for k in FROM_MEDIANS:
            assert from_digests[rank][k] == rows[rank][k], (rank, k)


def _parts_that_serve(run: str, *wanted: str) -> bool:
    con = open_run(run, follow_spool=False)
    try:
        return verdict_digests(con, *wanted) is not None
    finally:
        con.close()


def test_a_damaged_digest_part_or_a_file_without_a_digest_leaves_those_figures_to_the_rows(tmp_path):
    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    paths = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())
    with open(paths[0], "r+b") as f:  # cut short inside its last part (per step): the parts before it read
        f.truncate(os.path.getsize(paths[0]) - 100)
    assert _parts_that_serve(run, "medians") and not _parts_that_serve(run, "medians", "steps")
    _assert_same_features(run_features(run), rows)
    os.remove(paths[0])  # a step file without its digest: no part stands for every row
    assert not _parts_that_serve(run, "medians")
    again = run_features(run)
    _assert_same_features(again, rows)  # sums to 1e-9: DuckDB's parallel sums add in no fixed order
    assert all(again[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians


def test_a_damaged_medians_part_leaves_the_medians_to_the_rows_and_the_sums_to_the_digests(tmp_path):
    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    path = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())[0]
    zero_part(path, "medians")
    con = open_run(run, follow_spool=False)
    assert covering_digests(con) is not None  # the rollup's part still reads
    assert verdict_digests(con, "medians") is None
    con.close()
    features = run_features(run)
    _assert_same_features(features, rows)
    assert all(features[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians


def _drop_verdict_parts(run: str) -> None:
    """The store as an ingest before its verdict parts were kept wrote it (its rollup part stays)."""
    con = duckdb.connect(os.path.join(run, "store.duckdb"))
    for table in VERDICT_PART_TABLES.values():
        con.execute(f"DROP TABLE IF EXISTS {table}")
    con.close()


def test_a_live_run_compacted_by_ingest_is_judged_from_the_stores_digest_parts_and_the_pending_files(
    tmp_path, monkeypatch
):
    """``ingest`` keeps the verdict's parts of the segments it compacts; a live run's verdict then reads them
    with the pending files' digests, and gets the rows' features."""
    run = _published_run(tmp_path, publishes=2)
    result = ingest(run)
    assert result.rows_by_kind["steps"] == 2 * 40 * len(RANKS)
    con = duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True)
    for part in ("sums", "medians"):  # every ingested segment's part, under its definition
        table = VERDICT_PART_TABLES[part]
        segments = con.execute(f"SELECT count(DISTINCT _segment), count(DISTINCT key) FROM {table}").fetchall()
        assert segments == [(2, 1)], (part, segments)
    # the per-step part merged over the batch: a row per step, not per step and file
    merged = "SELECT count(*), count(DISTINCT step), count(_segment), count(DISTINCT key) FROM _digest_steps"
    assert con.execute(merged).fetchall() == [(80, 80, 0, 1)]
    assert con.execute("SELECT sum(n) FROM _digest_steps").fetchall()[0][0] == result.rows_by_kind["steps"]
    con.close()
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120))  # a third publish, not ingested yet
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")

    con = open_run(run, follow_spool=False)
    assert verdict_digests(con, "medians", "steps") is not None
    con.close()
    from_digests = _features_reading_no_row(run, monkeypatch)

    # the same run with no digest anywhere: the rows
    plain = str(tmp_path / "plain")
    shutil.copytree(run, plain)
    shutil.rmtree(os.path.join(plain, "steps", DIGEST_DIR))
    _drop_verdict_parts(plain)
    assert not _parts_that_serve(plain, "medians")
    rows = run_features(plain)
    _assert_same_features(from_digests, rows)
    assert from_digests[3]["slowest_step_share"] == 1.0 and from_digests[0]["steps"] == 115


def test_a_store_without_the_verdict_parts_leaves_a_live_verdict_to_the_rows(tmp_path):
    """A store an older ingest wrote holds the rollup's part alone: the verdict reads the rows, not a part
    that stands for the pending files only."""
    run = _published_run(tmp_path, publishes=2)
    ingest(run)
    _drop_verdict_parts(run)
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert not _parts_that_serve(run, "medians")
    con = open_run(run, follow_spool=False)
    assert covering_digests(con) is not None  # the rollup's part still stands for every row
    con.close()
    features = run_features(run)
    assert features[0]["steps"] == 115 and features[3]["slowest_step_share"] == 1.0


def test_a_store_kept_by_an_older_digest_definition_takes_the_newer_parts_columns(tmp_path, caplog):
    """A store outlives an upgrade: the parts of a newer definition, with columns the store's tables lack, are
    kept beside the older key's rows, which read the new columns as NULL."""
    run = _published_run(tmp_path, publishes=1)
    still_running(run)
    ingest(run)
    con = duckdb.connect(os.path.join(run, "store.duckdb"))
    key, older = con.execute("SELECT any_value(key), count(*) FROM _digest_sums").fetchone()
    for table in VERDICT_PART_TABLES.values():  # as an older definition wrote them: another key, a column fewer
        con.execute(f"UPDATE {table} SET key = 'c2-000000000000'")
    con.execute("ALTER TABLE _digest_sums DROP COLUMN data_wait_host_sum")
    con.execute("DELETE FROM _digests")  # and the rollup's part of those segments, under the older key too
    con.close()
    local = str(tmp_path / "local" / "run")
    for steps in (range(40, 80), range(80, 120)):
        _write_steps(local, RANKS, steps)
        publish_node_spool(local, run, "nodeA")
    with caplog.at_level("WARNING", logger="ranksight"):
        ingest(run)
    assert "not kept" not in caplog.text
    con = duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True)
    kept = con.execute("SELECT key, count(*), count(data_wait_host_sum) FROM _digest_sums GROUP BY key ORDER BY key")
    assert kept.fetchall() == [("c2-000000000000", older, 0), (key, 2 * len(RANKS), 2 * len(RANKS))]
    con.close()


def test_steps_merged_by_separate_ingests_and_pending_files_merge_again_to_the_rows_figures(tmp_path, monkeypatch):
    """The same steps on three nodes: two nodes' files merged in one ingest, the third's in a second ingest, the
    next steps of all three pending. The per-step part's merged rows (the store's) merge with each other and
    with files' as the rows do -- who waited least, the second-least wait, the longest compute (a rank of the
    second node's, so a merge that kept the first file's would be wrong)."""
    run = str(tmp_path / "runs" / "run")
    os.makedirs(run)
    nodes = {"nodeA": ((0, 1, 2, 3), None), "nodeB": ((4, 5, 6, 7), 7), "nodeC": ((8, 9, 10, 11), None)}

    def publish(node: str, steps: range) -> None:
        local = str(tmp_path / node / "run")
        ranks, slow = nodes[node]
        _write_steps(local, ranks, steps, slow=slow)
        publish_node_spool(local, run, node)

    publish("nodeA", range(0, 40))
    publish("nodeB", range(0, 40))
    still_running(run)
    ingest(run)
    publish("nodeC", range(0, 40))
    ingest(run)
    for node in nodes:
        publish(node, range(40, 80))
    con = duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT step) FROM _digest_steps").fetchall() == [(80, 40)]
    con.close()
    assert _parts_that_serve(run, "medians", "steps")
    from_digests = _features_reading_no_row(run, monkeypatch)

    plain = str(tmp_path / "plain")
    shutil.copytree(run, plain)
    shutil.rmtree(os.path.join(plain, "steps", DIGEST_DIR))
    _drop_verdict_parts(plain)
    rows = run_features(plain)
    _assert_same_features(from_digests, rows)
    assert sorted(from_digests) == [*range(12), 99]
    assert from_digests[7]["slowest_step_share"] == 1.0


def test_a_reader_after_new_files_merges_only_those_into_what_it_kept_and_gets_the_rows_figures(tmp_path, monkeypatch):
    """A live dashboard diagnoses again as files arrive: the parts it kept merged (``_digest_fold``) take in
    the new files' rows alone, and the figures are those of the rows, and of a build from every file."""
    from ranksight.collectors import _digest_fold

    run = _published_run(tmp_path, publishes=2)
    first = run_features(run)
    before = set(_step_files(run))
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120), slow=1)  # another rank slow now
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    added = set(_step_files(run)) - before
    assert added
    read = []
    original = _digest_fold.read_digest_parts

    def recorded(paths, parts, with_file=False):
        read.append(({os.path.basename(p) for p in paths}, parts))
        return original(paths, parts, with_file)

    monkeypatch.setattr(_digest_fold, "read_digest_parts", recorded)
    merged = _features_reading_no_row(run, monkeypatch)
    assert read and all(names == added for names, _ in read)  # the kept parts took in the new file alone
    # every part of the new file at once; a rank in several files takes its medians from the rows
    assert {p for _, parts in read for p in parts} == {"sums", "medians", "steps"}
    assert merged != first
    _assert_same_features(merged, _features_from_rows(run))
    _digest_fold.forget()
    _assert_same_features(merged, run_features(run))  # a build from every file
    assert (merged[1]["slowest_step_share"], merged[3]["slowest_step_share"]) == (40 / 115, 75 / 115)


def test_a_kept_merge_is_not_taken_once_a_file_it_read_is_gone_or_changed(tmp_path):
    from ranksight.collectors import _digest_fold

    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    _digest_fold.forget()
    _assert_same_features(run_features(run), rows)
    paths = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())
    assert {os.path.dirname(paths[0])} == {folder for folder, _ in _digest_fold._folds}
    zero_part(paths[0], "steps")  # changed in place: its steps part no longer reads (the kept one would)
    assert not _parts_that_serve(run, "medians", "steps")
    _assert_same_features(run_features(run), rows)
    os.remove(paths[0])  # gone, its step file kept: the kept sums would still add up to the rows
    assert not _parts_that_serve(run, "medians")
    _assert_same_features(run_features(run), rows)


def _step_grid(steps: int, ranks: int):
    """(step, rank, columns) of every rank's row at every step, four ranks to a node: the key columns of a
    synthetic step table."""
    step, rank = np.repeat(np.arange(steps), ranks), np.tile(np.arange(ranks), steps)
    return step, rank, {"step": step, "rank": rank.astype(np.int32), "node": [f"node{r // 4}" for r in rank]}


def test_every_verdict_part_of_several_files_merged_is_the_part_of_all_their_rows():
    """``merge_part_sql``: the parts of files cut by node and by time merge into the parts of the rows read as
    one file -- minima, maxima and who holds them exact; sums to rounding. One file holds a single rank (no
    second-least wait of its own) and only the first node's ranks are CPU-timed (the other files have no
    least CPU wait to offer)."""
    from ranksight.format.digest import digest_of
    from ranksight.format.digest_file import concat_part
    from ranksight.format.verdict_digest import merge_part_sql

    rng = np.random.default_rng(7)
    step, rank, grid = _step_grid(30, 8)
    n = len(step)
    table = pa.table(
        {
            **grid,
            "world_size": np.where(step < 20, 8, 12),  # grown mid-run: the merge keeps the largest
            "step_s": rng.uniform(0.02, 0.05, n),
            "data_wait_s": rng.uniform(0, 0.01, n),
            "compute_s": rng.uniform(0.01, 0.03, n),
            "comm_exposed_s": rng.uniform(0, 0.004, n),
            "allreduce_s": rng.uniform(0, 0.01, n),
            "optimizer_s": rng.uniform(0, 0.002, n),
            "other_s": np.zeros(n),
            "comm_blocked_s": rng.uniform(0, 0.003, n),
            "buckets": rng.integers(1, 4, n),
            "bucket_bytes": rng.integers(1, 3, n) * 1024,
            "cpu_s": pa.array(np.where(rank < 4, rng.uniform(0.01, 0.03, n), np.nan), mask=rank >= 4),
        }
    )
    group = np.where(rank < 4, 0, np.where(rank < 7, 1, 2))  # the last "node" is rank 7 alone
    files = [table.filter((group == node) & ((step >= 12) == later)) for node in (0, 1, 2) for later in (False, True)]
    whole = digest_of(table)[1]
    keys = {"sums": ["rank", "warm"], "steps": ["step", "warm"]}
    con = duckdb.connect()
    steps_parts = [digest_of(f)[1]["steps"] for f in files]
    # A column NULL on every row of a file is left out of it: the GPU figures everywhere, the CPU-timed
    # ones in the files of ranks 4-7.
    assert not any("gpu_compute_max" in p.column_names for p in steps_parts)
    assert ["least_cpu" in p.column_names for p in steps_parts] == [True, True, False, False, False, False]
    for part, key in keys.items():
        con.register("files", concat_part(part, [digest_of(f)[1][part] for f in files]))  # as readers take them
        merged = con.sql(merge_part_sql(part, "files")).df().sort_values(key).reset_index(drop=True)
        expected = concat_part(part, [whole[part]]).to_pandas().sort_values(key).reset_index(drop=True)
        assert len(merged) == len(expected) and set(merged.columns) == set(expected.columns), part
        for column in expected.columns:
            a, b = merged[column].to_numpy(), expected[column].to_numpy()
            if expected[column].isna().all():  # no file, nor all the rows, has this figure (a GPU one here)
                assert merged[column].isna().all(), (part, column)
            elif a.dtype.kind == "f":
                assert np.allclose(a, b, rtol=1e-12, equal_nan=True), (part, column)
            else:
                assert (a == b).all(), (part, column)


def test_a_merge_leaves_what_no_file_holds_null_unmerged_and_merges_the_rest_as_in_full():
    """``_digest_fold._merged`` leaves the per-step columns that every file left out out of the merge (NULL),
    and gives what the full merge gives: here two files of one rank each hold no second-least wait of their
    own, yet two files' least waits make one, and neither has CPU-timed or GPU figures."""
    from ranksight.collectors._digest_fold import _merged, null_columns
    from ranksight.format.digest import digest_of
    from ranksight.format.digest_file import concat_part
    from ranksight.format.verdict_digest import merge_part_sql

    rng = np.random.default_rng(11)
    step, rank, grid = _step_grid(30, 8)
    n = len(step)
    table = pa.table(
        {
            **grid,
            "world_size": np.full(n, 8),
            "step_s": rng.uniform(0.02, 0.05, n),
            "compute_s": rng.uniform(0.01, 0.03, n),
            "comm_exposed_s": rng.uniform(0, 0.004, n),
            "allreduce_s": rng.uniform(0, 0.01, n),
        }
    )
    parts = [digest_of(table.filter(rank == r))[1]["steps"] for r in (6, 7)]
    assert not any("second" in p.column_names or "least_cpu" in p.column_names for p in parts)
    files = concat_part("steps", parts)
    absent = null_columns(files)
    assert {"second", "least_cpu", "cpu_key_rank", "gpu_compute_rank"} <= absent
    assert "cpu_key_rank" in merge_part_sql("steps", "f") and "cpu_key_rank':" not in merge_part_sql(
        "steps", "f", frozenset(absent)
    )
    con = duckdb.connect()
    con.register("files", files)
    order = [("step", "ascending"), ("warm", "ascending")]
    full = con.sql(merge_part_sql("steps", "files")).to_arrow_table().sort_by(order)
    fast = _merged(con, "steps", files).sort_by(order)
    assert fast.schema == full.schema and fast.equals(full)
    assert fast["second"].null_count == 0  # one rank's least wait is the other's second


def test_readers_on_threads_share_the_kept_merge_and_each_gets_the_rows_verdict(tmp_path):
    """The dashboard diagnoses on several threads (its warm-up, each browser session's script) while the spool
    grows: readers that meet in ``_digest_fold`` at once each get the verdict of the files they listed."""
    import threading

    from ranksight.collectors import _digest_fold

    run = _published_run(tmp_path, publishes=2)
    before = _features_from_rows(run)
    _digest_fold.forget()
    results: dict[int, dict] = {}
    errors = []

    def judge(i: int) -> None:
        try:
            results[i] = run_features(run)
        except Exception as exc:  # noqa: BLE001 -- reported below, with the thread's own error
            errors.append(exc)

    threads = [threading.Thread(target=judge, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120), slow=1)
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")  # while they read, or after
    threads += [threading.Thread(target=judge, args=(i,)) for i in range(4, 8)]
    for t in threads[4:]:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8
    rows = _features_from_rows(run)
    for i in range(4):  # started before the publish: the files they listed, before or after it
        _assert_same_features(results[i], before if results[i][0]["steps"] == before[0]["steps"] else rows)
    for i in range(4, 8):  # started after the publish: every file
        _assert_same_features(results[i], rows)
    assert results[7][1]["slowest_step_share"] == 40 / 115


def test_the_features_read_each_digest_file_once_and_every_median_in_one_pass(tmp_path, monkeypatch):
    """``compute_features`` reads every part the features read at once: one read of the three parts, each file
    once, and one pass over the rows for all seven medians -- also in ``diagnose()``, whose breakdown asks
    for two. Here every rank is in three files (a node's publishes), so the files' own medians do not serve
    and the rows' are read."""
    from ranksight.collectors import _digest_fold, _digest_queries

    run = _published_run(tmp_path)
    files = set(_step_files(run))
    assert len(files) == 3
    reads, passes = [], []
    read, find = _digest_fold.read_digest_parts, _digest_queries._rows_medians

    def recorded(paths, parts, with_file=False):
        reads.append(([os.path.basename(p) for p in paths], parts))
        return read(paths, parts, with_file)

    def found(con, warmup_steps, figures):
        passes.append(figures)
        return find(con, warmup_steps, figures)

    monkeypatch.setattr(_digest_fold, "read_digest_parts", recorded)
    monkeypatch.setattr(_digest_queries, "_rows_medians", found)
    _digest_fold.forget()
    features = run_features(run)
    assert [(sorted(names), set(parts)) for names, parts in reads] == [(sorted(files), {"sums", "medians", "steps"})]
    assert [set(figures) for figures in passes] == [set(MEDIANS)]
    _digest_fold.forget()
    reads.clear()
    passes.clear()
    verdict = diagnose(run)
    assert {p for _, parts in reads for p in parts} == {"sums", "medians", "steps"}
    assert [set(figures) for figures in passes] == [set(MEDIANS)]
    monkeypatch.undo()
    _assert_same_features(features, _features_from_rows(run))
    assert _findings(verdict) and _findings(verdict) == _findings(_diagnosed_from_rows(run))


def test_a_damaged_per_step_part_leaves_only_its_figures_to_the_rows(tmp_path):
    """Reading every part at once (as every reading does) must not cost the parts that read: a file's per-step
    part cut short sends the per-step comparisons to the rows, and the sums and medians still come from the
    digests."""
    from ranksight.collectors import _digest_fold

    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    paths = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())
    with open(paths[0], "r+b") as f:  # cut short inside its last part (per step)
        f.truncate(os.path.getsize(paths[0]) - 100)
    _digest_fold.forget()
    con = open_run(run, follow_spool=False)
    assert verdict_digests(con, "medians") is not None and verdict_digests(con, "steps") is None
    con.close()
    features = run_features(run)
    _assert_same_features(features, rows)
    assert all(features[rank]["step_median_s"] == rows[rank]["step_median_s"] for rank in RANKS)  # exact


def test_digests_that_leave_unsampled_gpu_steps_out_serve_once_the_rows_are_counted(tmp_path, monkeypatch):
    """The view's rows are first counted from its files' footers; where they are more than the digests fold
    (a GPU rank's steps without CUDA events, which no digest folds), the rows that digests fold are counted
    instead, and the digests still serve when those are every one."""
    from ranksight.collectors import _digest_source

    run = _published_run(tmp_path, gpu=True)
    counted = []
    original = _digest_source._step_rows

    def counting(con):  # the rows counted by a scan of the view, not the count kept from before
        counted.append(_digest_source._noted(con).rows is None)
        return original(con)

    monkeypatch.setattr(_digest_source, "_step_rows", counting)
    assert _parts_that_serve(run, "medians", "steps") and not any(counted)  # the footers' count was enough
    import pyarrow.parquet as pq

    from ranksight.agent._node_spool import _write_durably
    from ranksight.format.digest_file import write_digest

    # A GPU rank's steps without CUDA events in one file (``gpu_sampled`` false), published with its digest.
    name = _step_files(run)[0]
    path = os.path.join(run, "steps", name)
    rows = pq.read_table(path)
    sampled = pa.array([s % 4 != 1 for s in rows.column("step").to_pylist()])
    rows = rows.set_column(rows.schema.get_field_index("gpu_sampled"), "gpu_sampled", sampled)
    write_digest(rows, os.path.join(run, "steps"), name, _write_durably)  # as a publisher digests such a file
    pq.write_table(rows, path)
    assert _parts_that_serve(run, "medians", "steps") and any(counted)
    _assert_same_features(run_features(run), _features_from_rows(run))
