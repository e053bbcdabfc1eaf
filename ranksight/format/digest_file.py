"""A digest file: how a digest's parts (``ranksight.format.digest``) are laid out in one file, written whole
beside the step file they sum and read back, by the thousand, in one opening each.

Why a module of its own: the definition of a digest (its SQL, key and folder) is what a reader and a writer
must agree on to give the same figures; the container is how those figures travel -- a header naming the
parts, then each part an Arrow IPC file (LZ4 for the verdict's parts) -- and changing it changes the key
(``FILE_FORMAT``), never a figure.
"""

from __future__ import annotations

import os

from .digest import COLUMNS, SPARSE_PARTS, digest_folder, digest_of, digest_schema

_MAGIC = b"RSDIGEST"


class DigestError(Exception):
    """A digest file that does not read (damaged, foreign, or of another layout)."""


def pack_parts(parts: dict) -> bytes:
    """One digest file's bytes: ``_MAGIC``, a 4-byte header length, a JSON header {part: [offset, length]}, then
    each part as an Arrow IPC file. A reader reads the header and the one part it wants."""
    import json

    import pyarrow as pa

    bodies = {}
    for name, table in parts.items():
        sink = pa.BufferOutputStream()
        # Not compressed: every first verdict reads the per-step part, and decompressing it was 0.08 s of 0.1 s
        # at 10,000 ranks x 1,000 steps (1,250 files), for a third of its bytes.
        with pa.ipc.new_file(sink, table.schema) as writer:
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
    several times the system time."""
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
    """{part: pyarrow table} of the named parts of one digest file, read in one opening: two reads, the header
    and the span of the parts asked for (the parts a verdict reads lie together at the file's end,
    ``digest.PARTS``), each part a slice of that span. At 10,000 ranks a reader opens 1,250 digests, and
    Python's per-call costs of a buffered file's seeks and reads per part were a third of the reading."""

    return {part: _as_table(found) for part, found in _read_part_batches(path, parts).items()}


def _as_table(found):
    """A part as ``_read_part_batches`` gives it (a table, or one record batch) as a table."""
    import pyarrow as pa

    return found if isinstance(found, pa.Table) else pa.Table.from_batches([found])


def _read_part_batches(path: str, parts) -> dict:
    """``read_parts``, a part of one record batch left as that batch: many files' batches make one table in one
    call (``concat_part``), where a table per file took a few microseconds each, 10 for a ``sums`` part."""
    import pyarrow as pa

    fd = os.open(path, os.O_RDONLY)
    try:
        header, start = _read_header(fd)
        for part in parts:
            if part not in header:
                raise ValueError(f"no {part} part")
        spans = [header[part] for part in parts]
        low = min((offset for offset, _ in spans), default=0)
        high = max((offset + length for offset, length in spans), default=0)
        blob = os.pread(fd, high - low, start + low)
    finally:
        os.close(fd)
    if len(blob) != high - low:
        raise ValueError("cut short")
    span = pa.py_buffer(blob)
    out = {}
    for part, (offset, length) in zip(parts, spans):
        body = span.slice(offset - low, length)
        batch = _one_batch(body)
        if batch is not None:
            out[part] = batch
            continue
        reader = pa.ipc.open_file(body, **_read_with())
        # batch by batch: ``read_all`` took half as long again for a part of one batch (a few columns)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        out[part] = pa.Table.from_batches(batches, schema=reader.schema)
    return out


_STREAM_AT = 8
"""Where an Arrow IPC file's stream of messages starts: after the magic ``ARROW1`` and its padding."""
_CONTINUATION = b"\xff\xff\xff\xff"
_END_OF_STREAM = _CONTINUATION + bytes(4)
_MAGIC_ARROW = b"ARROW1"

_schemas: dict[bytes, object] = {}
"""A part's schema message -> its schema (None: one with dictionaries), for ``_one_batch``: a few per digest
definition (its parts, and the columns each file leaves out)."""
_KEPT_SCHEMAS = 64
_UNSEEN = object()


def _one_batch(body):
    """The record batch of the IPC file ``body`` where it holds exactly one, without dictionaries, else None
    (``read_parts`` then reads it as an IPC file). Read as the message after the schema message, whose schema
    is parsed once for all the files that share it: opening each of 1,250 files' three parts as an IPC file
    (its footer, then the batch) took 2-3x as long, 0.05 s of a first verdict at 10,000 ranks."""
    import pyarrow as pa

    if body.size < _STREAM_AT + 8 or body.slice(body.size - 6).to_pybytes() != _MAGIC_ARROW:
        return None  # not a whole IPC file: its reader says what is wrong
    head = body.slice(_STREAM_AT, 8).to_pybytes()
    if head[:4] != _CONTINUATION:
        return None
    length = int.from_bytes(head[4:], "little")
    key = body.slice(_STREAM_AT + 8, length).to_pybytes()
    schema = _schemas.get(key, _UNSEEN)
    if schema is _UNSEEN:
        schema = pa.ipc.read_schema(body.slice(_STREAM_AT))
        # A schema with dictionaries has their batches before the record batch: read as an IPC file.
        if any(pa.types.is_dictionary(f.type) for f in schema):
            schema = None
        if len(_schemas) >= _KEPT_SCHEMAS:
            _schemas.clear()
        _schemas[key] = schema
    if schema is None:
        return None
    at = _STREAM_AT + 8 + length
    if body.slice(at, 8).to_pybytes() == _END_OF_STREAM:
        return None  # no batch at all (an empty part)
    stream = pa.BufferReader(body)
    stream.seek(at)
    message = pa.ipc.read_message(stream)
    if message.type != "record batch" or body.slice(stream.tell(), 8).to_pybytes() != _END_OF_STREAM:
        return None
    return pa.ipc.read_record_batch(message, schema)


_HEAD_READ = 4096
"""Bytes read first: the magic, the header's length and the header (a few hundred bytes; a card an older
publisher wrote there made it about two thousand)."""


def _read_header(fd: int) -> tuple[dict, int]:
    """(the header of the digest open as ``fd``, where its parts start); ValueError for a file that is not one."""
    head = os.pread(fd, _HEAD_READ, 0)
    start = _parts_start(head)
    if start > len(head):
        head = os.pread(fd, start, 0)
    return _header_of(head, start), start


def _parts_start(head: bytes) -> int:
    """Where the parts of the digest whose first bytes are ``head`` start (after the magic, the header's
    length and the header); ValueError for bytes that are not a digest."""
    if len(head) < len(_MAGIC) + 4 or head[: len(_MAGIC)] != _MAGIC:
        raise ValueError("not a ranksight digest")
    return len(_MAGIC) + 4 + int.from_bytes(head[len(_MAGIC) : len(_MAGIC) + 4], "little")


def _header_of(head: bytes, start: int) -> dict:
    """The JSON header in ``head`` (the digest's bytes up to ``start`` at least); ValueError where it is not an
    object (or cut short)."""
    import json

    header = json.loads(head[len(_MAGIC) + 4 : start])
    if not isinstance(header, dict):
        raise ValueError("its header is not an object")
    return header


def parquet_bytes(table) -> bytes:
    """``table`` as the node spool writes a step file (zstd Parquet), in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


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


_LARGE = ("steps",)
"""The parts of thousands of rows per file (the others have a few per rank)."""

_SCANNED_WHOLE = 2048
"""Rows per chunk from which a part's chunks (one or more per file) are scanned as they are (DuckDB's vector
is 2,048 rows)."""


def read_digest_parts(paths: list[str], parts, with_file: bool = False, threads: bool = True) -> dict:
    """{part: one pyarrow table of that part's rows in every file of ``paths``} (see ``read_digests``),
    each file opened once; on ``_READERS`` threads unless not ``threads``. Raises ``DigestError`` naming the
    first file that does not read."""
    import pyarrow as pa

    schema = digest_schema()
    tables: dict[str, list] = {part: [] for part in parts}
    rows_per_file: dict[str, list] = {part: [] for part in parts}

    def read_one(path: str) -> dict:
        try:
            found = _read_part_batches(path, parts)
            if "chunks" in found:
                found["chunks"] = _as_table(found["chunks"]).select([c for c, _ in COLUMNS])
            return found
        except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as exc:
            raise DigestError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc

    # Threads only for the large LZ4 parts, whose decompression lets go of the GIL: the small parts are read
    # by Python alone, where handing 1,250 small files between threads cost more than reading them in turn
    # (the rollup's part; the verdict's sums and medians, 0.14 s in turn against 0.17-0.20 s on threads).
    for found in _in_path_order(read_one, paths, threads=threads and any(part in _LARGE for part in parts)):
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
    """One pyarrow table of the ``part`` tables (or record batches) of several digest files, as readers take
    it: a column some files left out (``SPARSE_PARTS``) NULL in their rows, one that all left out a column of
    NULLs (typed by the readers' SQL, which casts every column)."""
    import pyarrow as pa

    # Files of one schema (the common case) are joined as they are: unifying 1,250 schemas per part took
    # 0.05-0.09 s of a first verdict's reading at 10,000 ranks.
    first = tables[0].schema
    same = all(t.schema.equals(first) for t in tables)
    if same and all(isinstance(t, pa.RecordBatch) for t in tables):
        table = pa.Table.from_batches(tables, schema=first)
    else:
        tables = [_as_table(t) for t in tables]
        table = pa.concat_tables(tables) if same else pa.concat_tables(tables, promote_options="permissive")
    few_per_chunk = table.num_columns and table.num_rows < _SCANNED_WHOLE * table.column(0).num_chunks
    if few_per_chunk and part not in _KEPT_IN_CHUNKS:
        # DuckDB scans many small chunks far slower than the same rows in one; chunks of a vector's rows or
        # more scan as fast, and are not copied again.
        table = table.combine_chunks()
    for name in SPARSE_PARTS.get(part, ()):
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows))
    return table


_KEPT_IN_CHUNKS = ("steps",)
"""Parts left in their files' chunks: the readers merge the per-step part per step in one pass, reading the
chunks about as fast as one copy of them (at 10,000 ranks x 1,000 steps, 0.06 s against 0.05 s). Copied into
one chunk first, they touched 215 MB more memory, whose page faults the kernel charges as system time."""

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
