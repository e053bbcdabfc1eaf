"""The verdict's digest parts of a spool's step files, merged into one row per key and kept between readers.

Why: a live dashboard diagnoses the same run again and again while the node spool adds files. Each time, the
readers read every file's ``steps`` part (a row per step and file: 1.28 M rows at 1,024 ranks x 10,000
steps) and merge it per step, twice. A digest file never changes once it is in place (it is written
under a temporary name and renamed), and the parts' rows merge exactly in any grouping
(``ranksight.format.verdict_digest.merge_part_sql``). So this process keeps each part merged over the files it has
read -- 10,000 rows for that ``steps`` part -- and a later reader reads and merges only the files added
since. A file that is gone or differs (pruned after ``ingest``, rewritten) makes the merge start again from
every file; the readers' queries read a merged part as they read the files' rows.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ranksight.format.digest_file import DigestError, read_digest_parts
from ranksight.format.verdict_digest import merge_part_sql

KEPT_FOLDS = 8
"""(Digest folder, part) merges kept in a process, least recently used dropped first: a dashboard compares
two runs at most, each with three parts (``steps`` merged is a row per step)."""

_lock = threading.Lock()  # readers only (dashboard threads): never taken on a training thread
_folds: OrderedDict[tuple[str, str], KeptPart] = OrderedDict()


@dataclass(frozen=True)
class KeptPart:
    """One part of the files read so far, as this process keeps it."""

    files: dict[str, tuple[int, int, int]]  # path -> (inode, size, mtime_ns) when read
    table: object  # pyarrow.Table: the part's rows of ``files`` (merged per key: see ``_merges``)
    derived: dict = field(default_factory=dict)  # what readers found from ``table`` alone: valid while it is kept


def _merges(part: str, kept: KeptPart | None, files: int) -> bool:
    """Whether a build of ``files`` new files merges the part's rows per key. ``steps`` when adding to a kept
    build, or read in one batch: every reader merges it per step, and at 1,024 ranks 1.28 M rows become
    10,000; more files were merged batch by batch as they were read (``_read_merging``), and their batches'
    rows (a row per step and batch of ``MERGE_BATCH`` files) are kept as they are: one merge more of them
    was 0.013 s of a first verdict at 10,000 ranks, which the readers' own GROUP BY makes needless. The
    small parts only when adding files to a kept build: a first build keeps the files' rows as read (merging
    them would be one more pass over all of them, and readers group them anyway); later files then merge
    into one row per key, so what is kept stops growing with the files. Never ``medians``: its rows are each
    file's own, and whether two files hold one (rank, figure) is what its reader asks (a row per rank and
    figure of each file: small)."""
    if part == "medians":
        return False
    if part == "steps":
        return kept is not None or files <= MERGE_BATCH
    return kept is not None


def folded_parts(con, paths: list[str], parts: tuple[str, ...]) -> dict[str, KeptPart]:
    """{part: the ``KeptPart`` whose table stands for that part's rows in every file of ``paths``}, merged as
    ``_merges`` says (readers group the rows either way). Reads only the files this process has not merged
    yet; raises ``DigestError`` (from ``read_digest_parts``) naming the first one that does not read, and
    then keeps nothing of that call. Merges on a cursor of ``con``: a database of its own would start its
    own threads for one query."""
    if not paths:
        raise DigestError("no digest files")
    signatures = {p: _signature(p) for p in paths}
    folder = os.path.dirname(paths[0])
    with _lock:
        by_fresh: dict[tuple[str, ...], list[str]] = {}  # files to read -> the parts that lack just those
        kept = {}
        for part in parts:
            kept[part] = _reusable(_folds.get((folder, part)), signatures)
            fresh = tuple(p for p in paths if kept[part] is None or p not in kept[part].files)
            by_fresh.setdefault(fresh, []).append(part)
        out = {}
        for fresh, group in by_fresh.items():
            read = _read_merging(con, list(fresh), tuple(group)) if fresh else {}
            for part in group:
                fold = kept[part]
                if not fresh:
                    out[part] = fold
                    continue
                rows = read[part] if fold is None else [fold.table, read[part]]
                if _merges(part, fold, len(fresh)):
                    rows = _merged(con, part, rows)
                elif isinstance(rows, list):
                    rows = _concat(rows)
                out[part] = KeptPart(signatures, rows)
        for part in parts:  # only once every part read: a file that does not read keeps nothing of the call
            _folds[(folder, part)] = out[part]
            _folds.move_to_end((folder, part))
        while len(_folds) > KEPT_FOLDS:
            _folds.popitem(last=False)
    return out


MERGE_BATCH = 128
"""Files whose ``steps`` part is read and merged per step at a time (``_read_merging``): 11 MB at a time at
10,000 ranks x 1,000 steps."""


def _read_merging(con, paths: list[str], parts: tuple[str, ...]) -> dict:
    """``read_digest_parts(paths, parts)``, the ``steps`` part merged per step every ``MERGE_BATCH`` files.
    Why: a fresh process reading every file's per-step part (110 MB at 10,000 ranks x 1,000 steps) into
    fresh memory paid the kernel's page faults for each page of it; merged batch by batch, the memory of one
    batch is freed before the next is read, and the merge rules hold in any grouping (``merge_part_sql``).
    The other parts are kept as read. The files are read in turn on this thread: the memory a batch frees is
    then the next one's (threads each took fresh memory: 0.25 s with 0.14 s of system time against 0.17 s
    and 0.03 s for 1,250 files' three parts, cpu_scale_history.md "Scale v5")."""
    if "steps" not in parts or len(paths) <= MERGE_BATCH:
        return read_digest_parts(paths, parts)
    from concurrent.futures import Future, ThreadPoolExecutor

    pieces: dict[str, list] = {part: [] for part in parts}
    # A batch is merged (DuckDB, outside the GIL) on a thread of its own while the next is read (Python).
    with ThreadPoolExecutor(1, thread_name_prefix="ranksight-merge") as merger:
        for at in range(0, len(paths), MERGE_BATCH):  # in path order: the first file that does not read is named
            for part, table in read_digest_parts(paths[at : at + MERGE_BATCH], parts, threads=False).items():
                pieces[part].append(merger.submit(_merged, con, part, table) if part == "steps" else table)
    return {part: _concat([t.result() if isinstance(t, Future) else t for t in ts]) for part, ts in pieces.items()}


def forget() -> None:
    """Drop every kept merge (tests; a process that wants its memory back)."""
    with _lock:
        _folds.clear()


def _signature(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1, 0)  # read will fail and say why; never equal to a file that was there
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _reusable(fold: KeptPart | None, signatures: dict) -> KeptPart | None:
    """``fold`` when every file it merged is still among ``signatures``, unchanged; else None."""
    if fold is None or any(signatures.get(p) != s for p, s in fold.files.items()):
        return None
    return fold


def null_columns(table) -> frozenset[str]:
    """The columns of a pyarrow ``table`` of NULL type: those every digest file it joins left out
    (``concat_part``), which a merge leaves NULL without aggregating them (``merge_steps_sql``'s ``absent``)."""
    import pyarrow as pa

    return frozenset(f.name for f in table.schema if pa.types.is_null(f.type))


def _concat(tables: list):
    import pyarrow as pa

    return pa.concat_tables(tables, promote_options="permissive")


def _merged(con, part: str, tables):
    """One pyarrow table: the rows of ``tables`` (one table or several of one schema) merged per key."""
    import pyarrow as pa

    source = tables if isinstance(tables, pa.Table) else pa.concat_tables(tables, promote_options="permissive")
    cur = con.cursor()
    try:
        cur.register("_ranksight_part", source)
        result = cur.sql(merge_part_sql(part, "_ranksight_part", null_columns(source)))
        return (getattr(result, "to_arrow_table", None) or result.arrow)()  # DuckDB 2's name, and 1.x's
    finally:
        cur.close()
