"""How fast a large run reads back at 1,024 and 10,000 ranks, beside DuckDB's own limits.

Every read-side scale figure the docs give comes from this script (``--json`` keeps them). Sections:

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

The write side's sections (``spool``: the files and bytes a job's ranks put on the run folder, every rank writing
and through the node spool; ``prometheus``: the series one rank's endpoint exposes) measured a budget once; they
run from commit 01bfb5c (docs/scale.md, "The budget").
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

from _harness import cli, fresh_process, in_rounds, rotated, timed, write_results

FLOORS = {
    **dict.fromkeys(("breakdown_live_s", "breakdown_live_first_fresh_s", "diagnose_live_s", "diagnose_first_s",
                     "diagnose_live_first_fresh_s", "breakdown_first_s"), "duckdb_groupby_files_s"),
    **dict.fromkeys(("breakdown_store_s", "diagnose_store_s"), "duckdb_groupby_table_s"),
    "refresh_s": "duckdb_groupby_files_s",
    "ingest_rows_per_s": "duckdb_parquet_to_table_rows_per_s",
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


# ------------------------------------------------------------------ a spool as the agent writes it


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
import json, sys, time
run, what = sys.argv[1], sys.argv[2]
import duckdb, pyarrow  # imported before the clock starts, as in a reader that has run before
from ranksight.collectors import open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.rules import diagnose
t = time.perf_counter()
if what == "breakdown":
    con = open_run(run, follow_spool=False)
    step_breakdown(con)
    con.close()
else:
    diagnose(run)
print(json.dumps({"times": [time.perf_counter() - t]}))
"""
"""``what`` ("breakdown" or "diagnose") on ``run`` as the first call of a fresh process (``fresh_process``):
{"times": [its seconds]}."""


def first_calls_s(run: str, what: str, processes: int) -> list[float]:
    """The first call of ``what`` on ``run`` in each of ``processes`` fresh processes."""
    return [fresh_process(_CALL, run, what)["times"][0] for _ in range(processes)]


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
    # DuckDB's floor for the ingest: Parquet -> table, in rounds taking turns with it
    floor_db = os.path.join(base, "floor.duckdb")
    rounds = ingest_rounds(run_path, glob, floor_db, INGEST_ROUNDS)  # leaves the store and the floor's table
    fcon = duckdb.connect(floor_db)
    table_sql = "SELECT rank, median(step_s), avg(step_s) FROM steps GROUP BY rank"
    groupby_s, _ = timed(lambda: fcon.execute(table_sql).fetchall())
    fcon.close()
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
             "diagnose_first_s": lambda: fresh_process(_CALL, run_path, "diagnose"),
             "breakdown_first_s": lambda: fresh_process(_CALL, run_path, "breakdown")}  # fmt: skip
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
    parser.add_argument("--sections", default="store", help="store, first, refresh")
    parser.add_argument("--dir", help="where the spools are built (kept, and read again by the first section)")
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
    main()
