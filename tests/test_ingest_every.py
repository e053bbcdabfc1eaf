"""``ranksight ingest --every S``: follows a live run, pass after pass, and stops once the run ended,
with a last pass that holds its last segments (a long job's spool stays small with ``--prune``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import duckdb

from ranksight.agent._identity import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import store_path


def _rows(steps: range) -> list[dict]:
    return [{"step": s, "time_ns": time.time_ns() + s, "step_s": 0.01, "compute_s": 0.008} for s in steps]


def test_ingest_every_follows_a_live_run_and_stops_after_its_last_segments(tmp_path):
    run = str(tmp_path / "runs" / "r")
    ident = Identity("every", "r", "n0", 0, 0, 1, 1000)
    w = SpoolWriter(run, ident)

    def say(status: str, steps: int) -> None:
        meta = {**ident.labels(), "status": status, "heartbeat_ns": time.time_ns(), "steps": steps}
        w.write_meta({**meta, "flush_interval_s": 0.2})

    w.write("steps", _rows(range(0, 10)))
    say("running", 10)
    cmd = [sys.executable, "-m", "ranksight", "ingest", "--every", "0.3", "--prune", "--prune-after", "0", run]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None  # the run is live: it keeps going
        w.write("steps", _rows(range(10, 20)))
        say("running", 20)
        time.sleep(1.0)
        w.write("steps", _rows(range(20, 30)))  # the last segment, then the last word
        say("finished", 30)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    passes = [line for line in out.splitlines() if "segments, +" in line]
    assert len(passes) >= 3, out
    con = duckdb.connect(store_path(run), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT step) FROM steps").fetchone() == (30, 30)
    assert [n for n in os.listdir(os.path.join(run, "steps")) if not n.startswith(".")] == []  # pruned


def test_ingest_every_refuses_a_period_that_is_not_positive(tmp_path):
    run = str(tmp_path / "r")
    SpoolWriter(run, Identity("every", "r", "n0", 0, 0, 1, 1000)).write("steps", _rows(range(3)))
    os.makedirs(os.path.join(run, "ranks"), exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "ranksight", "ingest", "--every", "0", run], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--every must be > 0" in proc.stderr and len(proc.stderr.splitlines()) == 1
