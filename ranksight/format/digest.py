"""Digests: a published step file's rows summed per (rank, chunk of steps), written once beside the file.

Why: the dashboard's rollup and the verdict's breakdown sum the phase expressions over every step row: at
1,024 ranks x 10,000 steps, 1.3 s for the rollup's first build and most of the breakdown's 1.4-2.1 s on 2
cores (docs/scale.md). A file the node spool publishes never changes, and its publisher holds the file's rows
in memory at that moment, so it sums them there (~0.05 s for one node's 8,000 rows) and writes the sums as a
small file, ``steps/.digests/<key>/<file name>``. A reader folds the digest instead of the rows.
Its parts are Arrow IPC, not Parquet: a digest is read whole, often by the thousand, and opening a small
Parquet file is most of its cost (docs/scale.md "Step digests").

``key`` names the definition of the sums: this module's SQL (the phases of ``ranksight.format.phases``), the
chunk size, the warm-up and the file format. A reader whose definition differs (another chunk size, a newer agent or
reader) finds no digest under its key and reads the rows, so a digest is never read with another
meaning. A missing or unreadable digest costs speed, never a row.
"""

from __future__ import annotations

import hashlib
import os

from . import verdict_digest
from .phases import PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL
from .warmup import WARM_SQL, WARMUP_STEPS

FILE_FORMAT = "parts-2"
"""How a digest file is written (part of its key: a reader never opens a digest of another format): a header
naming its parts, then each part an Arrow IPC file (see ``pack_parts``); the ``steps`` part without the
columns that are NULL on every one of its rows (``SPARSE_PARTS``)."""
PARTS = ("chunks", "sums", "hist", "steps")
"""The tables of a digest: the rollup's ``chunks`` (``COLUMNS``) and the verdict's (``verdict_digest``)."""
SPARSE_PARTS = {"steps": ("step", "warm", *(c for c, _, _ in verdict_digest.STEPS_COLUMNS))}
"""Part -> its columns, of the parts written without a column that is NULL on every row (a CPU job's GPU
figures, a GPU job's CPU-timed ones: six of 22 columns of the per-step part, its largest) and read back with
it, NULL (``read_digest_parts``)."""
_MAGIC = b"RSDIGEST"
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


def chunk_steps_for(world_size: int) -> int:
    """Steps per digest row: 1 for small jobs (full detail), 64 at 1,024 ranks (~16 rows per step)."""
    return max(1, int(world_size) // 16)


def fold_sql(source: str) -> str:
    """SELECT of the digest rows of the step rows in ``source``; parameters ``$chunk`` and ``$warm``. A GPU
    rank's steps without CUDA events are left out (``ranksight.format.phases.SAMPLED_SQL``), as the readers leave
    them out of the rows.

    Every figure is a sum, count, minimum or maximum, so the rows of one (rank, chunk, warm) spread over
    several files add up: readers sum digest rows again by (rank, chunk).
    """
    sums = ", ".join(f"sum({sql}) AS {c[:-2]}_sum" for c, sql in SUMS.items())
    return f"""
        SELECT rank, any_value(node) AS node, step // $chunk AS chunk, {WARM_SQL} AS warm, count(*) AS n,
               min(step) AS step_min, max(step) AS step_max, min(time_ns) AS t_min, max(time_ns) AS t_max,
               {sums}, sum(coalesce(gpu_compute_s, compute_s)) AS compute_eff_sum,
               max({PERIOD_SQL}) AS step_max_s, count(h2d_s) AS h2d_n
        FROM {source} WHERE {SAMPLED_SQL} GROUP BY rank, chunk, warm"""


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
            "hist": (verdict_digest.hist_sql("batch"), warm),
            "steps": (verdict_digest.steps_sql("batch"), warm),
        }
        parts = {}
        for part, (sql, params) in queries.items():
            result = con.sql(sql, params=params)
            fetch = getattr(result, "to_arrow_table", None) or result.arrow  # DuckDB 2's name, and 1.x's
            parts[part] = _without_empty_columns(fetch()) if part in SPARSE_PARTS else fetch()
        return chunk_steps_for(world_size), parts
    finally:
        con.close()


def _without_empty_columns(table):
    """``table`` without the columns that are NULL on every row (all of them kept when it has no rows)."""
    if not table.num_rows:
        return table
    return table.select([i for i, column in enumerate(table.columns) if column.null_count < table.num_rows])


def pack_parts(parts: dict) -> bytes:
    """One digest file's bytes: ``_MAGIC``, a 4-byte header length, a JSON header {part: [offset, length]},
    then each part as an Arrow IPC file. A reader reads the header and the one part it wants."""
    import json

    import pyarrow as pa

    bodies = {}
    for name, table in parts.items():
        sink = pa.BufferOutputStream()
        # The verdict's parts hold a row per step: LZ4 makes what a shared filesystem carries smaller for
        # little CPU to read back. The rollup's small part, read by the thousand, stays plain.
        lz4 = name != "chunks" and pa.Codec.is_available("lz4_frame")
        options = pa.ipc.IpcWriteOptions(compression="lz4" if lz4 else None)
        with pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        bodies[name] = sink.getvalue().to_pybytes()
    offsets, at = {}, 0
    for name, body in bodies.items():
        offsets[name] = [at, len(body)]
        at += len(body)
    header = json.dumps(offsets).encode()
    return _MAGIC + len(header).to_bytes(4, "little") + header + b"".join(bodies.values())


_READ_WITH = None


def _read_with() -> dict:
    """How a part is read: decompressed on the calling thread (``read_digest_parts`` already reads
    ``_READERS`` files at once; pyarrow's own pool besides, its default, put up to six threads on 2 cores),
    into jemalloc's memory pool, or the system's where pyarrow has no jemalloc: pyarrow's default pool
    (mimalloc) took transparent huge pages for a per-step part, and some fresh processes' reads then spent
    several times the system time (docs/scale.md, "Decompressing on the reading thread")."""
    global _READ_WITH
    if _READ_WITH is None:
        import pyarrow as pa

        try:
            pool = pa.jemalloc_memory_pool()
        except NotImplementedError:
            pool = pa.system_memory_pool()
        _READ_WITH = {"options": pa.ipc.IpcReadOptions(use_threads=False), "memory_pool": pool}
    return _READ_WITH


def read_parts(path: str, parts) -> dict:
    """{part: pyarrow table} of the named parts of one digest file, read in one opening."""
    import json

    import pyarrow as pa

    out = {}
    with open(path, "rb") as f:
        head = f.read(len(_MAGIC) + 4)
        if len(head) < len(_MAGIC) + 4 or head[: len(_MAGIC)] != _MAGIC:
            raise ValueError("not a ranksight digest")
        header = json.loads(f.read(int.from_bytes(head[len(_MAGIC) :], "little")))
        start = f.tell()
        for part in parts:
            if part not in header:
                raise ValueError(f"no {part} part")
            offset, length = header[part]
            f.seek(start + offset)
            body = f.read(length)
            if len(body) != length:
                raise ValueError("cut short")
            out[part] = pa.ipc.open_file(pa.py_buffer(body), **_read_with()).read_all()
    return out


def write_digest(table, steps_dir: str, name: str, write_durably) -> str:
    """Write the digest of ``table`` (the rows of ``steps_dir/name``) where readers look for it; its path.

    ``write_durably(directory, name, write)`` puts a file in place whole or not at all (the node spool's
    own writer), so a reader never sees half a digest.
    """
    chunk_steps, parts = digest_of(table)
    folder = digest_folder(steps_dir, chunk_steps)
    os.makedirs(folder, exist_ok=True)
    data = pack_parts(parts)
    write_durably(folder, name, lambda f: f.write(data))
    return os.path.join(folder, name)


def read_digests(paths: list[str], part: str = "chunks", with_file: bool = True):
    """The ``part`` rows of the digest files ``paths``, as one pyarrow table (``COLUMNS`` in order for
    ``chunks``) with the column ``file`` (each row's step file name) unless not ``with_file``. Raises
    ``DigestError`` naming the first file that does not read: callers then read the rows of those files
    instead."""
    return read_digest_parts(paths, (part,), with_file)[part]


_SCANNED_WHOLE = 2048
"""Rows per chunk from which a part's chunks (one or more per file) are scanned as they are (DuckDB's vector
is 2,048 rows)."""


def read_digest_parts(paths: list[str], parts, with_file: bool = False) -> dict:
    """{part: one pyarrow table of that part's rows in every file of ``paths``} (see ``read_digests``),
    each file opened once. Raises ``DigestError`` naming the first file that does not read."""
    import pyarrow as pa

    schema = digest_schema()
    tables: dict[str, list] = {part: [] for part in parts}
    rows_per_file: dict[str, list] = {part: [] for part in parts}

    def read_one(path: str) -> dict:
        try:
            found = read_parts(path, parts)
            if "chunks" in found:
                found["chunks"] = found["chunks"].select([c for c, _ in COLUMNS])
            return found
        except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as exc:
            raise DigestError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc

    # Threads only for the LZ4 parts, whose decompression lets go of the GIL: the rollup's plain part is read
    # by Python alone, where handing 1,250 small files between threads cost more than reading them in turn.
    for found in _in_path_order(read_one, paths, threads=any(part != "chunks" for part in parts)):
        for part, table in found.items():
            tables[part].append(table)
            rows_per_file[part].append(table.num_rows)
    out = {}
    for part in parts:
        if not tables[part]:
            if part != "chunks":
                raise DigestError("no digest files")
            table = schema.empty_table()
        else:
            table = concat_part(part, tables[part])
            if part == "chunks" and table.schema != schema:
                table = table.cast(schema)  # once for all files, not per file
        out[part] = table.append_column("file", _file_column(paths, rows_per_file[part])) if with_file else table
    return out


def concat_part(part: str, tables: list):
    """One pyarrow table of the ``part`` tables of several digest files, as readers take it: a column some
    files left out (``SPARSE_PARTS``) NULL in their rows, one that all left out a column of NULLs (typed by the
    readers' SQL, which casts every column)."""
    import pyarrow as pa

    table = pa.concat_tables(tables, promote_options="permissive")
    if table.num_columns and table.num_rows < _SCANNED_WHOLE * table.column(0).num_chunks:
        # DuckDB scans many small chunks far slower than the same rows in one; chunks of a vector's rows or
        # more scan as fast, and are not copied again (a per-step part holds a row per step and file).
        table = table.combine_chunks()
    for name in SPARSE_PARTS.get(part, ()):
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows))
    return table


_READERS = 4
"""Files read at once: pyarrow lets go of the GIL to read and decompress a part, and a fresh process's first
read of a per-step part is mostly the kernel's page faults, which threads overlap."""


def _in_path_order(read_one, paths: list[str], threads: bool = True):
    """``read_one(path)`` of each path, yielded in the order of ``paths`` (so the first that raises, in that
    order, is the one reported), read by up to ``_READERS`` threads."""
    if len(paths) < 2 or not threads:
        yield from map(read_one, paths)
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(min(_READERS, len(paths)), thread_name_prefix="ranksight-digest")
    try:
        yield from pool.map(read_one, paths)
    finally:  # a file that does not read ends the reading: the files not started yet are not read
        pool.shutdown(wait=True, cancel_futures=True)


def _file_column(paths: list[str], rows_per_file: list[int]):
    """Each row's file name, dictionary-encoded: a per-step part can have millions of rows, and a Python
    string per row would cost more than the part's own read."""
    import numpy as np
    import pyarrow as pa

    names = pa.array([os.path.basename(p) for p in paths], pa.string())
    indices = np.repeat(np.arange(len(rows_per_file), dtype=np.int32), rows_per_file)
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), names)


class DigestError(Exception):
    """A digest file that does not read (damaged, foreign, or of another layout)."""


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
