"""``ranksight ingest RUN_DIR``: compact a run's spool into ``RUN_DIR/store.duckdb``.

Safe on a live or crashed run and beside readers: the store is rebuilt in a temporary file and
renamed into place, and segments that arrive later are read from the spool until the next ingest.
"""

from __future__ import annotations

from ranksight.collectors import ingest


def add_parser(sub):
    p = sub.add_parser(
        "ingest",
        help="compact a run's spool segments into a DuckDB store",
        description="Compact a run's Parquet spool into RUN_DIR/store.duckdb (incremental; safe while it runs).",
    )
    p.add_argument("run_dir", help="a run folder (one sub-folder of the run root, see `ranksight runs`)")
    return p


def run(args) -> int:
    result = ingest(args.run_dir)
    kinds = ", ".join(f"{k} {n}" for k, n in result.rows_by_kind.items()) or "nothing new"
    rate = result.rows / result.seconds if result.seconds > 0 else 0.0
    print(
        f"{result.store_path}: +{result.segments} segments, +{result.rows} rows ({kinds}) "
        f"in {result.seconds:.2f} s ({rate:,.0f} rows/s)"
    )
    return 0
