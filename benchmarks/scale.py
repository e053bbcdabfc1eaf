"""What ranksight costs a job and a shared filesystem at 1,024 and 10,000 ranks, beside DuckDB's own limits.

Every scale figure the docs give comes from one run of this script (``--json`` keeps them). Sections:

``spool``
    Real processes, one per simulated rank, write synthetic rows at a real rank's rates (a step every
    ``--step-ms``, one collective row per step, 8 samples per flush) through the agent's own ``SpoolWriter``
    for ``--seconds``: every rank to the run folder (the default agent), then the node spool with the job
    declared as 1,024 and as 10,000 ranks. ``--nodes`` nodes of 8 ranks, time-compressed ``--speed`` times
    (flush, publish interval and file budget scaled together); ranks and nodes do not talk to each other, so
    the job's figures are exactly the per-rank or per-node figures times the ranks or nodes.
``prometheus``
    Series one rank's endpoint exposes once every kind of row has been seen (the agent's own collector).
``store``
    A spool of ``--store-ranks`` x ``--store-steps`` in each of ``--layouts`` (a segment per rank, a file per
    node of 8): ``step_breakdown`` and ``diagnose()`` live (in this process and as fresh processes' first
    call), ``ingest`` taking turns with DuckDB's Parquet -> table, the same calls on the store, and the Verdict
    page in headless Chromium taking turns with a one-line Streamlit page (``--no-browser``: not that).
``first``
    The first ``diagnose()`` and ``open_run`` + ``step_breakdown`` of fresh processes on a node spool of
    ``--first-ranks`` x ``--first-steps``, taking turns ``--rounds`` times with DuckDB's GROUP BY over the same
    files in a fresh process; ``--job-ranks``: rank files holding a DDP rank's sections, as a job writes them.
    A kept ``--dir`` is read again, not rebuilt.
``refresh``
    The same node spool at ``--store-ranks`` x ``--store-steps``, followed as the live dashboard follows it: after
    one new file per node, ``Run.refresh`` + ``diagnose()`` on the kept reading, taking turns ``--rounds`` times
    with DuckDB's GROUP BY over all the files in a fresh connection.

Each section's figures carry ``ratio_to_floor``: each time over the DuckDB floor measured in the same run, the
only comparison that holds across runs on a shared machine. Run it under ``nice`` on a shared machine.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _harness import cli, fresh_process, in_rounds, rotated, timed, write_results

HERE = os.path.dirname(os.path.abspath(__file__))

FLOORS = {
    **dict.fromkeys(("breakdown_live_s", "breakdown_live_first_fresh_s", "diagnose_live_s", "diagnose_first_s",
                     "diagnose_live_first_fresh_s", "breakdown_first_s"), "duckdb_groupby_files_s"),
    **dict.fromkeys(("breakdown_store_s", "diagnose_store_s"), "duckdb_groupby_table_s"),
    "refresh_s": "duckdb_groupby_files_s",
    "ingest_rows_per_s": "duckdb_arrow_insert_rows_per_s",
    "verdict_first_render_live_s": "streamlit_floor_first_live_s",
    "verdict_first_render_store_s": "streamlit_floor_first_store_s",
    **dict.fromkeys(("verdict_render_again_live_s", "verdict_render_again_store_s"), "streamlit_floor_again_s"),
}  # fmt: skip
"""Each timed figure of the sections and the DuckDB floor it is compared with (the same files, or store). Rows/s
figures are rates: their ratio is the floor's rate over theirs, so every ratio reads "times the floor's time"."""


def ratios_to_floor(figures: dict) -> dict[str, dict]:
    """{figure: {"floor": its floor's name, "ratio": times the floor's time}} for each figure of ``figures``
    that ``FLOORS`` names and that was measured in this run beside its floor."""
    out = {}
    for name, floor in FLOORS.items():
        value, base = figures.get(name), figures.get(floor)
        if not isinstance(value, (int, float)) or not isinstance(base, (int, float)) or not value or not base:
            continue
        ratio = base / value if "_per_s" in name else value / base  # a rate: the floor's over its own
        out[name] = {"floor": floor, "ratio": ratio}
    return out


RANKS_PER_NODE = 8
REAL_FLUSH_S = 2.0
DEFAULT_CAP = 150.0  # Config.max_job_files_per_s

# ------------------------------------------------------------------ spool: one simulated rank


def run_rank(spec: dict) -> None:
    """One simulated rank: the agent's SpoolWriter fed synthetic rows at a real rank's rates."""
    sys.path.insert(0, os.path.dirname(HERE))
    import pyarrow.parquet  # noqa: F401  (imported before the clock starts, as in a running agent)

    from ranksight.agent._identity import Identity
    from ranksight.agent._spool import SpoolWriter

    rank, node = spec["rank"], spec["node"]
    ident = Identity("scale", "scale-run", node, rank, rank % RANKS_PER_NODE, spec["world"], os.getpid())
    flush_s = REAL_FLUSH_S / spec["speed"]
    writer = SpoolWriter(spec["run_path"], ident, node_spool_dir=spec["node_spool"], flush_interval_s=flush_s,
                         max_job_files_per_s=DEFAULT_CAP * spec["speed"])  # fmt: skip
    steps_per_flush = max(1, round(REAL_FLUSH_S * 1000 / spec["step_ms"]))
    rng = random.Random(rank)
    publishes: list[tuple[float, float]] = []  # (when, seconds) of each publish this rank made
    if writer.publisher is not None:
        inner = writer.publisher.maybe_publish

        def timed_publish(final: bool = False):
            t0 = time.monotonic()
            result = inner(final)
            if result is not None:
                publishes.append((time.time(), time.monotonic() - t0))
            return result

        writer.publisher.maybe_publish = timed_publish
    step, flushes, rows = 0, 0, 0
    # Start-up (imports, the first Parquet write) is not what is measured: every rank starts together.
    with open(spec["out"] + ".ready", "w"):
        pass
    while not os.path.exists(spec["go"]):
        time.sleep(0.02)
    started = time.time()
    deadline = time.monotonic() + spec["seconds"]
    next_flush = time.monotonic() + flush_s * (rank % RANKS_PER_NODE) / RANKS_PER_NODE  # ranks not in phase
    while True:
        time.sleep(max(0.0, next_flush - time.monotonic()))
        final = time.monotonic() >= deadline
        now = time.time_ns()
        batch = range(step, step + steps_per_flush)
        # Values that vary as measured ones do: constant columns would compress to nothing.
        steps = [
            {"step": s, "time_ns": now - (step + steps_per_flush - s) * 100_000_000 + rng.randrange(10**6),
             "step_s": rng.gauss(0.1, 0.005), "data_wait_s": rng.expovariate(500), "compute_s": rng.gauss(0.08, 0.004),
             "comm_exposed_s": rng.expovariate(200), "allreduce_s": rng.gauss(0.03, 0.002),
             "optimizer_s": rng.gauss(0.01, 0.0005), "other_s": rng.expovariate(1000), "cpu_s": rng.gauss(0.09, 0.004)}
            for s in batch
        ]  # fmt: skip
        colls = [
            {"step": s, "op": "all_reduce", "origin": "ddp", "process_group": "default", "count": 4, "bytes": 10**8,
             "blocked_s": rng.expovariate(200), "busy_s": rng.gauss(0.03, 0.002)}
            for s in batch
        ]  # fmt: skip
        samples = [{"time_ns": now, "step": step, "name": f"s{i}", "value": rng.random()} for i in range(8)]
        for kind, batch_rows in (("steps", steps), ("collectives", colls), ("samples", samples)):
            writer.write(kind, batch_rows)
            rows += len(batch_rows)
        step += steps_per_flush
        flushes += 1
        writer.write_meta({**ident.labels(), "status": "finished" if final else "running",
                           "heartbeat_ns": time.time_ns(), "started_ns": int(started * 1e9),
                           "flush_interval_s": flush_s, "steps": step})  # fmt: skip
        if final:
            break
        next_flush += flush_s
    published = writer.publisher.published if writer.publisher else None
    out = {"rank": rank, "flushes": flushes, "rows": rows, "steps": step, "publishes": publishes,
           "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           "published_files": published.files if published else 0}  # fmt: skip
    with open(spec["out"], "w") as f:
        json.dump(out, f)


def _folder_stats(run_path: str) -> tuple[int, int]:
    """(segment files, bytes) in the run folder's kind folders."""
    files = size = 0
    for kind in ("steps", "collectives", "samples"):
        folder = os.path.join(run_path, kind)
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            if entry.name.endswith(".parquet") and not entry.name.startswith("."):
                files += 1
                size += entry.stat().st_size
    return files, size


def simulate(base: str, *, node_spool: bool, world: int, nodes: int, seconds: float, speed: float, step_ms: float):
    """Run ``nodes`` x 8 simulated ranks; return the shared folder's figures in real (not compressed) time."""
    tag = f"{'node' if node_spool else 'direct'}-{world}"
    root = os.path.join(base, tag)
    shutil.rmtree(root, ignore_errors=True)
    run_path = os.path.join(root, "runs", "scale-run")
    procs, outs = [], []
    for n in range(nodes):
        for local in range(RANKS_PER_NODE):
            rank = n * RANKS_PER_NODE + local
            out = os.path.join(root, f"rank{rank}.json")
            spec = {"rank": rank, "node": f"node{n:04d}", "world": world, "speed": speed, "seconds": seconds,
                    "step_ms": step_ms, "run_path": run_path, "out": out, "go": os.path.join(root, "go"),
                    "node_spool": os.path.join(root, f"local-{n}") if node_spool else None}  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, __file__, "_rank", json.dumps(spec)]))
            outs.append(out)
    while not all(os.path.exists(o + ".ready") for o in outs):
        time.sleep(0.05)
    with open(os.path.join(root, "go"), "w"):
        pass
    t0 = time.monotonic()
    # The steady state: files that appeared between 25 % and 95 % of the run (no start-up, no close).
    time.sleep(seconds * 0.25 + 1.0)
    f0, b0, s0 = *_folder_stats(run_path), time.monotonic()
    time.sleep(max(0.0, t0 + seconds * 0.95 + 1.0 - time.monotonic()))
    f1, b1, s1 = *_folder_stats(run_path), time.monotonic()
    for p in procs:
        p.wait(timeout=seconds + 120)
    wall = time.monotonic() - t0
    ranks = [json.load(open(o)) for o in outs]
    files, size = _folder_stats(run_path)
    rank_files = os.listdir(os.path.join(run_path, "ranks"))
    meta_writes = sum(r["flushes"] for r in ranks) if not node_spool else 0
    publishes_bundle = sum(r["published_files"] for r in ranks) - files if node_spool else 0
    n_ranks = nodes * RANKS_PER_NODE
    real_s = (s1 - s0) * speed  # the steady window in real time
    seg_per_s = (f1 - f0) / real_s
    rank_file_per_s = (meta_writes / (wall * speed)) if not node_spool else max(0, publishes_bundle) / (wall * speed)
    creates_per_s = seg_per_s + rank_file_per_s
    bytes_per_s = (b1 - b0) / real_s
    rows = sum(r["rows"] for r in ranks)
    publish_s = [d for r in ranks for _, d in r["publishes"]]
    # Every row arrived once: the run folder holds what the ranks wrote.
    import duckdb

    con = duckdb.connect()
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")
    stored, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT (rank, step)) FROM read_parquet('{glob}')"
    ).fetchone()
    assert stored == distinct == sum(r["steps"] for r in ranks), (stored, distinct)
    per = n_ranks if not node_spool else nodes
    at = (1024, 10_000) if not node_spool else (world,)
    from ranksight.agent._node_spool import publish_interval_s

    interval = publish_interval_s(REAL_FLUSH_S, world, RANKS_PER_NODE, DEFAULT_CAP) if node_spool else REAL_FLUSH_S
    return {
        "mode": "node spool" if node_spool else "every rank to the run folder", "declared_world": world,
        "simulated_ranks": n_ranks, "simulated_nodes": nodes, "speed": speed, "wall_s": wall, "rows": rows,
        "segments_in_run_folder": files, "rank_files_in_run_folder": len(rank_files), "publish_interval_s": interval,
        "shared_creates_per_s_per_unit": creates_per_s / per, "unit": "rank" if not node_spool else "node",
        "shared_bytes_per_s_per_unit": bytes_per_s / per, "rows_per_s_per_rank": rows / (wall * speed) / n_ranks,
        # Job totals: per rank x ranks (default agent, the same at any size), or per node x nodes of the
        # job the node spool was declared as (its publish interval depends on the job's size).
        "creates_per_s_at": {str(w): creates_per_s / per * (w if not node_spool else w / RANKS_PER_NODE) for w in at},
        "bytes_per_s_at": {str(w): bytes_per_s / per * (w if not node_spool else w / RANKS_PER_NODE) for w in at},
        "rank_maxrss_mb": statistics.median(r["maxrss_kb"] for r in ranks) / 1024,
        "rank_maxrss_max_mb": max(r["maxrss_kb"] for r in ranks) / 1024,
        # A rank that published holds pyarrow's pool peak afterwards; the others show the writer alone.
        "maxrss_mb_ranks_that_published": sorted(r["maxrss_kb"] / 1024 for r in ranks if r["publishes"]),
        "maxrss_mb_ranks_that_did_not": sorted(r["maxrss_kb"] / 1024 for r in ranks if not r["publishes"]),
        "lost_on_rank_crash_s": REAL_FLUSH_S, "lost_on_node_loss_s": interval, "rows_checked_once": stored,
        "publishes": len(publish_s), "publish_s_median": statistics.median(publish_s) if publish_s else None,
        "publish_s_max": max(publish_s) if publish_s else None,
        "flushes_per_rank_expected": seconds * speed / REAL_FLUSH_S,
        "flushes_per_rank": statistics.median(r["flushes"] for r in ranks),
    }  # fmt: skip


# ------------------------------------------------------------------ prometheus


def prometheus_series() -> dict:
    """Series on one rank's endpoint after rows of every kind: what Prometheus stores per rank."""
    from ranksight.agent._identity import Identity
    from ranksight.agent._prometheus import RollupCollector
    from ranksight.agent._rollup import Rollup
    from ranksight.format.schema import SAMPLE_NAMES

    rollup = Rollup()
    rollup.update("steps", [{"step_s": 0.1, "data_wait_s": 0.01, "comm_exposed_s": 0.01, "allreduce_s": 0.02}])
    rollup.update("samples", [{"name": n, "value": 0.5, "time_ns": 1, "step": 1} for n in SAMPLE_NAMES])
    rollup.update("compile", [{"kind": "graph_break", "count": 1}, {"kind": "recompile", "count": 1}])
    rollup.set_agent_counters(0, 0)
    ident = Identity("scale", "run", "node0", 0, 0, 8, 1)
    series = sum(len(fam.samples) for fam in RollupCollector(rollup, ident).collect())
    return {"series_per_rank": series, "series_at": {"1024": series * 1024, "10000": series * 10_000}}


# ------------------------------------------------------------------ store


def build_spool(
    run_path: str, ranks: int, steps: int, per_node: bool, first_step: int = 0, live: bool = False
) -> tuple[int, int]:
    """Write ``ranks`` x ``steps`` step rows as real spool files (the agent's Arrow schema, zstd Parquet): one
    segment and rank file per rank, or one file per node of 8 ranks with its digest and one rank file per node,
    as the node spool publishes them; the last rank is 1.3x slower in compute. ``live``: steps ``first_step``
    on of ~0.1 s ending now, the rank files heartbeating now (a live run, as ``dashboard_bench`` follows it).
    Returns (files, rows)."""
    import numpy as np
    import pyarrow as pa

    from ranksight.agent._node_spool import _write_durably
    from ranksight.format.digest_file import parquet_bytes, write_digest
    from ranksight.format.schema import arrow_schema

    schema = arrow_schema("steps")
    os.makedirs(os.path.join(run_path, "steps"), exist_ok=True)
    os.makedirs(os.path.join(run_path, "ranks"), exist_ok=True)
    rng, now, end = np.random.default_rng(first_step), time.time_ns(), first_step + steps
    files = 0
    for first in range(0, ranks, RANKS_PER_NODE if per_node else 1):
        members = np.arange(first, min(ranks, first + (RANKS_PER_NODE if per_node else 1)), dtype=np.int32)
        n = len(members) * steps
        rank = np.repeat(members, steps)
        step = np.tile(np.arange(first_step, end, dtype=np.int64), len(members))
        slow = np.where(rank == ranks - 1, 1.3, 1.0)
        if live:
            compute = rng.gamma(20.0, 0.005, n) * slow
            wait, exposed = rng.exponential(0.002, n), rng.exponential(0.005, n)
            opt, other, time_ns = np.full(n, 0.01), np.full(n, 0.002), now - (end - step) * 100_000_000
        else:
            compute = rng.gamma(20.0, 0.0005, n) * slow
            wait, exposed, other = rng.exponential(0.001, n), rng.exponential(0.0005, n), rng.exponential(0.0002, n)
            opt, time_ns = rng.normal(0.002, 0.0002, n).clip(0), 1_700_000_000_000_000_000 + step * 10_000_000
        step_s = wait + compute + exposed + opt + other
        node, run = f"node{first // RANKS_PER_NODE:04d}", os.path.basename(run_path)
        cols = {"job": pa.array(["bench"] * n), "run": pa.array([run] * n), "node": pa.array([node] * n)}
        numbers = {"rank": rank, "local_rank": rank % RANKS_PER_NODE, "world_size": np.full(n, ranks, dtype=np.int32),
                   "pid": 1000 + rank, "step": step, "time_ns": time_ns, "step_s": step_s,
                   "data_wait_s": wait, "compute_s": compute, "comm_exposed_s": exposed, "allreduce_s": exposed * 3,
                   "optimizer_s": opt, "other_s": other}  # fmt: skip
        cols.update((name, pa.array(values)) for name, values in numbers.items())
        # Columns added to the schema later (and GPU-only ones) stay NULL, as on a CPU rank.
        arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
        name = f"{node}_m{first:020d}-{first_step:06d}" if per_node else f"{node}_r{first:05d}_p{1000 + first}_000000"
        name += ".parquet"
        table = pa.Table.from_arrays(arrays, schema=schema)
        data = parquet_bytes(table)
        if per_node:  # as the node spool's publisher writes it, before the file
            write_digest(table, os.path.join(run_path, "steps"), name, _write_durably)
        with open(os.path.join(run_path, "steps", name), "wb") as f:
            f.write(data)
        files += 1
        metas = [{"rank": int(r), "status": "finished", "heartbeat_ns": 1, "steps": end, "world_size": ranks}
                 for r in members]  # fmt: skip
        for meta in metas if live else []:
            meta.update(status="running", heartbeat_ns=now, job="bench", run=run, started_ns=now - end * 100_000_000,
                        flush_interval_s=2.0)  # fmt: skip
        if per_node:  # the node spool's publisher writes one rank file per node
            with open(os.path.join(run_path, "ranks", f"node-{node}.json"), "w") as f:
                json.dump({"node": node, "ranks": metas}, f)
        else:
            with open(os.path.join(run_path, "ranks", f"rank-{first:05d}.json"), "w") as f:
                json.dump(metas[0], f)
    return files, ranks * steps


# ------------------------------------------------------------------ fresh processes and DuckDB's floors

_CALL = r"""
import json, resource, sys, time
run, what = sys.argv[1], sys.argv[2]
import duckdb, pyarrow  # imported before the clock starts, as in a reader that has run before
from ranksight.collectors import open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.rules import diagnose
before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if what == "breakdown":
    con = open_run(run, follow_spool=False)
    step_breakdown(con)
    con.close()
else:
    diagnose(run)
wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"times": [wall], "user_s": after.ru_utime - before.ru_utime,
                  "system_s": after.ru_stime - before.ru_stime}))
"""


def measure(run: str, what: str) -> dict:
    """``what`` ("breakdown" or "diagnose") on ``run`` as the first call of a fresh process: {"times": [its
    seconds], "user_s", "system_s", "process": the whole process's}."""
    return fresh_process(_CALL, run, what)


def first_calls_s(run: str, what: str, processes: int) -> list[float]:
    """The first call of ``what`` on ``run`` in each of ``processes`` fresh processes."""
    return [measure(run, what)["times"][0] for _ in range(processes)]


FRESH_PROCESSES = 5
"""Fresh processes per first-call figure: its median and each are kept (one process's first call varies by a
quarter here)."""

FLOOR_SQL = "SELECT rank, median(step_s), avg(step_s) FROM read_parquet('{glob}') GROUP BY rank"
"""DuckDB's floor for a verdict over step files: the per-rank median and mean of the step time in one pass."""

_FLOOR = r"""
import json, sys, time
import duckdb  # imported before the clock starts, as in the readers' fresh processes
con = duckdb.connect()
times = []
for _ in range(3):
    t = time.perf_counter()
    con.execute(sys.argv[1]).fetchall()
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times}))
"""


def fresh_floor_s(glob: str) -> list[float]:
    """``FLOOR_SQL`` over the files of ``glob`` three times on one connection of a fresh process: the first
    reads the footers, the next two what a repeated query costs (the floors here are such a median)."""
    return fresh_process(_FLOOR, FLOOR_SQL.format(glob=glob))["times"]


# ------------------------------------------------------------------ store


def verdict_render_s(run_path: str | None) -> dict[str, float]:
    """Seconds from navigation until the Verdict page's text is drawn and Streamlit idle, in headless Chromium:
    on a fresh server opened the moment it answers (its warm-up diagnosis still running), then once more;
    and (``*_drawn``) until no table or chart on it is a placeholder any more. ``run_path`` None: the same
    visits to a Streamlit app of one line holding the same marker, with the dashboard's flags (the floor:
    what any Streamlit page costs a fresh headless Chromium on this machine)."""
    from dashboard_bench import LANDING, page_on_fresh_server, time_visit_drawn

    out = {}
    with page_on_fresh_server(run_path, LANDING) as (page, port):
        for visit in ("first", "again"):
            out[visit], out[f"{visit}_drawn"] = time_visit_drawn(page, f"http://127.0.0.1:{port}/", LANDING)
    return out


PAGE_ROUNDS = 5
"""Rounds of the Verdict page against the one-line page, taking turns on fresh servers: one visit varies by
a fifth here, and a ratio of two single visits made minutes apart by more."""


def page_rounds(run_path: str, rounds: int = PAGE_ROUNDS) -> dict:
    """``verdict_render_s`` of ``run_path`` and of the one-line page, taking turns ``rounds`` times: each
    visit's figures, the medians, and the first render over the one-line page's in each round."""
    pages, floors = [], []
    for _ in range(rounds):
        pages.append(verdict_render_s(run_path))
        floors.append(verdict_render_s(None))
    ratios = [p["first"] / f["first"] for p, f in zip(pages, floors)]
    return {"page": pages, "floor": floors, **{key: statistics.median(p[key] for p in pages) for key in pages[0]},
            **{f"floor_{key}": statistics.median(f[key] for f in floors) for key in floors[0]},
            "first_over_floor_round_ratios": ratios, "first_over_floor_median": statistics.median(ratios)}  # fmt: skip


INGEST_ROUNDS = 3
"""Rounds of ``ingest`` against DuckDB's Parquet -> table, taking turns: one of each varies by a fifth here."""

_INGEST = r"""
import json, sys
import duckdb, pyarrow  # imported before the clock starts, as the floor's process has them
import ranksight.collectors as c
print(json.dumps({"seconds": c.ingest(sys.argv[1]).seconds}))
"""

_PARQUET_TO_TABLE = r"""
import json, sys, time
import duckdb
con = duckdb.connect(sys.argv[1])
con.execute("SET preserve_insertion_order = false")  # as ingest reads: no row order kept
t0 = time.perf_counter()
con.execute("CREATE TABLE steps AS SELECT * FROM read_parquet(?)", [sys.argv[2]])
con.execute("CHECKPOINT")
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.exists(path):
            os.remove(path)


def ingest_rounds(run_path: str, glob: str, floor_db: str, rounds: int) -> dict:
    """Per round, taking turns, each in a fresh process (as ``ranksight ingest`` runs) from no store and no
    table: ``ingest`` and DuckDB's Parquet -> table. Seconds per round, and ingest's over the floor's."""
    from ranksight.collectors import store_path

    out: dict = {"floor_s": [], "ingest_s": []}
    for _ in range(rounds):
        _remove(store_path(run_path))
        out["ingest_s"].append(fresh_process(_INGEST, run_path)["seconds"])
        _remove(floor_db, floor_db + ".wal")
        out["floor_s"].append(fresh_process(_PARQUET_TO_TABLE, floor_db, glob)["seconds"])
    out["over_floor_round_ratios"] = [f / i for f, i in zip(out["floor_s"], out["ingest_s"])]
    out["over_floor_median"] = statistics.median(out["over_floor_round_ratios"])
    return out


def store_figures(base: str, ranks: int, steps: int, per_node: bool, browser: bool = True) -> dict:
    """Breakdown, diagnose and ingest on one layout, live and on the store, each beside DuckDB's own floor."""
    import duckdb
    import pyarrow.parquet as pq

    from ranksight.collectors import open_run
    from ranksight.collectors._queries import step_breakdown
    from ranksight.rules import diagnose

    run_path = os.path.join(base, f"store-{'node' if per_node else 'rank'}-{ranks}x{steps}", "bench-run")
    shutil.rmtree(os.path.dirname(run_path), ignore_errors=True)
    t0 = time.perf_counter()
    files, rows = build_spool(run_path, ranks, steps, per_node)
    built_s = time.perf_counter() - t0
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")

    def breakdown():
        con = open_run(run_path, follow_spool=False)
        out = step_breakdown(con)
        con.close()
        return out

    # Calls in one process (the first reads the files, later ones what this process kept, as a live
    # dashboard's do), then the first call of fresh processes.
    live_each, diag_live_each = [], []
    live_s, live = timed(breakdown, each=live_each)
    diag_live_s, _ = timed(lambda: diagnose(run_path), repeats=2, each=diag_live_each)
    breakdown_fresh = first_calls_s(run_path, "breakdown", FRESH_PROCESSES)
    diagnose_fresh = first_calls_s(run_path, "diagnose", FRESH_PROCESSES)
    verdict_live = page_rounds(run_path) if browser else {}
    floor_files_s, _ = timed(lambda: duckdb.connect().execute(FLOOR_SQL.format(glob=glob)).fetchall())
    # DuckDB's floors for the ingest: Parquet -> table (in rounds, below) and an Arrow table in memory -> table.
    floor_db = os.path.join(base, "floor.duckdb")
    rounds = ingest_rounds(run_path, glob, floor_db, INGEST_ROUNDS)  # leaves the store and the floor's table
    fcon = duckdb.connect(floor_db)
    arrow_steps = pq.read_table(os.path.join(run_path, "steps"))
    t0 = time.perf_counter()
    fcon.register("arrow_view", arrow_steps)
    fcon.execute("CREATE TABLE arrow_steps AS SELECT * FROM arrow_view")
    fcon.execute("CHECKPOINT")
    arrow_insert_s = time.perf_counter() - t0
    table_sql = "SELECT rank, median(step_s), avg(step_s) FROM steps GROUP BY rank"
    groupby_s, _ = timed(lambda: fcon.execute(table_sql).fetchall())
    fcon.close()
    del arrow_steps
    store_s, stored = timed(breakdown)
    assert [r["steps"] for r in live] == [r["steps"] for r in stored]
    diag_store_s, _ = timed(lambda: diagnose(run_path), repeats=2)
    verdict_store = page_rounds(run_path) if browser else {}
    ingest_s = statistics.median(rounds["ingest_s"])
    out = {
        "layout": "one file per node of 8 ranks" if per_node else "one segment per rank", "ranks": ranks,
        "steps": steps, "rows": rows, "files": files, "built_s": built_s,
        # ingest and DuckDB's Parquet -> table taking turns in fresh processes, a fresh store and table each
        "ingest_s": ingest_s, "ingest_rows_per_s": rows / ingest_s, "ingest_rounds": rounds,
        "ingest_over_parquet_to_table_median": rounds["over_floor_median"],
        "duckdb_parquet_to_table_rows_per_s": rows / statistics.median(rounds["floor_s"]),
        "duckdb_arrow_insert_rows_per_s": rows / arrow_insert_s,
        "breakdown_live_s": live_s, "breakdown_live_each_s": live_each,  # the first in this process, then two more
        "breakdown_live_first_fresh_s": statistics.median(breakdown_fresh),
        "breakdown_live_first_fresh_each_s": breakdown_fresh, "breakdown_store_s": store_s,
        "duckdb_groupby_files_s": floor_files_s, "duckdb_groupby_table_s": groupby_s,
        "diagnose_live_s": diag_live_s, "diagnose_live_each_s": diag_live_each,
        "diagnose_live_first_fresh_s": statistics.median(diagnose_fresh),
        "diagnose_live_first_fresh_each_s": diagnose_fresh, "diagnose_store_s": diag_store_s,
        "streamlit_floor_again_s": verdict_store.get("floor_again"),
    }  # fmt: skip
    for where, pages in (("live", verdict_live), ("store", verdict_store)):
        # *_drawn: until no table or chart is a placeholder (the others stop at the script's idle); the floor: a
        # Streamlit page of one line, same flags, same fresh browser, taking turns
        out.update({f"verdict_first_render_{where}_s": pages.get("first"),
                    f"verdict_render_again_{where}_s": pages.get("again"),
                    f"verdict_first_drawn_{where}_s": pages.get("first_drawn"),
                    f"streamlit_floor_first_{where}_s": pages.get("floor_first"),
                    f"verdict_first_over_floor_{where}": pages.get("first_over_floor_median"),
                    f"verdict_page_rounds_{where}": pages})  # fmt: skip
    return out


# ------------------------------------------------------------------ first


def _spool_ready(run_path: str, ranks: int) -> bool:
    """Whether ``run_path`` holds the node spool ``build_spool`` writes for ``ranks`` with this code's digests
    (a file and a digest per node of 8, a rank file per node), so that a kept ``--dir`` is read again."""
    from ranksight.format.digest import chunk_steps_for, digest_paths

    steps_dir = os.path.join(run_path, "steps")
    try:
        names = [n for n in os.listdir(steps_dir) if n.endswith(".parquet") and not n.startswith(".")]
    except OSError:
        return False
    nodes = -(-ranks // RANKS_PER_NODE)
    found = digest_paths(steps_dir, chunk_steps_for(ranks), names)
    node_rank_file = os.path.join(run_path, "ranks", "node-node0000.json")
    return len(names) == len(found) == nodes and os.path.exists(node_rank_file)


def node_spool(base: str, ranks: int, steps: int) -> str:
    """The node spool of ``ranks`` x ``steps`` under ``base``, built unless a kept one is ready."""
    run_path = os.path.join(base, f"first-{ranks}x{steps}", "bench-run")
    if not _spool_ready(run_path, ranks):
        shutil.rmtree(os.path.dirname(run_path), ignore_errors=True)
        build_spool(run_path, ranks, steps, per_node=True)
    return run_path


JOB_RANK_ENTRY = {
    "job": "bench",
    "run": "bench-run",
    "hostname": "bench-host",
    "framework": "plain",
    "data_source": "loader",
    "schema_version": 1,
    "flush_interval_s": 2.0,
    "started_ns": 1,
    "counters": {"records_dropped_total": 0, "agent_errors_total": 0, "rows_spooled_total": 1000},
    "model": {"class": "GPT", "parameter_bytes": 497_664_000, "devices": ["cpu"]},
    "optimizer": {"class": "AdamW", "states_per_param": 2},
    "ddp": {"backend": "gloo", "bucket_cap_bytes": 26_214_400, "find_unused_parameters": False,
            "static_graph": False, "gradient_as_bucket_view": False},
    "ddp_logging": {"iteration": 1000, "unused_parameter_size": 0},
    "loader": {"class": "DataLoader", "num_workers": 4, "pin_memory": True, "batch_size": 32,
               "prefetch_factor": 2, "persistent_workers": True},
    "host": {"cpu_count": 96, "cpus_allowed": 96, "torch_threads": 12, "local_world_size": 8, "load_avg_1m": 30.5},
}  # fmt: skip
"""The sections the agent writes into a DDP rank's entry beyond its identity (a CPU job on gloo here): what a
job's rank files hold, where the benchmark's own entries hold five fields."""


def with_job_rank_entries(run: str) -> str:
    """A sibling of ``run`` (``<run>-job``: its step files and digests hard links, made once) whose node rank
    files give every rank ``JOB_RANK_ENTRY``'s sections, as a job's first verdict reads them."""
    into = run.rstrip("/") + "-job"
    ranks_dir = os.path.join(into, "ranks")
    if not os.path.isdir(ranks_dir):
        shutil.rmtree(into, ignore_errors=True)
        shutil.copytree(run, into, copy_function=os.link)
        for name in sorted(os.listdir(ranks_dir)):
            path = os.path.join(ranks_dir, name)
            with open(path) as f:
                node = json.load(f)
            node["ranks"] = [{**JOB_RANK_ENTRY, **meta, "node": node["node"]} for meta in node["ranks"]]
            os.remove(path)  # a link to the other run's file: written anew
            with open(path, "w") as f:
                json.dump(node, f)
    return into


def first_call_figures(base: str, ranks: int, steps: int, rounds: int, job_ranks: bool = False) -> dict:
    """The first calls of fresh processes on a node spool of ``ranks`` x ``steps`` beside DuckDB's GROUP BY
    over the same files in a fresh process, ``rounds`` rounds taking turns; medians, each round's figures and
    the median of the rounds' ratios to the floor."""
    run_path = node_spool(base, ranks, steps)
    if job_ranks:
        run_path = with_job_rank_entries(run_path)
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")
    calls = {"duckdb_groupby_files": lambda: {"times": fresh_floor_s(glob)},
             "diagnose_first_s": lambda: measure(run_path, "diagnose"),
             "breakdown_first_s": lambda: measure(run_path, "breakdown")}  # fmt: skip
    runs = in_rounds(calls, rounds, lambda arm, _: calls[arm](), lambda _, x: " ".join(f"{t:.3f}" for t in x["times"]))
    floors = [r["times"] for r in runs.pop("duckdb_groupby_files")]
    each = {"duckdb_groupby_files_s": [statistics.median(f) for f in floors],
            "duckdb_groupby_files_first_s": [f[0] for f in floors],
            **{name: [r["times"][0] for r in rs] for name, rs in runs.items()}}  # fmt: skip
    figures: dict = {"ranks": ranks, "steps": steps, "rows": ranks * steps, "files": -(-ranks // RANKS_PER_NODE),
                     "rounds": rounds, "rank_entries": "job" if job_ranks else "five fields"}  # fmt: skip
    figures.update({name: statistics.median(values) for name, values in each.items()})
    figures["each"] = each
    figures["round_ratio_medians"] = {
        name: statistics.median(v / f for v, f in zip(values, each["duckdb_groupby_files_s"]))
        for name, values in each.items()
        if name in FLOORS
    }
    return figures


REFRESH_NEW_STEPS = 10
"""Steps of the file each node adds before a refresh (one flush of the node spool's publisher)."""


def refresh_figures(base: str, ranks: int, steps: int, rounds: int) -> dict:
    """A kept live reading (the dashboard's: ``incremental``, ``follow_spool=False``) brought up to date after one
    new file per node: ``Run.refresh`` + ``diagnose()``, taking turns with DuckDB's GROUP BY over every file in a
    fresh connection. The files added and the rank files rewritten are put back after, so a kept ``--dir`` is
    read again as it was."""
    import duckdb

    from ranksight.collectors import open_run
    from ranksight.rules import diagnose

    run_path = node_spool(base, ranks, steps)
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")
    before = {os.path.join(d, n) for d, _, names in os.walk(run_path) for n in names}
    ranks_dir = os.path.join(run_path, "ranks")
    rank_files = {}
    for name in os.listdir(ranks_dir):
        with open(os.path.join(ranks_dir, name), "rb") as f:
            rank_files[name] = f.read()
    run = open_run(run_path, follow_spool=False, incremental=True)
    each: dict[str, list] = {"refresh_s": [], "duckdb_groupby_files_s": [], "load": []}
    try:
        first_s, _ = timed(lambda: diagnose(run), repeats=1)
        for r in range(rounds):
            build_spool(run_path, ranks, REFRESH_NEW_STEPS, True, first_step=steps + r * REFRESH_NEW_STEPS)
            each["load"].append(os.getloadavg()[0])
            for arm in rotated(["refresh_s", "duckdb_groupby_files_s"], r):
                t0 = time.perf_counter()
                if arm == "refresh_s":
                    assert run.refresh(), "the reading did not see the new files"
                    diagnose(run)
                else:
                    duckdb.connect().execute(FLOOR_SQL.format(glob=glob)).fetchall()
                each[arm].append(time.perf_counter() - t0)
            last = {arm: f"{times[-1]:.3f} s" for arm, times in each.items() if arm != "load"}
            print(f"round {r}: {last}", flush=True)
    finally:
        run.close()
        for path in {os.path.join(d, n) for d, _, names in os.walk(run_path) for n in names} - before:
            os.remove(path)
        for name, data in rank_files.items():
            with open(os.path.join(ranks_dir, name), "wb") as f:
                f.write(data)
    figures = {"ranks": ranks, "steps": steps, "new_steps_a_refresh": REFRESH_NEW_STEPS, "rounds": rounds,
               "files": -(-ranks // RANKS_PER_NODE), "first_diagnose_s": first_s, "each": each}  # fmt: skip
    figures.update({name: statistics.median(each[name]) for name in ("refresh_s", "duckdb_groupby_files_s")})
    figures["round_ratio_median"] = statistics.median(
        a / b for a, b in zip(each["refresh_s"], each["duckdb_groupby_files_s"])
    )
    return figures


# ------------------------------------------------------------------ main


def main() -> None:
    parser = cli(__doc__, rounds=5)
    parser.add_argument("--sections", default="spool,prometheus,store", help="spool, prometheus, store, first, refresh")
    parser.add_argument("--dir", help="where the spools are built (kept, and read again by the first section)")
    spool = parser.add_argument_group("spool section")
    spool.add_argument("--seconds", type=float, default=40.0, help="wall time of each spool simulation")
    spool.add_argument("--speed", type=float, default=10.0, help="time compression of the spool simulation")
    spool.add_argument("--nodes", type=int, default=2, help="simulated nodes of 8 ranks each")
    spool.add_argument("--step-ms", type=float, default=100.0, help="a simulated rank's step time")
    store = parser.add_argument_group("store section")
    store.add_argument("--store-ranks", type=int, default=1024)
    store.add_argument("--store-steps", type=int, default=2000)
    store.add_argument("--layouts", default="rank,node", help="rank, node or both")
    store.add_argument("--no-browser", action="store_true", help="skip the Verdict page in Chromium")
    first = parser.add_argument_group("first section (--rounds: rounds of fresh processes)")
    first.add_argument("--first-ranks", type=int, default=10_000)
    first.add_argument("--first-steps", type=int, default=1000)
    first.add_argument(
        "--job-ranks", action="store_true", help="rank files holding a DDP rank's sections, as a job writes them"
    )
    args = parser.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="ranksight-scale-")
    os.makedirs(base, exist_ok=True)
    sections = args.sections.split(",")
    figures: dict = {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0]}
    try:
        if "spool" in sections:
            from ranksight.agent._node_spool import publish_interval_s

            figures["spool"] = []
            for node_spool_on, world in ((False, 10_000), (True, 1024), (True, 10_000)):
                speed = args.speed
                if node_spool_on:
                    # A publish costs the same CPU whatever the compression: keep the compressed interval
                    # at 3 s or more, so this machine's publishes do not run back to back.
                    interval = publish_interval_s(REAL_FLUSH_S, world, RANKS_PER_NODE, DEFAULT_CAP)
                    speed = max(1.0, min(args.speed, interval / 3.0))
                fig = simulate(base, node_spool=node_spool_on, world=world, nodes=args.nodes, seconds=args.seconds,
                               speed=speed, step_ms=args.step_ms)  # fmt: skip
                figures["spool"].append(fig)
                print(json.dumps(fig), flush=True)
        if "prometheus" in sections:
            figures["prometheus"] = prometheus_series()
            print(json.dumps(figures["prometheus"]), flush=True)
        if "store" in sections:
            figures["store"] = []
            for layout in args.layouts.split(","):
                fig = store_figures(base, args.store_ranks, args.store_steps, layout == "node", not args.no_browser)
                fig["ratio_to_floor"] = ratios_to_floor(fig)
                figures["store"].append(fig)
                print(json.dumps(fig), flush=True)
        if "refresh" in sections:
            refresh = refresh_figures(base, args.store_ranks, args.store_steps, args.rounds)
            refresh["ratio_to_floor"] = ratios_to_floor(refresh)
            figures["refresh"] = refresh
            print(json.dumps(refresh), flush=True)
        if "first" in sections:
            first = first_call_figures(base, args.first_ranks, args.first_steps, args.rounds, args.job_ranks)
            first["ratio_to_floor"] = ratios_to_floor(first)
            figures["first"] = first
            print(json.dumps(first), flush=True)
        figures["load_avg_at_end"] = os.getloadavg()[0]
        if args.json:
            write_results(args.json, figures)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_rank":
        run_rank(json.loads(sys.argv[2]))
    else:
        main()
