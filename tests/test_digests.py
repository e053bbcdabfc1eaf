"""Step digests: the node spool's publisher sums each published step file per (rank, chunk of steps) and the
dashboard's rollup reads those sums instead of the rows, the verdict's summary relation its verdict parts --
the same figures from the spool, from the store after ``ingest`` and ``prune``, and from the rows whenever a
digest is missing, damaged or of another definition."""

from __future__ import annotations

import json
import logging
import math
import os

import pyarrow as pa
import pytest

from ranksight.agent._identity import Identity
from ranksight.agent._node_spool import (
    BATCHES_DIR,
    _claim,
    _read_segment,
    _write_durably,
    publish_node_spool,
    published_name,
)
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import PHASES, ingest, open_run, prune
from ranksight.collectors._queries import step_breakdown
from ranksight.dashboard import Rollup
from ranksight.format.digest import DIGEST_DIR, chunk_steps_for, digest_key, digest_paths
from ranksight.format.digest_file import write_digest

WORLD = 32  # four of its ranks write here; the chunk is then 2 steps
RANKS = (0, 1, 2, 3)
TOTALS = """SELECT rank, sum(n), sum(step_sum), sum(compute_sum), sum(data_wait_sum), sum(comm_exposed_sum),
                   min(step_min), max(step_max), max(step_max_s), sum(n) FILTER (WHERE warm)
            FROM rollup GROUP BY rank ORDER BY rank"""


def _write_steps(local: str, ranks, steps: range, gpu: bool = False, slow: int | None = 3) -> None:
    """Step rows of ``ranks`` into a node-local spool, as the agents write them (rank ``slow`` computes 1.5x longer);
    ``gpu``: with the GPU stream's columns too, as a CUDA rank's rows carry them (the phases then read those)."""
    for rank in ranks:
        w = SpoolWriter(local, Identity("digest", "run", "nodeA", rank, rank, WORLD, 1000 + rank))
        rows = []
        for s in steps:
            compute = 0.010 * (1.5 if rank == slow else 1.0) * (1 + 0.1 * (s % 7))
            wait, comm, blocked = 0.002 * (s % 3), 0.001 * ((s + rank) % 4), 0.0005 * (s % 2)
            row = {
                "step": s,
                "time_ns": 1_000_000 * s + rank,
                "step_s": wait + compute + comm + blocked + 0.001,
                "data_wait_s": wait,
                "compute_s": compute,
                "comm_exposed_s": comm,
                "allreduce_s": 3 * comm,
                "optimizer_s": 0.001,
                "other_s": 0.0,
                "comm_blocked_s": blocked,
            }
            if gpu:  # the stream idles through half the loader wait; a metric all-reduce blocks it on odd steps
                row.update(
                    gpu_gap_s=wait / 2,
                    gpu_compute_s=compute * 1.05,
                    gpu_comm_exposed_s=comm * 1.2,
                    gpu_optimizer_s=0.0012,
                    gpu_comm_blocked_s=0.0007 * (s % 2),
                    h2d_s=0.0003,
                )
                row["gpu_step_s"] = 0.0003 + compute * 1.05 + comm * 1.2 + 0.0012 + 0.0005  # and 0.5 ms of other
            rows.append(row)
        w.write("steps", rows)
        os.makedirs(os.path.join(local, "ranks"), exist_ok=True)
        meta = {"rank": rank, "status": "finished", "heartbeat_ns": 1, "steps": len(steps), "world_size": WORLD}
        with open(os.path.join(local, "ranks", f"rank-{rank:05d}.json"), "w") as f:
            json.dump(meta, f)


def _published_run(tmp_path, publishes: int = 3, gpu: bool = False) -> str:
    """A run folder filled by ``publishes`` node publishes of 40 steps each."""
    local, run = str(tmp_path / "local" / "run"), str(tmp_path / "runs" / "run")
    os.makedirs(run)
    for i in range(publishes):
        _write_steps(local, RANKS, range(40 * i, 40 * (i + 1)), gpu)
        publish_node_spool(local, run, "nodeA")
    return run


def _step_files(run: str) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(run, "steps")) if not n.startswith("."))


def _totals(rollup: Rollup) -> list[tuple]:
    return rollup.cursor().execute(TOTALS).fetchall()


def _same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b) == len(RANKS)
    for x, y in zip(a, b):
        assert all(u == v if isinstance(u, int) else math.isclose(u, v, rel_tol=1e-12) for u, v in zip(x, y)), (x, y)


def _from_rows(run: str) -> list[tuple]:
    """The rollup's totals with every spool digest set aside (the rows read instead)."""
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    try:
        rollup = Rollup(run)
        assert rollup.digested == 0
        return _totals(rollup)
    finally:
        os.rename(digests + "-aside", digests)


def test_each_published_step_file_has_a_digest_and_the_rollup_reads_it_with_the_same_sums(tmp_path):
    run = _published_run(tmp_path)
    files = _step_files(run)
    assert len(files) == 3
    assert sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), files)) == files
    rollup = Rollup(run)
    assert rollup.chunk_steps == 2 and rollup.digested == 3
    totals = _totals(rollup)
    _same(totals, _from_rows(run))
    # the sums are the rows': 120 steps per rank, 5 of them warm-up; rank 3 the slow one
    assert [t[1] for t in totals] == [120] * 4 and [t[-1] for t in totals] == [5] * 4
    assert max(totals, key=lambda t: t[3])[0] == 3
    # a publish after the first build: the refresh folds its digest only
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(120, 160))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert rollup.refresh() and rollup.digested == 4
    assert [t[1] for t in _totals(rollup)] == [160] * 4
    _same(_totals(rollup), _from_rows(run))


def test_a_pruned_run_reads_the_same_rollup_from_the_store(tmp_path):
    run = _published_run(tmp_path)
    expected = _totals(Rollup(run))
    result = ingest(run)
    assert result.rows_by_kind["steps"] == 4 * 120
    assert prune(run, older_than_s=0).files == 3
    assert _step_files(run) == []
    assert digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), ["x"]) == {}
    assert not os.listdir(os.path.join(run, "steps", DIGEST_DIR, digest_key(chunk_steps_for(WORLD))))
    rollup = Rollup(run)  # the store alone now: its rows
    _same(_totals(rollup), expected)


def test_a_digest_that_does_not_read_costs_speed_not_rows(tmp_path, caplog):
    run = _published_run(tmp_path)
    expected = _from_rows(run)
    first = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())[0]
    with open(first, "wb") as f:
        f.write(b"not parquet")
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        rollup = Rollup(run)
    assert rollup.digested == 0  # the batch of digests is read as rows instead
    assert any("digests" in r.getMessage() and "do not read" in r.getMessage() for r in caplog.records)
    _same(_totals(rollup), expected)
    assert ingest(run).rows_by_kind["steps"] == 4 * 120  # ingest keeps every row
    prune(run, older_than_s=0)
    _same(_totals(Rollup(run)), expected)


def test_a_digest_of_another_definition_is_never_read(tmp_path):
    run = _published_run(tmp_path)
    other = Rollup(run, chunk_steps=5)  # another chunk size: another key, so the rows are read
    assert other.digested == 0
    by_rank = [(t[0], t[1], t[2]) for t in _totals(other)]
    assert [(t[0], t[1]) for t in by_rank] == [(r, 120) for r in RANKS]
    for (_, _, step_sum), expected in zip(by_rank, _totals(Rollup(run))):
        assert math.isclose(step_sum, expected[2], rel_tol=1e-12)


def test_a_publish_that_cannot_write_its_digest_still_publishes_every_row(tmp_path):
    local, run = str(tmp_path / "local" / "run"), str(tmp_path / "runs" / "run")
    os.makedirs(os.path.join(run, "steps"))
    with open(os.path.join(run, "steps", DIGEST_DIR), "w") as f:  # where the digests' folder would go
        f.write("in the way")
    _write_steps(local, RANKS, range(40))
    result = publish_node_spool(local, run, "nodeA")
    assert result.rows == 4 * 40 and len(_step_files(run)) == 1
    rollup = Rollup(run)
    assert rollup.digested == 0 and [t[1] for t in _totals(rollup)] == [40] * 4


def test_a_publisher_killed_between_digest_and_file_publishes_both_once(tmp_path):
    """The digest is written first: a publisher killed before its file leaves a digest no reader reads (no
    file lists it), and the next publish finishes the batch, digest and file, every row once."""
    local, run = str(tmp_path / "local" / "run"), str(tmp_path / "runs" / "run")
    os.makedirs(os.path.join(run, "ranks"))  # as the agents make it at start
    _write_steps(local, RANKS, range(40))
    batch = f"{1:020d}-abcdef"
    batch_dir = os.path.join(local, BATCHES_DIR, batch)
    assert _claim(local, batch_dir)
    claimed = os.path.join(batch_dir, "steps")
    table = pa.concat_tables([_read_segment(os.path.join(claimed, n)) for n in sorted(os.listdir(claimed))])
    name = published_name("nodeA", batch)
    write_digest(table, os.path.join(run, "steps"), name, _write_durably)  # ... and then the publisher died
    assert _step_files(run) == [] and Rollup(run).digested == 0
    publish_node_spool(local, run, "nodeA")
    assert _step_files(run) == [name]
    rollup = Rollup(run)
    assert rollup.digested == 1 and [t[1] for t in _totals(rollup)] == [40] * 4
    _same(_totals(rollup), _from_rows(run))


def still_running(run: str) -> None:
    """A rank that still writes (its heartbeat far ahead), as beside a live job."""
    with open(os.path.join(run, "ranks", "rank-00099.json"), "w") as f:
        json.dump({"rank": 99, "status": "running", "heartbeat_ns": 2**62, "world_size": WORLD}, f)


def zero_part(path: str, part: str) -> None:
    """Zero the bytes of one part of a digest file: its IPC magic gone, that part alone does not read."""
    with open(path, "r+b") as f:
        data = f.read()
        magic = len(b"RSDIGEST")
        size = int.from_bytes(data[magic : magic + 4], "little")
        offset, length = json.loads(data[magic + 4 : magic + 4 + size])[part]
        f.seek(magic + 4 + size + offset)
        f.write(b"\x00" * length)


def _breakdown(run: str) -> tuple[list[dict], tuple[str, ...]]:
    """``step_breakdown`` of the run as ``diagnose`` reads it, and where its summary relation came from."""
    con = open_run(run, follow_spool=False)
    try:
        return step_breakdown(con), con.summary().read_from
    finally:
        con.close()


def _same_breakdown(a: list[dict], b: list[dict]) -> None:
    assert [r["rank"] for r in a] == [r["rank"] for r in b] == list(RANKS)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert math.isclose(x[k], y[k], rel_tol=1e-12), (k, x[k], y[k])
            else:
                assert x[k] == y[k], (k, x[k], y[k])


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-rows", "gpu-rows"])
def test_the_breakdown_takes_its_sums_from_digests_that_cover_every_row_and_equals_the_rows(tmp_path, gpu):
    run = _published_run(tmp_path, gpu=gpu)
    from_digests, used = _breakdown(run)
    assert used == ("digests",)
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    from_rows, used = _breakdown(run)
    os.rename(digests + "-aside", digests)
    assert used == ("rows",)
    _same_breakdown(from_digests, from_rows)
    assert [r["steps"] for r in from_digests] == [115] * 4  # 120 steps less the 5 of warm-up
    assert from_digests[3]["compute_median_s"] > 1.4 * from_digests[0]["compute_median_s"]
    # on the GPU stream's clock where the rows have it: the period is the GPU's, the H2D copy is there
    assert (from_digests[0]["h2d_share"] is not None) == gpu
    for row in from_digests:
        assert math.isclose(sum(row[f"{p[:-2]}_share"] or 0.0 for p in PHASES), 1.0, rel_tol=1e-9)
    # one file without its digest: its rows are scanned, the other files' digests read
    os.remove(sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())[0])
    again, used = _breakdown(run)
    assert used == ("digests", "rows")
    _same_breakdown(again, from_rows)


def test_the_breakdown_of_a_store_and_a_live_spool_reads_the_stores_relation_and_the_digests(tmp_path):
    run = _published_run(tmp_path, publishes=2)
    still_running(run)  # the next publish stays pending beside the store
    ingest(run)
    prune(run, older_than_s=0)
    _write_steps(str(tmp_path / "local" / "run"), RANKS, range(80, 120))
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    assert len(_step_files(run)) == 1  # one file pending, two segments in the store
    mixed, used = _breakdown(run)
    assert used == ("store", "digests")
    fresh = tmp_path / "fresh"
    expected, used = _breakdown(_published_run(fresh))  # the same rows, all three files in the spool
    assert used == ("digests",)
    _same_breakdown(mixed, expected)


def test_a_rank_with_no_more_steps_than_the_warm_up_keeps_them_in_the_breakdown_from_digests(tmp_path):
    run = _published_run(tmp_path, publishes=1)
    _write_steps(str(tmp_path / "local" / "run"), [7], range(3))  # a rank that stopped after 3 steps
    publish_node_spool(str(tmp_path / "local" / "run"), run, "nodeA")
    from_digests, used = _breakdown(run)
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    from_rows, _ = _breakdown(run)
    assert used and [r["rank"] for r in from_digests] == [*RANKS, 7]
    assert from_digests[-1]["steps"] == 3 and from_digests[0]["steps"] == 35
    for x, y in zip(from_digests, from_rows):
        for k in x:
            same = math.isclose(x[k], y[k], rel_tol=1e-12) if isinstance(x[k], float) else x[k] == y[k]
            assert same, (x["rank"], k, x[k], y[k])


def test_a_file_whose_digest_parts_do_not_read_is_read_from_its_rows(tmp_path):
    run = _published_run(tmp_path, publishes=2)
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    from_rows, _ = _breakdown(run)
    os.rename(digests + "-aside", digests)
    path = sorted(digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values())[0]
    zero_part(path, "sums")
    from_parts, used = _breakdown(run)
    assert used == ("digests", "rows")
    _same_breakdown(from_parts, from_rows)


def test_digests_read_at_once_name_the_first_that_does_not_read_in_path_order(tmp_path):
    import shutil

    from ranksight.format.digest_file import DigestError, read_digest_parts

    run = _published_run(tmp_path, publishes=1)
    (source,) = digest_paths(os.path.join(run, "steps"), chunk_steps_for(WORLD), _step_files(run)).values()
    paths = [str(tmp_path / f"d{i:02d}") for i in range(12)]
    for path in paths:
        shutil.copy(source, path)
    whole = read_digest_parts(paths, ("chunks", "steps"))
    one = read_digest_parts(paths[:1], ("chunks", "steps"))
    assert whole["steps"].num_rows == 12 * one["steps"].num_rows  # every file, once
    for bad in (paths[9], paths[4]):
        zero_part(bad, "steps")
    with pytest.raises(DigestError) as caught:
        read_digest_parts(paths, ("chunks", "steps"))
    assert str(caught.value).startswith(paths[4] + ":")
