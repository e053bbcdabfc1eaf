"""Soak: ranks write real monitored steps while readers, ingest and prune run in loops beside them.

At the end every rank's steps are in the store exactly once (no loss, no duplicate), and no reader ever
failed or saw a step twice. ``RANKSIGHT_SOAK_S`` sets how long the writers run (default 6 s, a CI run of
about 20-30 s; e.g. ``RANKSIGHT_SOAK_S=300`` for a long one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest

from ranksight.collectors import ingest, open_run, read_rank_meta

WRITERS = 4
PRUNE_AFTER_S = 3.0  # a reader's open_run and query finish well within this on a loaded 2-core machine
MODES = ("follow", "named")  # open_run(follow_spool=True), as the dashboard keeps it; False, as the CLI reads

WRITER = """
import json, os, sys, time
import ranksight
run_dir, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
mon = ranksight.init(run_dir=run_dir, job="soak", run_id="soak", flush_interval_s=0.1)
steps, deadline = 0, time.monotonic() + seconds
for _ in mon.loader(iter(int, 1)):  # an endless loader: the wait for data is measured too
    with mon.step():
        time.sleep(0.002)
    steps += 1
    if time.monotonic() >= deadline:
        break
mon.close()
with open(out, "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "steps": steps}, f)
"""

READER = """
import json, os, sys, time
from ranksight.collectors import RunDirError, open_run
from ranksight.collectors._queries import step_breakdown
run, stop, out, follow = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "follow"
reads = []
while not os.path.exists(stop):
    opened = time.monotonic()
    try:
        con = open_run(run, follow_spool=follow)
        counts = con.execute("SELECT rank, count(*), count(DISTINCT step) FROM steps GROUP BY rank").fetchall()
        step_breakdown(con)
        con.close()
    except RunDirError:  # the run folder is not there yet
        time.sleep(0.05)
        continue
    except Exception as exc:
        reads.append({"s": time.monotonic() - opened, "error": f"{type(exc).__name__}: {exc}"[:300]})
        continue
    reads.append({"s": time.monotonic() - opened, "counts": counts})
with open(out, "w") as f:
    json.dump(reads, f)
"""


def _check_reads(reads: list[dict], grace_s: float, follow: bool) -> None:
    """What a reader is promised: every read sees each step once, and within ``grace_s`` of its
    ``open_run`` never fewer steps of a rank than an earlier read did, and never fails -- except that a
    view following the spool (the default) may fail while a prune deletes a file its glob just listed
    (DuckDB opens every listed file to bind the glob): open again. A connection kept past the grace period
    may miss segments pruned meanwhile (they are in the newer store it did not attach)."""
    seen: dict[int, int] = {}
    for read in reads:
        if "error" in read:
            assert "No such file" in read["error"] and (follow or read["s"] >= grace_s), read
            continue
        assert all(n == distinct for _, n, distinct in read["counts"]), read  # never a step twice
        if read["s"] >= grace_s:
            continue
        for rank, n, _ in read["counts"]:
            assert n >= seen.get(rank, 0), (read, seen)
            seen[rank] = n


COMPACTOR = """
import json, os, sys, time
from ranksight.collectors import RunDirError, ingest, prune
run, stop, out, grace = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ingests, pruned, errors, quarantined = 0, 0, [], []
deadline = None
# On a loaded host the writers can finish before three ingests ran: then go on (for at most 60 s) until
# three ran and something aged past the grace and was pruned, so the checks below always have work to judge.
while not os.path.exists(stop) or (ingests < 3 or pruned == 0) and time.time() < (deadline or float("inf")):
    if deadline is None and os.path.exists(stop):
        deadline = time.time() + 60
    try:
        result = ingest(run)
        quarantined += [str(q) for q in result.quarantined]
        ingests += 1
        pruned += prune(run, grace).files
    except RunDirError as exc:
        if "not a ranksight run directory" not in str(exc) and "no such directory" not in str(exc):
            errors.append(str(exc)[:300])
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}"[:300])
    time.sleep(0.3)
with open(out, "w") as f:
    json.dump({"ingests": ingests, "pruned": pruned, "errors": errors, "quarantined": quarantined}, f)
"""


def _python(code: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env)


def _writer_env(rank: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RANKSIGHT_DISABLED"}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WRITERS), RANKSIGHT_NODE="soak-node")
    return env


def _read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_writers_readers_ingest_and_prune_together_lose_and_double_nothing(tmp_path):
    seconds = float(os.environ.get("RANKSIGHT_SOAK_S", "6"))
    root, out, stop = tmp_path / "runs", tmp_path / "out", tmp_path / "stop"
    out.mkdir()
    run = str(root / "soak")
    readers = {mode: _python(READER, run, str(stop), str(out / f"reader-{mode}.json"), mode) for mode in MODES}
    compactor = _python(COMPACTOR, run, str(stop), str(out / "compactor.json"), str(PRUNE_AFTER_S))
    writers = [
        _python(WRITER, str(root), str(seconds), str(out / f"writer-{r}.json"), env=_writer_env(r))
        for r in range(WRITERS)
    ]
    try:
        assert [w.wait(timeout=seconds + 120) for w in writers] == [0] * WRITERS
    finally:
        stop.touch()
        for p in (*readers.values(), compactor, *writers):
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
    assert [p.returncode for p in (*readers.values(), compactor)] == [0] * (len(MODES) + 1)

    compacting = _read_json(out / "compactor.json")
    reads = {mode: _read_json(out / f"reader-{mode}.json") for mode in MODES}
    for mode in MODES:
        _check_reads(reads[mode], PRUNE_AFTER_S, follow=mode == "follow")
        assert sum("counts" in r for r in reads[mode]) >= 3  # it did read while the ranks wrote
    assert compacting["errors"] == [] and compacting["quarantined"] == []
    assert compacting["ingests"] >= 3 and compacting["pruned"] > 0  # segments went from the spool to the store

    final = ingest(run)
    assert final.quarantined == ()
    written = {w["rank"]: w["steps"] for w in (_read_json(out / f"writer-{r}.json") for r in range(WRITERS))}
    assert sorted(written) == list(range(WRITERS)) and min(written.values()) > 0
    with duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True) as store:
        stored = store.execute("SELECT rank, count(*), count(DISTINCT step), max(step) FROM steps GROUP BY rank")
        assert {r: (n, d, m) for r, n, d, m in stored.fetchall()} == {r: (n, n, n - 1) for r, n in written.items()}
    con = open_run(run)
    counts = dict(con.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall())
    assert counts == written and con.skipped == []
    metas = {m.rank: (m.status, m.steps) for m in read_rank_meta(run)}
    assert metas == {r: ("finished", n) for r, n in written.items()}
    assert not [f for f in os.listdir(run) if f.startswith(".tmp-")]  # no half-built store left behind
    shown = {mode: (len(r), sum("error" in x for x in r)) for mode, r in reads.items()}
    print(f"soak {seconds:g} s: {sum(written.values())} steps; reads (all, failed) {shown}; {compacting}")
