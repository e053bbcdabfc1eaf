"""Digests: a published step file's rows summed per (rank, chunk of steps), written once beside the file.

Why: the dashboard's rollup and the verdict's breakdown sum the phase expressions over every step row: at
1,024 ranks x 10,000 steps, 1.3 s for the rollup's first build and most of the breakdown's 1.4-2.1 s on 2
cores (docs/scale.md). A file the node spool publishes never changes, and its publisher holds the file's rows
in memory at that moment, so it sums them there (~0.05 s for one node's 8,000 rows) and writes the sums as a
small file, ``steps/.digests/<key>/<file name>``. A reader folds the digest instead of the rows.
Its parts are Arrow IPC, not Parquet: a digest is read whole, often by the thousand, and opening a small
Parquet file is most of its cost.

``key`` names the definition of the sums: this module's SQL (the phases of ``ranksight.format.phases``), the
chunk size, the warm-up and the file format. A reader whose definition differs (another chunk size, a newer agent or
reader) finds no digest under its key and reads the rows, so a digest is never read with another
meaning. A missing or unreadable digest costs speed, never a row.

This module is the definition (what a digest row sums, its key, where its files live); how a digest file is
laid out, written and read back is ``ranksight.format.digest_file``.
"""

from __future__ import annotations

import hashlib
import os

from . import verdict_digest
from .phases import PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL
from .warmup import WARM_SQL, WARMUP_STEPS

FILE_FORMAT = "parts-4"
"""How a digest file is written (part of its key: a reader never opens a digest of another format): a header
naming its parts, then each part an Arrow IPC file (``digest_file.pack_parts``); the ``steps`` part without the
columns that are NULL on every one of its rows (``SPARSE_PARTS``); since ``parts-4`` exact per-file medians and no
histograms."""
PARTS = ("chunks", "sums", "medians", "steps")
"""The tables of a digest, in the file's order: the rollup's ``chunks`` (``COLUMNS``) and the verdict's
(``verdict_digest``). The parts every verdict reads (``sums``, ``medians``, ``steps``) lie together at the end:
one read of that span."""
SPARSE_PARTS = {"steps": ("step", "warm", *(c for c, _, _ in verdict_digest.STEPS_COLUMNS))}
"""Part -> its columns, of the parts written without a column that is NULL on every row (a CPU job's GPU
figures, a GPU job's CPU-timed ones: six of 22 columns of the per-step part, its largest) and read back with
it, NULL (``read_digest_parts``)."""
DIGEST_DIR = ".digests"
"""Folder inside ``steps/`` holding one folder per digest definition (dot-prefixed: spool globs skip it)."""

SUMS: dict[str, str] = {
    **{p: PHASE_SQL[p] for p in PHASES},
    "step_s": PERIOD_SQL,
    "allreduce_s": "allreduce_s",
    "data_wait_host_s": "data_wait_s",  # the host's own wait (the phase above is what the GPU saw of it)
}
"""Column -> SQL summed per digest row; ``step_sum`` is the step period, as in ``step_breakdown``."""

COLUMNS: tuple[tuple[str, str], ...] = (
    ("rank", "INTEGER"),
    ("node", "VARCHAR"),
    ("chunk", "BIGINT"),
    ("warm", "BOOLEAN"),
    ("n", "BIGINT"),
    ("step_min", "BIGINT"),
    ("step_max", "BIGINT"),
    ("t_min", "BIGINT"),
    ("t_max", "BIGINT"),
    *((f"{c[:-2]}_sum", "DOUBLE") for c in SUMS),
    ("compute_eff_sum", "DOUBLE"),
    ("step_max_s", "DOUBLE"),
    ("h2d_n", "BIGINT"),
)
"""A digest row's columns, in order: also the dashboard's rollup table, which adds digests up."""


def column_steps(last_step: int, columns: int, chunk_steps: int = 1) -> int:
    """Steps per heatmap column: ``chunk_steps`` doubled until ``columns`` columns hold steps 0..``last_step``.
    Why doubling: a column keeps its width in steps (and on the page) while the run grows, and halves the count of
    columns only when they fill the chart; the rollup merges its rows no wider than this, so every column holds
    whole rows."""
    col = max(1, int(chunk_steps))
    while col * max(1, int(columns)) < max(1, int(last_step) + 1):
        col *= 2
    return col


def chunk_steps_for(world_size: int) -> int:
    """Steps per digest row: 1 for small jobs (full detail), 64 at 1,024 ranks (~16 rows per step)."""
    return max(1, int(world_size) // 16)


def fold_sql(source: str, by: str | None = None) -> str:
    """SELECT of the digest rows of the step rows in ``source``; parameters ``$chunk`` and ``$warm``. A GPU
    rank's steps without CUDA events are left out (``ranksight.format.phases.SAMPLED_SQL``), as the readers leave
    them out of the rows. ``by``: a column whose values each get their own rows (``ingest``'s segment name).

    Every figure is a sum, count, minimum or maximum, so the rows of one (rank, chunk, warm) spread over
    several files add up: readers sum digest rows again by (rank, chunk).
    """
    sums = ", ".join(f"sum({sql}) AS {c[:-2]}_sum" for c, sql in SUMS.items())
    key = f"{by}, " if by else ""
    return f"""
        SELECT {key}rank, any_value(node) AS node, step // $chunk AS chunk, {WARM_SQL} AS warm, count(*) AS n,
               min(step) AS step_min, max(step) AS step_max, min(time_ns) AS t_min, max(time_ns) AS t_max,
               {sums}, sum(coalesce(gpu_compute_s, compute_s)) AS compute_eff_sum,
               max({PERIOD_SQL}) AS step_max_s, count(h2d_s) AS h2d_n
        FROM {source} WHERE {SAMPLED_SQL} GROUP BY {key}rank, chunk, warm"""


def digest_key(chunk_steps: int) -> str:
    """The name of one digest definition: the chunk size and a hash of the SQL and warm-up behind it."""
    text = (
        f"{fold_sql('steps')}\nchunk={int(chunk_steps)}\nwarm={WARMUP_STEPS}\nformat={FILE_FORMAT}\n"
        f"{verdict_digest.definition()}"
    )
    return f"c{int(chunk_steps)}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def digest_keys(steps_dir: str) -> list[str]:
    """The digest definitions under ``steps_dir`` that match this code's (others are never read)."""
    try:
        names = os.listdir(os.path.join(steps_dir, DIGEST_DIR))
    except OSError:
        return []
    return sorted(n for n in names if chunk_of_key(n) is not None)


def chunk_of_key(key: str) -> int | None:
    """The chunk size of a digest definition this code writes, None for any other (older or foreign) key."""
    head = key.split("-", 1)[0]
    if not (head.startswith("c") and head[1:].isdigit()):
        return None
    return int(head[1:]) if digest_key(int(head[1:])) == key else None


def digest_folder(steps_dir: str, chunk_steps: int) -> str:
    """Where the digests of ``steps_dir``'s files live under the definition for ``chunk_steps``."""
    return os.path.join(steps_dir, DIGEST_DIR, digest_key(chunk_steps))


def digest_paths(steps_dir: str, chunk_steps: int, names) -> dict[str, str]:
    """File name -> its digest's path, for those of ``names`` that have one under this definition
    (one directory listing)."""
    folder = digest_folder(steps_dir, chunk_steps)
    try:
        present = set(os.listdir(folder))
    except OSError:
        return {}
    return {name: os.path.join(folder, name) for name in names if name in present}


def digest_of(table) -> tuple[int, dict]:
    """(chunk size, {part: pyarrow table}) of a pyarrow table of step rows (``PARTS``); DuckDB on one thread,
    the chunk size from the rows' world size as the rollup chooses it.

    Columns the table lacks (rows of an older agent) read as NULL, as readers of the spool see them.
    """
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc

    from .schema import arrow_schema

    schema = arrow_schema("steps")
    batch = pa.table(
        {
            f.name: table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in schema
        }
    )
    world_size = pc.max(batch["world_size"]).as_py() or 1
    con = duckdb.connect(config={"threads": 1})
    try:
        con.execute("SET enable_progress_bar = false")  # never a bar in a training job's output
        con.register("batch", batch)
        warm = {"warm": WARMUP_STEPS}
        queries = {
            "chunks": (fold_sql("batch"), {"chunk": chunk_steps_for(world_size), **warm}),
            "sums": (verdict_digest.sums_sql("batch"), warm),
            "medians": (verdict_digest.medians_sql("batch"), warm),
            "steps": (verdict_digest.steps_sql("batch"), warm),
        }
        parts = {}
        for part, (sql, params) in queries.items():
            result = con.sql(sql, params=params)
            fetch = getattr(result, "to_arrow_table", None) or result.arrow  # DuckDB 2's name, and 1.x's
            parts[part] = _without_empty_columns(fetch()) if part in SPARSE_PARTS else fetch()
        return chunk_steps_for(world_size), {part: parts[part] for part in PARTS}  # the file's order: steps last
    finally:
        con.close()


def _without_empty_columns(table):
    """``table`` without the columns that are NULL on every row (all of them kept when it has no rows)."""
    if not table.num_rows:
        return table
    return table.select([i for i, column in enumerate(table.columns) if column.null_count < table.num_rows])


def digest_schema():
    """The pyarrow schema of ``COLUMNS``."""
    import pyarrow as pa

    types = {
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "DOUBLE": pa.float64(),
        "VARCHAR": pa.string(),
        "BOOLEAN": pa.bool_(),
    }
    return pa.schema([(c, types[t]) for c, t in COLUMNS])


def remove_digests(steps_dir: str, name: str) -> None:
    """Delete every digest of the step file ``name`` (when ``prune`` deletes the file)."""
    root = os.path.join(steps_dir, DIGEST_DIR)
    try:
        keys = os.listdir(root)
    except OSError:
        return
    for key in keys:
        try:
            os.remove(os.path.join(root, key, name))
        except OSError:
            pass
