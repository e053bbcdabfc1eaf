"""The node spool: ranks write to a node-local folder, the node publishes merged files to the run folder.

Real processes and real files throughout: every step reaches the run folder exactly once, also when the
publisher is SIGKILLed at random points again and again, or stops between publishing a batch and
releasing it; readers and ``ingest`` read the published files like any other segment.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import duckdb

from ranksight.agent._node_spool import (
    BATCHES_DIR,
    _claim,
    _publish_kind,
    local_world_size_from_env,
    publish_interval_s,
    publish_node,
    published_name,
)
from ranksight.collectors import ingest, open_run, read_rank_meta
from ranksight.format.digest import chunk_steps_for, digest_paths

AGENT_RANK = """
import json, os, sys, time
import ranksight
run_dir, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
mon = ranksight.init(run_dir=run_dir, job="scale", run_id="nodespool", flush_interval_s=0.1)
steps, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    with mon.step():
        time.sleep(0.003)
    steps += 1
mon.close()
with open(out, "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "steps": steps}, f)
"""


def _env(rank: int, world: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        RANKSIGHT_NODE="nodeA",
        **extra,
    )
    return env


def test_agents_of_one_node_publish_every_step_once_and_few_files(tmp_path):
    """Four real agents with a node spool: all steps arrive once, in merged files, ranks read finished."""
    run_dir, local, world, seconds = tmp_path / "runs", tmp_path / "local", 4, 3.0
    # 8 files per publish (6 kinds, the step file's digest, the rank file), one node, 16 files/s for the job:
    # the node publishes every 0.5 s.
    assert publish_interval_s(0.1, world, world, 16.0) == 0.5
    extra = {"RANKSIGHT_NODE_SPOOL": str(local), "RANKSIGHT_MAX_JOB_FILES_PER_S": "16"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGENT_RANK, str(run_dir), str(seconds), str(tmp_path / f"out{r}.json")],
            env=_env(r, world, **extra),
        )
        for r in range(world)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * world
    expected = {}
    for r in range(world):
        with open(tmp_path / f"out{r}.json") as f:
            out = json.load(f)
        expected[out["rank"]] = out["steps"]
    run = run_dir / "nodespool"
    con = open_run(str(run))
    sql = "SELECT rank, count(*), count(DISTINCT step) FROM steps GROUP BY rank ORDER BY rank"
    counts = con.execute(sql).fetchall()
    assert counts == [(r, expected[r], expected[r]) for r in range(world)]
    assert con.skipped == []
    # Only merged files and the node's rank file reach the run folder; the local spool is drained.
    published = [n for n in os.listdir(run / "steps") if not n.startswith(".")]
    assert published and all("_m" in name for name in published)
    # ... each step file with its digest, which the dashboard's rollup reads instead of the file's rows
    assert sorted(digest_paths(str(run / "steps"), chunk_steps_for(world), published)) == sorted(published)
    assert len(published) <= seconds / 0.5 + 2  # one per interval, and one for the node when its ranks close
    assert os.listdir(run / "ranks") == ["node-nodeA.json"]
    assert not [n for n in os.listdir(local / "nodespool" / "steps") if not n.startswith(".")]
    metas = read_rank_meta(str(run))
    assert [(m.rank, m.status) for m in metas] == [(r, "finished") for r in range(world)]
    assert ingest(str(run)).rows_by_kind["steps"] == sum(expected.values())


WRITER = """
import sys, time
from ranksight.agent._identity import Identity
from ranksight.agent._spool import SpoolWriter
local, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = SpoolWriter(local, Identity("scale", "crash", "nodeA", rank, rank, 2, 1000 + rank))
for start in range(0, steps, 20):
    w.write("steps", [{"step": s, "time_ns": s, "step_s": 0.01} for s in range(start, min(steps, start + 20))])
    w.write("samples", [{"time_ns": start, "step": start, "name": "host_cpu_ratio", "value": 0.5}])
    time.sleep(0.01)
"""

PUBLISHER = """
import sys
from ranksight.agent._node_spool import _node_lock, publish_node
local, run = sys.argv[1], sys.argv[2]
while True:
    with _node_lock(local, wait_s=5.0):
        publish_node(local, run, "nodeA", None)
"""


def _step_rows(run) -> list[tuple[int, int, int]]:
    con = duckdb.connect()
    return con.execute(
        "SELECT rank, count(*), count(DISTINCT step) FROM read_parquet(?) GROUP BY rank ORDER BY rank",
        [str(run / "steps" / "[!.]*.parquet")],
    ).fetchall()


def test_a_rank_killed_mid_run_leaves_nothing_behind_when_its_neighbour_closes(tmp_path):
    """SIGKILL one of two agents: the survivor's last publish (after the dead rank's heartbeat went stale)
    carries every segment either wrote; nothing stays on the node, nothing arrives twice."""
    run_dir, local = tmp_path / "runs", tmp_path / "local"
    extra = {"RANKSIGHT_NODE_SPOOL": str(local), "RANKSIGHT_MAX_JOB_FILES_PER_S": "14"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGENT_RANK, str(run_dir), str(secs), str(tmp_path / f"out{r}.json")],
            env=_env(r, 2, **extra),
        )
        for r, secs in ((0, 3.0), (1, 30.0))
    ]
    time.sleep(2.5)
    procs[1].send_signal(signal.SIGKILL)
    assert procs[0].wait(timeout=60) == 0
    procs[1].wait()
    spool = local / "nodespool"
    left = [n for kind in ("steps", "samples") if (spool / kind).exists() for n in os.listdir(spool / kind)]
    assert not [n for n in left if not n.startswith(".")]
    con = open_run(str(run_dir / "nodespool"))
    sql = "SELECT rank, count(*) = count(DISTINCT step), count(*) > 0 FROM steps GROUP BY rank ORDER BY rank"
    assert con.execute(sql).fetchall() == [(0, True, True), (1, True, True)]
    with open(tmp_path / "out0.json") as f:
        assert con.execute("SELECT count(*) FROM steps WHERE rank = 0").fetchone()[0] == json.load(f)["steps"]
    assert {m.rank: m.status for m in read_rank_meta(str(run_dir / "nodespool"))}[0] == "finished"


def test_a_publisher_killed_again_and_again_loses_and_doubles_nothing(tmp_path):
    """Two writers feed a node spool while a publisher loops and is SIGKILLed at random moments."""
    local, run, steps = tmp_path / "local", tmp_path / "run", 1500
    os.makedirs(run / "ranks")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(local), str(r), str(steps)]) for r in range(2)]
    rng = random.Random(7)
    kills = mid_batch = 0
    while any(w.poll() is None for w in writers) or kills < 3:
        publisher = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(local), str(run)])
        time.sleep(rng.uniform(0.3, 0.8))  # interpreter start-up (~0.2 s), then some publishes
        publisher.send_signal(signal.SIGKILL)
        publisher.wait()
        kills += 1
        mid_batch += bool(os.listdir(local / BATCHES_DIR)) if (local / BATCHES_DIR).exists() else 0
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    # What a SLURM epilog runs after the job: the CLI over publish_node_spool.
    cli = [sys.executable, "-m", "ranksight.cli", "publish", str(local), str(run), "--node", "nodeA"]
    assert "published" in subprocess.run(cli, check=True, capture_output=True, text=True).stdout
    assert _step_rows(run) == [(0, steps, steps), (1, steps, steps)]
    assert not os.listdir(local / BATCHES_DIR)
    assert kills >= 3
    print(f"{kills} kills, {mid_batch} left a batch to finish")


def test_a_batch_published_but_not_released_is_not_published_twice(tmp_path):
    """The exact crash point between publish and release, made by hand: the next publish finishes it."""
    local, run = tmp_path / "local", tmp_path / "run"
    os.makedirs(run / "ranks")
    subprocess.run([sys.executable, "-c", WRITER, str(local), "0", "100"], check=True)
    batch = "00000000000000000001-abcdef"
    batch_dir = local / BATCHES_DIR / batch
    assert _claim(str(local), str(batch_dir))
    names = sorted(os.listdir(batch_dir / "steps"))
    # Published the steps, then died before deleting the claimed files; samples never got published.
    _publish_kind(str(batch_dir / "steps"), names, str(run / "steps"), "nodeA", batch)
    assert os.path.exists(run / "steps" / published_name("nodeA", batch))
    # A temporary file of a write that died midway: readers never see it.
    (run / "steps" / f".tmp-{published_name('nodeA', 'x')}.1.partial").write_bytes(b"PAR1half")
    result = publish_node(str(local), str(run), "nodeA", None)
    assert result.rows == 5  # the samples; the steps were published before
    assert _step_rows(run) == [(0, 100, 100)]
    assert not os.listdir(local / BATCHES_DIR)
    con = open_run(str(run))
    assert con.execute("SELECT count(*), count(DISTINCT step) FROM steps").fetchone() == (100, 100)
    assert con.execute("SELECT count(*) FROM samples").fetchone() == (5,)


def test_a_damaged_local_segment_is_kept_in_quarantine_and_every_other_row_arrives(tmp_path):
    """A file the publisher cannot read (Parquet from an older agent, or Arrow IPC) is copied unread to the
    run's quarantine/<kind>/, where ingest keeps what it cannot read; never deleted, never read as rows."""
    local, run = tmp_path / "local", tmp_path / "run"
    os.makedirs(run / "ranks")
    subprocess.run([sys.executable, "-c", WRITER, str(local), "0", "40"], check=True)
    bad = ["nodeA_r00009_p1-bad_000000.parquet", "nodeA_r00009_p1-bad_000001.arrow"]
    for name in bad:
        (local / "steps" / name).write_bytes(b"PAR1 not really")
    publish_node(str(local), str(run), "nodeA", None)
    assert sorted(os.listdir(run / "quarantine" / "steps")) == bad
    assert (run / "quarantine" / "steps" / bad[1]).read_bytes() == b"PAR1 not really"
    con = open_run(str(run))
    assert con.execute("SELECT count(*), count(DISTINCT step) FROM steps").fetchone() == (40, 40)
    assert con.skipped == []
    result = ingest(str(run))
    assert result.rows_by_kind["steps"] == 40 and result.quarantined == ()
    assert not os.listdir(local / BATCHES_DIR)


def test_the_publish_interval_keeps_the_job_under_its_file_budget(monkeypatch):
    """8 files per publish per node: 1,024 ranks of 8 publish every 6.8 s, 10,000 every 67 s, at 150 files/s."""
    assert publish_interval_s(2.0, 8, 8, 150.0) == 2.0  # one node: as often as the ranks flush
    assert publish_interval_s(2.0, 1024, 8, 150.0) == 8 * 128 / 150
    assert publish_interval_s(2.0, 10_000, 8, 150.0) == 8 * 1250 / 150
    for world in (1024, 10_000, 100_000):
        nodes = -(-world // 8)
        assert nodes * 8 / publish_interval_s(2.0, world, 8, 150.0) <= 150.0 + 1e-9
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8(x2)")
    assert local_world_size_from_env() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_world_size_from_env() == 4


def test_a_node_rank_file_carries_the_publish_interval_into_liveness(tmp_path):
    """Readers judge a rank lost after 30 of its flush intervals without a heartbeat; on a node spool the
    shared heartbeat moves once per publish, so the node's rank file gives the publish interval instead."""
    run = tmp_path / "run"
    os.makedirs(run / "ranks")
    now = time.time_ns()
    ranks = [
        {"rank": 0, "status": "running", "heartbeat_ns": now - int(100e9), "flush_interval_s": 58.3},
        {"rank": 1, "status": "running", "heartbeat_ns": now - int(31 * 58.3e9), "flush_interval_s": 58.3},
        {"rank": 2, "status": "finished", "heartbeat_ns": now - int(1e12), "flush_interval_s": 58.3},
    ]
    (run / "ranks" / "node-nodeA.json").write_text(json.dumps({"node": "nodeA", "ranks": ranks}))
    # An older per-rank file of rank 0 (say, before the node spool was turned on): the newest heartbeat wins.
    (run / "ranks" / "rank-00000.json").write_text(
        json.dumps({"rank": 0, "status": "running", "heartbeat_ns": now - int(1e12), "flush_interval_s": 2.0})
    )
    metas = read_rank_meta(str(run))
    assert [(m.rank, m.status) for m in metas] == [(0, "running"), (1, "lost"), (2, "finished")]
