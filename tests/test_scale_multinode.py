"""Nodes without a shared filesystem: each node ingests its own run folder, its store is copied into the
run's ``nodes/`` folder on one machine, and ``open_run`` reads them together -- every row once.

Real agents, the real CLI, real DuckDB files: the recipe of docs/scale.md as a user runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ranksight.collectors import StoreError, ingest, open_run, read_rank_meta
from ranksight.collectors._queries import step_breakdown

RANK = """
import json, os, sys, time
import ranksight
run_dir, out = sys.argv[1], sys.argv[2]
mon = ranksight.init(run_dir=run_dir, job="multi", run_id="multi", flush_interval_s=0.1)
steps = 0
for _ in range(60):
    with mon.step():
        time.sleep(0.002)
    steps += 1
mon.close()
with open(out, "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "steps": steps}, f)
"""


def _run_node(tmp_path, node: str, ranks: list[int], world: int) -> str:
    """Run the node's ranks with a run folder on the node's own disk; return that run folder."""
    run_dir = tmp_path / node / "runs"
    procs = []
    for local, rank in enumerate(ranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), RANKSIGHT_NODE=node)
        out = str(tmp_path / f"out{rank}.json")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(run_dir), out], env=env))
    assert [p.wait(timeout=60) for p in procs] == [0] * len(procs)
    return str(run_dir / "multi")


def _ship(node_run: str, head_run: str, node: str) -> None:
    """What a node's epilog does after `ranksight ingest`: copy the store under a dot-name, rename it into
    nodes/, and copy the rank files (scp, kubectl cp or an object store in a real cluster)."""
    os.makedirs(os.path.join(head_run, "nodes"), exist_ok=True)
    tmp = os.path.join(head_run, "nodes", f".{node}.duckdb.partial")
    shutil.copyfile(os.path.join(node_run, "store.duckdb"), tmp)
    os.replace(tmp, os.path.join(head_run, "nodes", f"{node}.duckdb"))
    shutil.copytree(os.path.join(node_run, "ranks"), os.path.join(head_run, "ranks"), dirs_exist_ok=True)


def test_per_node_stores_read_together_every_row_once(tmp_path):
    world = 3
    nodes = {"nodeA": [0, 1], "nodeB": [2]}
    node_runs = {node: _run_node(tmp_path, node, ranks, world) for node, ranks in nodes.items()}
    for node_run in node_runs.values():
        subprocess.run([sys.executable, "-m", "ranksight.cli", "ingest", node_run], check=True, capture_output=True)
    head = str(tmp_path / "head" / "multi")
    for node, node_run in node_runs.items():
        _ship(node_run, head, node)
    steps = {}
    for rank in range(world):
        with open(tmp_path / f"out{rank}.json") as f:
            steps[rank] = json.load(f)["steps"]

    con = open_run(head)
    counts = con.execute("SELECT rank, count(*), count(DISTINCT step) FROM steps GROUP BY rank ORDER BY rank")
    assert counts.fetchall() == [(r, steps[r], steps[r]) for r in range(world)]
    assert [row["rank"] for row in step_breakdown(con)] == [0, 1, 2]
    assert sorted(m.status for m in read_rank_meta(head)) == ["finished"] * world

    # A node's spool copied as well (both shipped by mistake): still once, and the head's ingest skips it.
    shutil.copytree(os.path.join(node_runs["nodeA"], "steps"), os.path.join(head, "steps"))
    con = open_run(head)
    assert con.execute("SELECT count(*), count(DISTINCT (rank, step)) FROM steps").fetchone() == (
        sum(steps.values()),
        sum(steps.values()),
    )
    assert ingest(head).rows == 0
    con = open_run(head)
    assert con.execute("SELECT count(*) FROM steps").fetchone() == (sum(steps.values()),)

    # The CLI reads the assembled run like any other.
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "diagnose", head, "--json"], check=True, capture_output=True
    )
    assert [r["rank"] for r in json.loads(out.stdout)["breakdown"]["ranks"]] == [0, 1, 2]


def test_the_head_absorbs_node_stores_into_one_store_every_row_once(tmp_path):
    """`ranksight ingest --nodes`: the node stores' rows go into the run's store and the files are set
    aside; a crash before they are set aside (their copies put back) counts nothing twice; a newer copy of
    a node store adds only its new rows."""
    world = 2
    node_runs = {"nodeA": _run_node(tmp_path, "nodeA", [0], world), "nodeB": _run_node(tmp_path, "nodeB", [1], world)}
    for node_run in node_runs.values():
        subprocess.run([sys.executable, "-m", "ranksight.cli", "ingest", node_run], check=True, capture_output=True)
    head = str(tmp_path / "head" / "multi")
    for node, node_run in node_runs.items():
        _ship(node_run, head, node)
    steps = {}
    for rank in range(world):
        with open(tmp_path / f"out{rank}.json") as f:
            steps[rank] = json.load(f)["steps"]
    expected = [(r, steps[r], steps[r]) for r in range(world)]
    sql = "SELECT rank, count(*), count(DISTINCT step) FROM steps GROUP BY rank ORDER BY rank"

    subprocess.run([sys.executable, "-m", "ranksight.cli", "ingest", head, "--nodes"], check=True, capture_output=True)
    assert sorted(os.listdir(os.path.join(head, "nodes", ".absorbed"))) == ["nodeA.duckdb", "nodeB.duckdb"]
    assert [n for n in os.listdir(os.path.join(head, "nodes")) if not n.startswith(".")] == []
    assert open_run(head).execute(sql).fetchall() == expected

    # As if the set-aside had not happened (a crash right after the new store was renamed into place).
    nodes_dir = os.path.join(head, "nodes")
    for node in node_runs:
        name = f"{node}.duckdb"
        shutil.copyfile(os.path.join(nodes_dir, ".absorbed", name), os.path.join(nodes_dir, name))
    assert open_run(head).execute(sql).fetchall() == expected
    assert ingest(head, absorb_node_stores=True).rows == 0
    assert open_run(head).execute(sql).fetchall() == expected

    # A node that ran on (more steps, ingested again) ships a newer copy: only its new rows are added.
    more = _run_node(tmp_path, "nodeA", [0], world)  # same run folder: 60 more steps for rank 0
    subprocess.run([sys.executable, "-m", "ranksight.cli", "ingest", more], check=True, capture_output=True)
    _ship(more, head, "nodeA")
    with open(tmp_path / "out0.json") as f:
        steps[0] += json.load(f)["steps"]
    con = open_run(head)
    assert con.execute("SELECT rank, count(*) FROM steps GROUP BY rank ORDER BY rank").fetchall() == [
        (0, steps[0]),
        (1, steps[1]),
    ]
    ingest(head, absorb_node_stores=True)
    assert open_run(head).execute("SELECT count(*) FROM steps").fetchone() == (steps[0] + steps[1],)


def test_a_node_store_that_is_not_ours_is_a_one_line_error(tmp_path):
    node_run = _run_node(tmp_path, "nodeA", [0], 1)
    head = str(tmp_path / "head" / "multi")
    shutil.copytree(os.path.join(node_run, "ranks"), os.path.join(head, "ranks"))
    os.makedirs(os.path.join(head, "nodes"))
    with open(os.path.join(head, "nodes", "nodeA.duckdb"), "wb") as f:
        f.write(b"not a database")
    with pytest.raises(StoreError, match="nodeA.duckdb"):
        open_run(head)
