"""The digest's ``medians`` part and the ``parts-3`` file format: a reader whose every rank is in one node file
takes the per-rank medians each file's publisher found (``ranksight.format.verdict_digest.medians_part``) instead
of the histograms, and gets the very medians the histograms give; a digest of the previous definition or
layout is never misread, and a damaged one costs one warning line and speed, never a row."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pytest

from ranksight.agent._node_spool import publish_node_spool
from ranksight.collectors import _digest_fold, _digest_queries, _digest_source, open_run
from ranksight.collectors._digest_source import verdict_digests
from ranksight.collectors._run import run_features
from ranksight.format.digest import DIGEST_DIR, chunk_steps_for, digest_key, digest_of, digest_paths
from ranksight.format.digest_file import pack_parts, read_digest_parts, read_parts
from ranksight.format.verdict_digest import MEDIANS, merge_steps_sql
from ranksight.rules import diagnose

from .test_digests import RANKS, WORLD, _step_files, _write_steps
from .test_verdict_digests import (
    FROM_MEDIANS,
    _assert_same_features,
    _diagnosed_from_rows,
    _features_from_rows,
    _findings,
)


def _one_node_per_pair(tmp_path, gpu: bool = False) -> str:
    """A run folder of two nodes' files, ranks 0-1 on one and 2-3 on the other: each rank in one file."""
    run = str(tmp_path / "runs" / "run")
    os.makedirs(run)
    for node, ranks in (("nodeA", RANKS[:2]), ("nodeB", RANKS[2:])):
        local = str(tmp_path / "local" / node)
        _write_steps(local, ranks, range(60), gpu)
        publish_node_spool(local, run, node)
    return run


def _digest_files(run: str) -> list[str]:
    return sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())


def _recording(monkeypatch) -> tuple[list, list]:
    """The parts each ``read_digest_parts`` call read, and each pass over the histograms."""
    reads, passes = [], []
    read, find = _digest_fold.read_digest_parts, _digest_queries._all_medians

    def recorded(paths, parts, with_file=False, threads=True):
        reads.append(set(parts))
        return read(paths, parts, with_file, threads)

    def found(con, parts, figures):
        passes.append(figures)
        return find(con, parts, figures)

    monkeypatch.setattr(_digest_fold, "read_digest_parts", recorded)
    monkeypatch.setattr(_digest_queries, "_all_medians", found)
    return reads, passes


def _features_from_histograms(run: str, monkeypatch) -> dict[int, dict]:
    """The features with the files' medians never read: the histograms read instead, as before ``parts-3``."""
    _digest_fold.forget()
    with monkeypatch.context() as m:
        m.setattr(_digest_source, "_file_part", lambda part, noted: part)
        return run_features(run)


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-rows", "gpu-rows"])
def test_each_rank_in_one_file_reads_the_files_medians_and_no_histogram(tmp_path, monkeypatch, gpu):
    run = _one_node_per_pair(tmp_path, gpu)
    reads, passes = _recording(monkeypatch)
    _digest_fold.forget()
    features = run_features(run)
    verdict = diagnose(run)
    monkeypatch.undo()
    assert reads and all("hist" not in parts for parts in reads) and {"medians", "steps"} <= set().union(*reads)
    assert passes == []  # no pass over histogram rows: every median was the files' own
    from_histograms = _features_from_histograms(run, monkeypatch)
    for rank in RANKS:  # the very numbers the histograms give, not within a bound of them
        assert features[rank] == from_histograms[rank]
    figures = set(read_digest_parts(_digest_files(run), ("medians",))["medians"]["figure"].to_pylist())
    assert (list(MEDIANS).index("gpu_compute") + 1 in figures) == gpu  # the GPU's median among them, when timed
    _assert_same_features(features, _features_from_rows(run))
    assert _findings(verdict) and _findings(verdict) == _findings(_diagnosed_from_rows(run))


def test_the_medians_part_holds_each_ranks_median_of_each_figure_after_warm_up(tmp_path):
    run = _one_node_per_pair(tmp_path)
    parts = read_digest_parts(_digest_files(run), ("medians", "sums"))
    medians, sums = parts["medians"], parts["sums"]
    keys = list(zip(medians["rank"].to_pylist(), medians["figure"].to_pylist()))
    assert len(keys) == len(set(keys))  # one row per (rank, figure) of each file, here of the run
    # the figures these rows hold: period, compute, and none of the GPU's (a CPU job), each rank
    names = list(MEDIANS)
    assert {(r, names[f - 1]) for r, f in keys} == {(r, n) for r in RANKS for n in ("period", "compute")}
    assert set(sums["rank"].to_pylist()) == set(RANKS)


def test_a_rank_in_two_files_sends_its_medians_to_the_histograms(tmp_path, monkeypatch):
    run = _one_node_per_pair(tmp_path)
    local = str(tmp_path / "local" / "nodeA")
    _write_steps(local, RANKS[:2], range(60, 90))  # nodeA's ranks publish again: each now in two files
    publish_node_spool(local, run, "nodeA")
    reads, passes = _recording(monkeypatch)
    _digest_fold.forget()
    features = run_features(run)
    monkeypatch.undo()
    assert any("medians" in parts for parts in reads)  # the files' medians first
    assert {"hist"} in reads and [set(f) for f in passes] == [set(MEDIANS)]
    assert features == _features_from_histograms(run, monkeypatch)
    _assert_same_features(features, _features_from_rows(run))


def test_a_digest_of_the_previous_definition_is_never_read(tmp_path):
    """A spool whose digests an older agent wrote (another key: ``parts-2`` had no ``medians`` part) is read from
    its rows: those digests are passed over, never read with this code's meaning."""
    run = _one_node_per_pair(tmp_path)
    folder = os.path.join(run, "steps", DIGEST_DIR)
    (key,) = os.listdir(folder)
    assert key == digest_key(chunk_steps_for(WORLD))
    os.rename(os.path.join(folder, key), os.path.join(folder, f"c{chunk_steps_for(WORLD)}-0123456789ab"))
    con = open_run(run, follow_spool=False)
    assert verdict_digests(con, "hist", "steps") is None
    con.close()
    features = run_features(run)
    rows = _features_from_rows(run)
    assert all(features[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians
    _assert_same_features(features, rows)


def test_a_file_of_the_older_layout_under_this_key_reads_its_histograms(tmp_path, monkeypatch, caplog):
    """A file laid out as ``parts-2`` wrote it (no ``medians`` part) where this definition's files are: its
    medians are not read from a part it lacks, nor guessed -- the histograms give them, one line says so."""
    run = _one_node_per_pair(tmp_path)
    path = _digest_files(run)[0]
    parts = read_parts(path, ("chunks", "sums", "hist", "steps"))
    with open(path, "wb") as f:
        f.write(pack_parts(parts))
    _digest_fold.forget()
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        features = run_features(run)
    lines = [r.getMessage() for r in caplog.records if "do not read" in r.getMessage()]
    assert len(lines) == 1 and path in lines[0] and "no medians part" in lines[0] and "\n" not in lines[0]
    assert features == _features_from_histograms(run, monkeypatch)
    _assert_same_features(features, _features_from_rows(run))


def test_a_damaged_digest_costs_one_warning_line_and_no_row(tmp_path, caplog):
    run = _one_node_per_pair(tmp_path)
    rows, verdict_rows = _features_from_rows(run), _diagnosed_from_rows(run)
    path = _digest_files(run)[1]
    with open(path, "r+b") as f:  # garbage over its header and first parts
        f.write(b"\x00garbage" * 64)
    _digest_fold.forget()
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        verdict = diagnose(run)
    lines = [r.getMessage() for r in caplog.records if "digest" in r.getMessage()]
    assert len(lines) == 1 and path in lines[0] and "\n" not in lines[0]
    assert _findings(verdict) == _findings(verdict_rows)
    features = run_features(run)
    assert all(features[rank][k] == rows[rank][k] for rank in RANKS for k in FROM_MEDIANS)  # the rows' medians
    _assert_same_features(features, rows)


def test_the_per_step_part_merged_batch_by_batch_is_the_merge_of_every_file(tmp_path, monkeypatch):
    """``_read_merging`` merges the per-step part every ``MERGE_BATCH`` files: merged again, the same rows as
    one merge of every file's (sums to 1e-12: added in another order)."""
    import duckdb

    runs = []
    for i in range(5):  # five nodes' files of the same steps, ranks apart
        local = str(tmp_path / "local" / f"n{i}")
        _write_steps(local, [4 * i + r for r in range(4)], range(30), slow=4 * i + 1)
        run = str(tmp_path / "runs" / "run")
        os.makedirs(run, exist_ok=True)
        publish_node_spool(local, run, f"n{i}")
        runs.append(run)
    paths = _digest_files(run)
    assert len(paths) == 5
    con = duckdb.connect()
    whole = read_digest_parts(paths, ("steps",))["steps"]
    con.register("whole", whole)
    expected = con.execute(f"{merge_steps_sql('whole')} ORDER BY step, warm").fetchall()
    monkeypatch.setattr(_digest_fold, "MERGE_BATCH", 2)
    read = _digest_fold._read_merging(con, paths, ("steps", "sums"))
    assert read["sums"].num_rows == sum(t.num_rows for t in [read_digest_parts(paths, ("sums",))["sums"]])
    con.register("batched", read["steps"])
    cur = con.execute(f"{merge_steps_sql('batched')} ORDER BY step, warm")
    names, got = [d[0] for d in cur.description], cur.fetchall()
    assert len(got) == len(expected) == 30
    # who had the longest compute: any of the tied ranks (these ranks tie), as the rows' merge says
    tied = {"compute_rank", "gpu_compute_rank"}
    for a, b in zip(got, expected):
        for name, x, y in zip(names, a, b):
            assert name in tied or x == y or (isinstance(x, float) and abs(x - y) <= 1e-12 * abs(y)), (name, a, b)


def test_digest_of_writes_the_medians_part_beside_the_histograms():
    """The publisher's digest: a ``medians`` row per (rank, figure) with rows after warm-up, the file's parts in
    ``PARTS`` order (the per-step part last)."""
    import numpy as np

    from ranksight.format.digest import PARTS
    from ranksight.format.schema import arrow_schema

    schema = arrow_schema("steps")
    n = 40
    values = {
        "rank": pa.array(np.repeat([0, 1], n // 2), pa.int32()),
        "step": pa.array(np.tile(np.arange(n // 2), 2), pa.int64()),
        "world_size": pa.array([2] * n, pa.int32()),
        "step_s": pa.array(np.linspace(0.01, 0.02, n)),
        "compute_s": pa.array(np.linspace(0.005, 0.01, n)),
    }
    table = pa.table({f.name: values[f.name] if f.name in values else pa.nulls(n, f.type) for f in schema})
    _, parts = digest_of(table)
    assert list(parts) == list(PARTS) and PARTS[-1] == "steps"
    medians = parts["medians"]
    assert medians.num_rows == 4  # two ranks, period and compute
    after = [v for v, s in zip(values["compute_s"].to_pylist()[: n // 2], range(n // 2)) if s >= 5]
    rank0 = {f: m for r, f, m in zip(*(medians[c].to_pylist() for c in ("rank", "figure", "median"))) if r == 0}
    compute = rank0[list(MEDIANS).index("compute") + 1]
    exact = float(np.median(after))
    assert abs(compute - exact) <= 0.005 * exact
