"""The verdict read from the node spool's digests (``ranksight.format.verdict_digest``): the features ``diagnose()``
judges are those of the rows -- sums, counts, minima, medians and per-step comparisons exact -- and the summary
relation (``collectors._summary``) takes each file's parts from its digest (the medians the rows' where a rank is
in several files); a file whose digest cannot answer has its rows read, and another warm-up reads the rows."""

from __future__ import annotations

import math
import os
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from ranksight.agent._node_spool import publish_node_spool
from ranksight.collectors import _summary, ingest, open_run
from ranksight.format.digest import DIGEST_DIR, chunk_steps_for, digest_paths
from ranksight.format.verdict_digest import MEDIANS
from ranksight.rules import diagnose

from ._golden import run_features
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


def _read_from(run: str, warmup_steps: int = 5) -> tuple[str, ...]:
    """Where a fresh reading's summary relation comes from."""
    con = open_run(run, follow_spool=False)
    try:
        return con.summary(warmup_steps=warmup_steps).read_from
    finally:
        con.close()


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-rows", "gpu-rows"])
def test_the_verdict_features_from_digests_are_the_rows(tmp_path, gpu):
    run = _published_run(tmp_path, gpu=gpu)
    assert _read_from(run) == ("digests",)
    from_digests = run_features(run)
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
    assert _read_from(run) == ("digests",) and _read_from(run, warmup_steps=3) == ("rows",)
    from_digests = run_features(run, warmup_steps=3)
    assert from_digests[0]["steps"] == 117
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    rows = run_features(run, warmup_steps=3)
    os.rename(digests + "-aside", digests)
    _assert_same_features(from_digests, rows)
    assert all(from_digests[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)


def test_a_rank_with_no_more_steps_than_the_warm_up_keeps_them_and_its_medians_are_its_rows(tmp_path):
    run = _published_run(tmp_path, publishes=1)
    _write_steps(str(tmp_path / "local" / "run"), [7], range(3))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert _read_from(run) == ("digests",)
    from_digests = run_features(run)
    assert from_digests[7]["steps"] == 3
    rows = _features_from_rows(run)
    for rank in from_digests:  # read from the rows: exact, medians included
        for k in FROM_MEDIANS:
            assert from_digests[rank][k] == rows[rank][k], (rank, k)


def test_a_damaged_digest_or_a_file_without_a_digest_has_its_rows_read(tmp_path):
    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    paths = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())
    with open(paths[0], "r+b") as f:  # cut short inside its last part (per step)
        f.truncate(os.path.getsize(paths[0]) - 100)
    assert _read_from(run) == ("digests", "rows")
    _assert_same_features(run_features(run), rows)
    os.remove(paths[0])  # a step file without its digest
    assert _read_from(run) == ("digests", "rows")
    again = run_features(run)
    _assert_same_features(again, rows)  # sums to 1e-9: DuckDB's parallel sums add in no fixed order
    assert all(again[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians


def test_a_damaged_medians_part_has_its_files_rows_read(tmp_path):
    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    path = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())[0]
    zero_part(path, "medians")
    assert _read_from(run) == ("digests", "rows")
    features = run_features(run)
    _assert_same_features(features, rows)
    assert all(features[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians


def _drop_summary(run: str) -> None:
    """The store as an older ingest wrote it: without the relation of its rows."""
    con = duckdb.connect(os.path.join(run, "store.duckdb"))
    for table in _summary.SUMMARY_TABLES.values():
        con.execute(f"DROP TABLE IF EXISTS {table}")
    con.close()


def test_a_live_run_compacted_by_ingest_is_judged_from_the_stores_relation_and_the_pending_files(tmp_path):
    """``ingest`` keeps the relation of the rows it holds; a live run's verdict then reads it with the pending
    files' digests, and gets the rows' features."""
    run = _published_run(tmp_path, publishes=2)
    result = ingest(run)
    assert result.rows_by_kind["steps"] == 2 * 40 * len(RANKS)
    con = duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True)
    # the per-step part of every row the store holds: a row per step and warm-up flag
    assert con.execute("SELECT count(*), count(DISTINCT step), sum(n) FROM _summary_steps").fetchall() == [
        (80, 80, result.rows_by_kind["steps"])
    ]
    con.close()
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120))  # a third publish, not ingested yet
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert _read_from(run) == ("store", "digests")
    from_digests = run_features(run)

    # the same run with no digest anywhere and a store without its relation: the rows
    plain = str(tmp_path / "plain")
    shutil.copytree(run, plain)
    shutil.rmtree(os.path.join(plain, "steps", DIGEST_DIR))
    _drop_summary(plain)
    assert _read_from(plain) == ("rows",)
    rows = run_features(plain)
    _assert_same_features(from_digests, rows)
    assert from_digests[3]["slowest_step_share"] == 1.0 and from_digests[0]["steps"] == 115


def test_a_store_without_its_relation_leaves_a_live_verdict_to_the_rows(tmp_path):
    """A store an older ingest wrote holds no relation of its rows: the verdict scans the rows of the store and
    of the pending files, not the pending files' digests alone."""
    run = _published_run(tmp_path, publishes=2)
    ingest(run)
    _drop_summary(run)
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert _read_from(run) == ("rows",)
    features = run_features(run)
    assert features[0]["steps"] == 115 and features[3]["slowest_step_share"] == 1.0


def test_steps_in_the_store_and_pending_files_merge_to_the_rows_figures(tmp_path):
    """The same steps on three nodes: two nodes' files in one ingest, the third's in a second ingest, the next
    steps of all three pending. The store's per-step part merges with the files' as the rows do -- who waited
    least, the second-least wait, the longest compute (a rank of the second node's, so a merge that kept the
    first file's would be wrong)."""
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
    assert _read_from(run) == ("store", "digests")
    from_digests = run_features(run)

    plain = str(tmp_path / "plain")
    shutil.copytree(run, plain)
    shutil.rmtree(os.path.join(plain, "steps", DIGEST_DIR))
    _drop_summary(plain)
    rows = run_features(plain)
    _assert_same_features(from_digests, rows)
    assert sorted(from_digests) == [*range(12), 99]
    assert from_digests[7]["slowest_step_share"] == 1.0


def test_a_reader_after_new_files_gets_the_rows_figures(tmp_path):
    """A live dashboard diagnoses again as files arrive: each reading's relation is that of every file."""
    run = _published_run(tmp_path, publishes=2)
    first = run_features(run)
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120), slow=1)  # another rank slow now
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    merged = run_features(run)
    assert merged != first
    _assert_same_features(merged, _features_from_rows(run))
    assert (merged[1]["slowest_step_share"], merged[3]["slowest_step_share"]) == (40 / 115, 75 / 115)


def test_a_reading_refreshed_again_reads_only_the_new_files_digests(tmp_path, monkeypatch):
    """The live dashboard's reading (``incremental=True``) keeps the digest parts it read, merged: a refresh reads
    the new files' digests alone, and its features are a fresh reading's."""
    run = _published_run(tmp_path, publishes=2)
    reading = open_run(run, follow_spool=False, incremental=True)
    read, original = [], _summary.read_digest_parts

    def recorded(paths, parts, *args, **kwargs):
        read.append(sorted(os.path.basename(p) for p in paths))
        return original(paths, parts, *args, **kwargs)

    monkeypatch.setattr(_summary, "read_digest_parts", recorded)
    try:
        first = reading.features()
        assert read == [_step_files(run)]
        before = set(_step_files(run))
        _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120), slow=1)
        publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
        read.clear()
        assert reading.refresh()
        again = reading.features()
        assert read == [sorted(set(_step_files(run)) - before)]
        assert again != first and reading.summary().read_from == ("digests",)
    finally:
        reading.close()
    monkeypatch.undo()
    _assert_same_features(again, run_features(run))


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
    """``merge_part_sql`` leaves the per-step columns that every file left out out of the merge (NULL), and
    gives what the full merge gives: here two files of one rank each hold no second-least wait of their own,
    yet two files' least waits make one, and neither has CPU-timed or GPU figures."""
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
    absent = frozenset(f.name for f in files.schema if pa.types.is_null(f.type))
    assert {"second", "least_cpu", "cpu_key_rank", "gpu_compute_rank"} <= absent
    assert "cpu_key_rank" in merge_part_sql("steps", "f") and "cpu_key_rank':" not in merge_part_sql(
        "steps", "f", frozenset(absent)
    )
    con = duckdb.connect()
    con.register("files", files)
    order = [("step", "ascending"), ("warm", "ascending")]
    full = con.sql(merge_part_sql("steps", "files")).to_arrow_table().sort_by(order)
    fast = con.sql(merge_part_sql("steps", "files", absent)).to_arrow_table().sort_by(order)
    assert fast.schema == full.schema and fast.equals(full)
    assert fast["second"].null_count == 0  # one rank's least wait is the other's second


def test_readers_on_threads_each_get_the_rows_verdict(tmp_path):
    """The dashboard diagnoses on several threads (its warm-up, each browser session's script) while the spool
    grows: each reader gets the verdict of the files it listed."""
    import threading

    run = _published_run(tmp_path, publishes=2)
    before = _features_from_rows(run)
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
    """A verdict reads every part of each digest file once and, where the files' medians do not serve (every
    rank is in three files here, a node's publishes), all seven medians in one pass over the rows -- also in
    ``diagnose()``, whose breakdown asks for two."""
    run = _published_run(tmp_path)
    files = set(_step_files(run))
    assert len(files) == 3
    reads, passes = [], []
    read, find = _summary.read_digest_parts, _summary._rows_medians

    def recorded(paths, parts, *args, **kwargs):
        reads.append(([os.path.basename(p) for p in paths], parts))
        return read(paths, parts, *args, **kwargs)

    def found(con, since_ns, where):
        passes.append(where)
        return find(con, since_ns, where)

    monkeypatch.setattr(_summary, "read_digest_parts", recorded)
    monkeypatch.setattr(_summary, "_rows_medians", found)
    features = run_features(run)
    assert [(sorted(names), set(parts)) for names, parts in reads] == [(sorted(files), {"sums", "medians", "steps"})]
    assert len(passes) == 1
    reads.clear()
    passes.clear()
    verdict = diagnose(run)
    assert len(reads) == 1 and len(passes) == 1
    monkeypatch.undo()
    _assert_same_features(features, _features_from_rows(run))
    assert _findings(verdict) and _findings(verdict) == _findings(_diagnosed_from_rows(run))
    assert set(MEDIANS) >= {"period", "compute"}


def test_a_damaged_per_step_part_costs_only_its_file(tmp_path):
    """A file's per-step part cut short sends that file's rows to the scan; the other files' digests serve."""
    run = _published_run(tmp_path)
    rows = _features_from_rows(run)
    paths = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())
    with open(paths[0], "r+b") as f:  # cut short inside its last part (per step)
        f.truncate(os.path.getsize(paths[0]) - 100)
    assert _read_from(run) == ("digests", "rows")
    features = run_features(run)
    _assert_same_features(features, rows)
    assert all(features[rank]["step_median_s"] == rows[rank]["step_median_s"] for rank in RANKS)  # exact


def test_digests_that_leave_unsampled_gpu_steps_out_give_the_rows_figures(tmp_path):
    """A GPU rank's steps without CUDA events are in no digest and in no figure of the rows either."""
    import pyarrow.parquet as pq

    from ranksight.agent._node_spool import _write_durably
    from ranksight.format.digest_file import write_digest

    run = _published_run(tmp_path, gpu=True)
    # A GPU rank's steps without CUDA events in one file (``gpu_sampled`` false), published with its digest.
    name = _step_files(run)[0]
    path = os.path.join(run, "steps", name)
    rows = pq.read_table(path)
    sampled = pa.array([s % 4 != 1 for s in rows.column("step").to_pylist()])
    rows = rows.set_column(rows.schema.get_field_index("gpu_sampled"), "gpu_sampled", sampled)
    write_digest(rows, os.path.join(run, "steps"), name, _write_durably)  # as a publisher digests such a file
    pq.write_table(rows, path)
    assert _read_from(run) == ("digests",)
    _assert_same_features(run_features(run), _features_from_rows(run))
