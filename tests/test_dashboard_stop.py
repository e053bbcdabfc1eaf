"""A dashboard server told to stop while its warm-up is inside a DuckDB query exits cleanly.

The interpreter stops a daemon thread at exit by unwinding it; one inside a DuckDB call aborted the
process ("terminate called ...", SIGABRT), so a server stopped with Ctrl-C or SIGTERM in its first
seconds on a big run read as crashed. The warm-up now finishes its query first (``_warm.EXIT_WAIT_S``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ranksight.format.schema import arrow_schema

RANKS, STEPS, PER_FILE = 256, 4000, 8

EXIT_DURING_WARM_UP = """
import sys, time
from ranksight.dashboard import _warm
_warm.start(sys.argv[1])
time.sleep(0.2)
print("running" if not _warm._jobs[sys.argv[1]].done.is_set() else "finished", flush=True)
sys.exit(0)
"""


EXIT_DURING_BACKGROUND_BUILD = """
import os, sys, time
from ranksight.collectors import open_run
from ranksight.dashboard import _warm
building = []
def build():
    building.append(1)
    open_run(sys.argv[1]).rollup()  # every row folded: no digests here
    open(sys.argv[2], "w").close()  # the build ended
_warm.background(build, (), "ranksight-rollup-prefetch")  # as the dashboard prefetches a run's rollup
deadline = time.monotonic() + 20  # on a loaded machine the thread can take a while to be scheduled
while not building and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.1)
print("building" if building == [1] and not os.path.exists(sys.argv[2]) else "not building", flush=True)
sys.exit(0)
"""


def _big_run(root) -> str:
    """1 M step rows in node files: a diagnosis that takes a second or more on 2 cores."""
    run = os.path.join(str(root), "big")
    os.makedirs(os.path.join(run, "steps"))
    os.makedirs(os.path.join(run, "ranks"))
    schema = arrow_schema("steps")
    rng = np.random.default_rng(0)
    for first in range(0, RANKS, PER_FILE):
        rank = np.repeat(np.arange(first, first + PER_FILE, dtype=np.int32), STEPS)
        n = len(rank)
        compute = rng.gamma(20.0, 0.0005, n)
        cols = {
            "job": pa.array(["stop"] * n),
            "run": pa.array(["big"] * n),
            "node": pa.array([f"n{first // PER_FILE}"] * n),
            "rank": rank,
            "local_rank": rank % PER_FILE,
            "world_size": np.full(n, RANKS, dtype=np.int32),
            "pid": 1000 + rank,
            "step": np.tile(np.arange(STEPS, dtype=np.int64), PER_FILE),
            "time_ns": np.tile(np.arange(STEPS, dtype=np.int64), PER_FILE) * 10**7,
            "step_s": compute + 0.002,
            "compute_s": compute,
            "comm_exposed_s": np.full(n, 0.001),
            "optimizer_s": np.full(n, 0.001),
        }
        arrays = [pa.array(cols[f.name]).cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), os.path.join(run, "steps", f"n{first}.parquet"))
    for r in range(RANKS):
        meta = {"rank": r, "world_size": RANKS, "status": "running", "heartbeat_ns": time.time_ns(), "steps": STEPS}
        with open(os.path.join(run, "ranks", f"rank-{r:05d}.json"), "w") as f:
            json.dump(meta, f)
    return run


def test_a_server_exiting_while_its_warm_up_queries_exits_cleanly(tmp_path):
    run = _big_run(tmp_path)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", EXIT_DURING_WARM_UP, run], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "running"  # the exit came while the warm-up was still diagnosing
    assert proc.returncode == 0, proc.stderr[-800:]
    assert "terminate called" not in proc.stderr
    assert time.monotonic() - started < 60


def test_a_server_exiting_while_a_background_rollup_builds_exits_cleanly(tmp_path):
    """The rollup a page prefetches is built on a background thread (``_warm.background``) that the exit waits
    for too: the landing page releases it two seconds after its script has run, when a server may be stopping.
    An untracked daemon thread here was stopped inside the build at exit and aborted the process (SIGABRT)."""
    run = _big_run(tmp_path)
    ended = tmp_path / "ended"
    command = [sys.executable, "-c", EXIT_DURING_BACKGROUND_BUILD, run, str(ended)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "building"  # the exit came while the rollup was being built
    assert ended.exists()  # and waited for it, rather than stopping the thread wherever it was
    assert proc.returncode == 0, proc.stderr[-800:]
    assert "terminate called" not in proc.stderr
