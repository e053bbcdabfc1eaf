"""Many ranks writing, readers and compaction running at once: no error, no lost or doubled row.

Writers are real agents (``ranksight.agent.Monitor``, one process per rank) writing their spool;
readers are ``open_run`` connections, the same as ``ranksight summary`` and the dashboard use; the
compaction is the real ``ranksight ingest`` command in its own process.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from ranksight.collectors import ingest, open_run, read_rank_meta

pytestmark = pytest.mark.slow

RUN_ID = "concurrent"


def writer_main(rank: int, world: int, run_dir: str, duration_s: float, out_dir: str) -> None:
    """One rank: mark steps (with a data loader and a sampler) for ``duration_s``, then close."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), RANKSIGHT_NODE="n0")
    from ranksight.agent import Config, Monitor

    mon = Monitor(Config(run_dir=run_dir, job="store", run_id=RUN_ID, flush_interval_s=0.25))
    mon.add_sampler(
        lambda: [{"time_ns": time.time_ns(), "step": mon.steps_recorded, "name": "idle_ratio", "value": 0.5}]
    )
    deadline = time.monotonic() + duration_s
    for _ in mon.loader(iter(lambda: 1, None)):
        with mon.step():
            time.sleep(0.003)
        if time.monotonic() > deadline:
            break
    mon.close()
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"steps": mon.steps_recorded}, f)


def _start_writers(n: int, run_dir: str, duration_s: float, out_dir: str) -> list:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=writer_main, args=(r, n, run_dir, duration_s, out_dir)) for r in range(n)]
    for p in procs:
        p.start()
    return procs


def _per_rank(con) -> dict:
    rows = con.execute("SELECT rank, count(*), count(DISTINCT step), max(step) FROM steps GROUP BY rank").fetchall()
    return {r[0]: r[1:] for r in rows}


def _ingest_cli(run_path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ranksight", "ingest", run_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_eight_writers_a_reader_and_ingest_for_20_s(tmp_path):
    run_dir, out_dir = str(tmp_path / "runs"), str(tmp_path / "out")
    os.makedirs(out_dir)
    run_path = os.path.join(run_dir, RUN_ID)
    writers = _start_writers(8, run_dir, 20.0, out_dir)
    seen: dict[int, int] = {}
    reads = ingests = 0
    ingester = None
    try:
        while any(p.is_alive() for p in writers):
            if not os.path.isdir(os.path.join(run_path, "ranks")):
                time.sleep(0.1)
                continue
            if ingester is None or ingester.poll() is not None:
                if ingester is not None:
                    assert ingester.returncode == 0, ingester.stderr.read().decode()
                    ingests += 1
                ingester = _ingest_cli(run_path)  # compaction runs back to back, beside the reader
            con = open_run(run_path)
            for rank, (count, distinct, max_step) in _per_rank(con).items():
                assert count == distinct, f"rank {rank}: {count} rows but {distinct} distinct steps (double count)"
                assert count == max_step + 1, f"rank {rank}: steps 0..{max_step} but {count} rows (a gap)"
                assert count >= seen.get(rank, 0), f"rank {rank}: {count} rows after {seen[rank]} (rows lost)"
                seen[rank] = count
            con.close()
            reads += 1
    finally:
        for p in writers:
            p.join(60)
        if ingester is not None:
            ingester.wait(60)
    assert all(p.exitcode == 0 for p in writers)
    assert reads >= 20 and ingests >= 2, (reads, ingests)
    print(f"reader: {reads} consistent reads, {ingests} concurrent ingests")

    written = {}
    for rank in range(8):
        with open(os.path.join(out_dir, f"rank-{rank}.json")) as f:
            written[rank] = json.load(f)["steps"]
    assert min(written.values()) > 100
    # Everything written is read back after close: spool + store, then all compacted.
    assert {r: c[0] for r, c in _per_rank(open_run(run_path)).items()} == written
    samples_before = open_run(run_path).execute("SELECT count(*) FROM samples").fetchone()[0]
    ingest(run_path)  # whatever arrived after the last concurrent ingest
    con = open_run(run_path)
    assert {r: c[0] for r, c in _per_rank(con).items()} == written
    assert con.execute("SELECT count(*) FROM ranksight_store.steps").fetchone()[0] == sum(written.values())
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == samples_before > 0
    assert ingest(run_path).rows == 0  # idempotent


def test_a_killed_rank_keeps_what_it_flushed(tmp_path):
    run_dir, out_dir = str(tmp_path / "runs"), str(tmp_path / "out")
    os.makedirs(out_dir)
    run_path = os.path.join(run_dir, RUN_ID)
    writers = _start_writers(3, run_dir, 6.0, out_dir)
    victim = writers[2]
    meta_path = os.path.join(run_path, "ranks", "rank-00002.json")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until rank 2 has flushed a few times
        metas = {m.rank: m for m in read_rank_meta(run_path)} if os.path.isdir(run_path) else {}
        if 2 in metas and metas[2].data["counters"]["rows_spooled_total"] > 200:
            break
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)
    for p in writers:
        p.join(60)
    assert victim.exitcode == -signal.SIGKILL
    with open(meta_path) as f:
        last_meta = json.load(f)
    assert last_meta["status"] == "running"  # it never closed

    con = open_run(run_path)
    counts = _per_rank(con)
    count, distinct, max_step = counts[2]
    assert count == distinct == max_step + 1  # a whole prefix of its steps, nothing half-read
    rows_back = sum(
        con.execute(f"SELECT count(*) FROM {kind} WHERE rank = 2").fetchone()[0]
        for kind in ("steps", "buckets", "compile", "samples", "events")
    )
    # The metadata is written after that flush's segments: all it counts was flushed and reads back.
    assert rows_back >= last_meta["counters"]["rows_spooled_total"] > 200
    before = {r: c[0] for r, c in counts.items()}
    ingest(run_path)  # compacting a crashed run works and changes nothing that is read
    assert {r: c[0] for r, c in _per_rank(open_run(run_path)).items()} == before
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"rank-{rank}.json")) as f:
            assert before[rank] == json.load(f)["steps"]
