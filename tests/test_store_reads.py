"""A store reads as the spool it was ingested from: the same verdict whether a run is read live, half
compacted, compacted, or from the node stores it absorbed.

Every time below is a multiple of 1/1024 s, so sums are exact whatever order DuckDB adds them in, and a
query run twice over the same rows gives the same floats: equality here is exact, not approximate.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from ranksight.agent import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import ingest, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.rules import diagnose

RANKS = 4


def _writer(run_path: str, rank: int) -> SpoolWriter:
    ident = Identity(job="j", run="r", node=f"n{rank // 2}", rank=rank, local_rank=rank % 2, world_size=RANKS, pid=7)
    return SpoolWriter(run_path, ident)


def _steps(rank: int, first: int, n: int) -> list[dict]:
    out = []
    for s in range(first, first + n):
        compute = (40 + (s * 7 + rank * 3) % 11 + (12 if rank == RANKS - 1 else 0)) / 1024
        wait = ((s * 5 + rank) % 4) / 1024
        late = rank == RANKS - 1  # the slow rank arrives last: the others wait for it at the all-reduce
        exposed = ((s % 2) if late else 12 + (s + rank) % 3) / 1024
        blocked = ((s * 3 + rank) % 3 if not late else 0) / 1024
        out.append(
            {
                "step": s,
                "time_ns": 1_700_000_000_000_000_000 + s * 100_000_000,
                "step_s": compute + wait + exposed + blocked + 2 / 1024,
                "data_wait_s": wait,
                "compute_s": compute,
                "comm_exposed_s": exposed,
                "comm_blocked_s": blocked,
                "allreduce_s": exposed * 2,
                "optimizer_s": 1 / 1024,
                "other_s": 1 / 1024,
                "cpu_s": compute + 1 / 1024,
                "collectives": 2,
                "collective_bytes": 4096,
            }
        )
    return out


def _meta(run_path: str, rank: int, status: str) -> None:
    meta = {"rank": rank, "status": status, "heartbeat_ns": time.time_ns(), "flush_interval_s": 2.0}
    meta.update({"world_size": RANKS, "node": f"n{rank // 2}", "host": {"cpu_count": 2, "cpus_allowed": 2}})
    with open(os.path.join(run_path, "ranks", f"rank-{rank:05d}.json"), "w") as f:
        json.dump(meta, f)


def _run(tmp_path, status: str = "finished", steps: int = 60) -> tuple[str, list[SpoolWriter]]:
    run = str(tmp_path / "run")
    writers = [_writer(run, r) for r in range(RANKS)]
    for rank, w in enumerate(writers):
        w.write("steps", _steps(rank, 0, steps // 2))
        w.write("steps", _steps(rank, steps // 2, steps - steps // 2))
        w.write("samples", [{"step": s, "time_ns": 1, "name": "host_load_ratio", "value": 0.5} for s in range(8)])
        _meta(run, rank, status)
    return run, writers


def _spool_only_copy(run: str, tmp_path) -> str:
    """The same rows read from the spool alone (no store)."""
    copy = str(tmp_path / "copy" / "run")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("store.duckdb", ".*"))
    return copy


def test_a_complete_store_reads_the_verdict_exactly_as_its_rows_do(tmp_path):
    run, _ = _run(tmp_path)
    ingest(run)
    assert not [n for n in os.listdir(run) if n.startswith(".answers-")]  # nothing kept beside the store
    con = open_run(run, follow_spool=False)
    copy = _spool_only_copy(run, tmp_path)
    assert step_breakdown(con) == step_breakdown(open_run(copy, follow_spool=False))
    stored, computed = diagnose(run), diagnose(copy)
    assert stored["findings"] and stored == computed and diagnose(run) == stored
    assert diagnose(run, warmup_steps=3) == diagnose(copy, warmup_steps=3)
    assert diagnose(run, since_s=2.0) == diagnose(copy, since_s=2.0)


def test_a_store_and_the_segments_it_has_not_ingested_read_as_the_spool(tmp_path):
    run, writers = _run(tmp_path)
    ingest(run)
    for rank, w in enumerate(writers):  # the ranks resume: 20 more steps each, then finish again
        _meta(run, rank, "running")
        w.write("steps", _steps(rank, 60, 20))
    con = open_run(run, follow_spool=False)
    assert {r["steps"] for r in step_breakdown(con)} == {75}
    copy = _spool_only_copy(run, tmp_path)
    assert diagnose(run) == diagnose(copy)
    ingest(run)  # while a rank may still write
    assert diagnose(run) == diagnose(copy)
    for rank in range(RANKS):
        _meta(run, rank, "finished")
    again = ingest(run)
    assert again.rows == 0
    assert {r["steps"] for r in step_breakdown(open_run(run, follow_spool=False))} == {75}
    assert diagnose(run) == diagnose(copy)


def test_a_store_that_absorbed_its_node_stores_reads_all_their_rows(tmp_path):
    run, _ = _run(tmp_path / "node-a")  # this node's ranks wrote here, on its own disk
    ingest(run)
    head = str(tmp_path / "head" / "run")
    os.makedirs(os.path.join(head, "nodes"))
    shutil.copytree(os.path.join(run, "ranks"), os.path.join(head, "ranks"))
    shutil.copyfile(os.path.join(run, "store.duckdb"), os.path.join(head, "nodes", "node-a.duckdb"))
    ingest(head)
    expected = diagnose(_spool_only_copy(run, tmp_path))
    assert diagnose(head) == expected  # the node store beside the run's
    ingest(head, absorb_node_stores=True)
    assert not os.path.exists(os.path.join(head, "nodes", "node-a.duckdb"))
    assert diagnose(head) == expected
