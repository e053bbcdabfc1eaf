"""``scale.py``'s ``first`` section and the ratio of each of its figures to DuckDB's floor in the same run.

Why: on this shared 2-core VM one process's first ``diagnose()`` moves by a third between minutes, and
DuckDB's own GROUP BY over the same files moves with it; only the two measured side by side say how far
ranksight is from the least the same files cost. So each round runs, in fresh processes one after the
other, DuckDB's GROUP BY over the spool's step files, ranksight's first ``diagnose()`` and first ``open_run``
+ ``step_breakdown`` (and, with ``old_site``, an older version's first ``diagnose()``), and the figures are
kept per round with their ratio to that round's floor.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

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
print(json.dumps(times))
"""

FLOORS = {
    # figure -> the DuckDB floor it is compared with (the same files, or the same store)
    "breakdown_live_s": "duckdb_groupby_files_s",
    "breakdown_live_first_fresh_s": "duckdb_groupby_files_s",
    "breakdown_live_without_digests_s": "duckdb_groupby_files_s",
    "diagnose_live_s": "duckdb_groupby_files_s",
    "diagnose_live_first_fresh_s": "duckdb_groupby_files_s",
    "diagnose_live_without_digests_s": "duckdb_groupby_files_s",
    "rollup_first_build_live_s": "duckdb_groupby_files_s",
    "breakdown_store_s": "duckdb_groupby_table_s",
    "diagnose_store_s": "duckdb_groupby_table_s",
    "ingest_rows_per_s": "duckdb_arrow_insert_rows_per_s",
    "ingest_rows_per_s_without_answers": "duckdb_arrow_insert_rows_per_s",
    "verdict_first_render_live_s": "streamlit_floor_first_s",
    "verdict_first_render_store_s": "streamlit_floor_first_s",
    "verdict_render_again_live_s": "streamlit_floor_again_s",
    "verdict_render_again_store_s": "streamlit_floor_again_s",
    "rollup_first_build_s": "duckdb_groupby_files_s",
    "rollup_first_build_fresh_s": "duckdb_groupby_files_s",
    "rollup_first_build_from_rows_s": "duckdb_groupby_files_s",
    "diagnose_first_s": "duckdb_groupby_files_s",
    "diagnose_first_before_s": "duckdb_groupby_files_s",
    "breakdown_first_s": "duckdb_groupby_files_s",
}
"""Each timed figure of ``scale.py``'s sections and its floor. Rows/s figures are rates: their ratio is the
floor's rate over theirs, so every ratio reads "times the floor's time" (1 is DuckDB's own speed)."""


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


def fresh_floor_s(glob: str) -> list[float]:
    """``FLOOR_SQL`` over the files of ``glob`` three times on one connection of a fresh process: the first
    reads the footers, the next two what a repeated query costs (``scale.py``'s floors are such a median)."""
    out = subprocess.run(
        [sys.executable, "-c", _FLOOR, FLOOR_SQL.format(glob=glob)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spool_ready(run_path: str, ranks: int) -> bool:
    """Whether ``run_path`` holds a node spool of ``ranks`` that ``build_spool`` wrote with this code's digests
    (a file per node of 8 and a digest for each), so that a kept ``--dir`` is read again instead of rebuilt."""
    from ranksight.format.digest import chunk_steps_for, digest_paths

    steps_dir = os.path.join(run_path, "steps")
    try:
        names = [n for n in os.listdir(steps_dir) if n.endswith(".parquet") and not n.startswith(".")]
    except OSError:
        return False
    nodes = -(-ranks // 8)
    return len(names) == nodes and len(digest_paths(steps_dir, chunk_steps_for(ranks), names)) == nodes


def first_call_figures(
    base: str, ranks: int, steps: int, rounds: int, build_spool, old_site: str | None = None
) -> dict:
    """The first calls of fresh processes on a node spool of ``ranks`` x ``steps`` (``build_spool``,
    ``scale.py``'s: a file per node of 8 with its digest, as the node spool publishes them) beside DuckDB's
    GROUP BY over the same files, ``rounds`` rounds taking turns; medians, each round's figures, and their
    ratios to the floor (the median of each round's ratio, and the ratio of the medians)."""
    sys.path.insert(0, HERE)
    from reader_versions import measure

    run_path = os.path.join(base, f"first-{ranks}x{steps}", "bench-run")
    if not _spool_ready(run_path, ranks):
        import shutil

        shutil.rmtree(os.path.dirname(run_path), ignore_errors=True)
        build_spool(run_path, ranks, steps, per_node=True)
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")
    each: dict[str, list] = {
        "duckdb_groupby_files_s": [],
        "duckdb_groupby_files_first_s": [],
        "diagnose_first_s": [],
        "breakdown_first_s": [],
    }
    if old_site:
        each["diagnose_first_before_s"] = []
    for _ in range(rounds):
        floor = fresh_floor_s(glob)
        each["duckdb_groupby_files_first_s"].append(floor[0])
        each["duckdb_groupby_files_s"].append(statistics.median(floor))
        each["diagnose_first_s"].append(measure("", run_path, "diagnose", 1)["times"][0])
        each["breakdown_first_s"].append(measure("", run_path, "breakdown", 1)["times"][0])
        if old_site:
            each["diagnose_first_before_s"].append(measure(old_site, run_path, "diagnose", 1)["times"][0])
        print(", ".join(f"{k} {v[-1]:.3f}" for k, v in each.items()), flush=True)
    figures: dict = {
        "ranks": ranks,
        "steps": steps,
        "rows": ranks * steps,
        "files": -(-ranks // 8),
        "rounds": rounds,
        "old_site": old_site,
    }
    figures.update({name: statistics.median(values) for name, values in each.items()})
    figures["each"] = each
    figures["ratio_to_floor"] = ratios_to_floor(figures)
    floors = each["duckdb_groupby_files_s"]
    figures["round_ratio_medians"] = {
        name: statistics.median(v / f for v, f in zip(values, floors))
        for name, values in each.items()
        if name in FLOORS
    }
    return figures
