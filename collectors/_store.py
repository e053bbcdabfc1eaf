"""Compact a run's spool segments into one DuckDB file, without ever blocking a reader.

DuckDB lets one process write a database file and locks readers out meanwhile, so the store is
never written in place: ``ingest`` copies the current store (if any) to a dot-prefixed temporary
file, appends the segments it does not hold yet in one transaction, records their file names in
``_segments``, and renames the result over ``store.duckdb``. A reader that attached the old file
keeps reading it (its inode lives on); a new reader attaches the new one. Either way it pairs the
store with exactly the segments that store has not ingested, so no row is counted twice or missed.

Ingests of one run are serialised with an ``flock`` on ``.store.lock`` (a second one fails with a
clear message); a crash mid-ingest leaves only a temporary file, and the store stays as it was.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass

from ranksight.schema import DUCKDB_TYPES, KINDS, SCHEMA_VERSION, TMP_PREFIX, column_names, duckdb_columns

from ._rundir import (
    LOCK_NAME,
    STORE_NAME,
    RunDirError,
    check_run_dir,
    is_segment_name,
    segment_files,
    store_path,
)
from ._tables import SEGMENT_COLUMN, SEGMENTS_TABLE, select_list

PRUNE_AFTER_S = 60.0
"""Default age (since ingest) before ``prune`` deletes a segment: queries that listed the file just
before it was ingested have this long to finish reading it."""


@dataclass(frozen=True)
class IngestResult:
    """What one ingest did."""

    store_path: str
    segments: int  # segments added by this ingest
    rows: int  # rows added by this ingest
    rows_by_kind: dict
    seconds: float


def _create_schema(con) -> None:
    for kind in KINDS:
        con.execute(f"CREATE TABLE IF NOT EXISTS {kind} ({duckdb_columns(kind)})")
        # A store written by an older version lacks newer (nullable) columns: add them, rows keep NULL.
        for column in KINDS[kind]:
            con.execute(f"ALTER TABLE {kind} ADD COLUMN IF NOT EXISTS {column.name} {DUCKDB_TYPES[column.type]}")
        con.execute(f"ALTER TABLE {kind} ADD COLUMN IF NOT EXISTS {SEGMENT_COLUMN} VARCHAR")
    con.execute(
        f"CREATE TABLE IF NOT EXISTS {SEGMENTS_TABLE} "
        "(kind VARCHAR NOT NULL, file VARCHAR NOT NULL, rows BIGINT NOT NULL, ingested_ns BIGINT NOT NULL)"
    )
    con.execute("CREATE TABLE IF NOT EXISTS _store_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT OR REPLACE INTO _store_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])


def _locked(run_path: str):
    """Take the run's ingest lock or raise RunDirError (another ingest is running)."""
    import fcntl

    fd = os.open(os.path.join(run_path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise RunDirError(f"{run_path}: another `ranksight ingest` is compacting this run; try again") from None
        raise
    return fd


def ingest(run_path: str) -> IngestResult:
    """Append the run's not-yet-ingested spool segments to ``<run>/store.duckdb`` and return counts.

    Safe while ranks are still writing (segments that appear later are picked up by the next ingest
    and, until then, read from the spool) and while any number of readers query the run.
    """
    import duckdb

    check_run_dir(run_path)
    started = time.perf_counter()
    target = store_path(run_path)
    try:
        lock_fd = _locked(run_path)
    except PermissionError as exc:
        raise RunDirError(f"{run_path}: cannot write the store here ({exc.strerror})") from None
    tmp = os.path.join(run_path, f"{TMP_PREFIX}{STORE_NAME}.{os.getpid()}")
    try:
        if os.path.exists(target):
            shutil.copyfile(target, tmp)  # the old store is never opened for writing: readers stay unblocked
        elif os.path.exists(tmp):
            os.remove(tmp)
        con = duckdb.connect(tmp)
        try:
            _create_schema(con)
            known = {(k, f) for k, f in con.execute(f"SELECT kind, file FROM {SEGMENTS_TABLE}").fetchall()}
            rows_by_kind: dict[str, int] = {}
            added = 0
            con.execute("BEGIN TRANSACTION")
            for kind in KINDS:
                files = [p for p in segment_files(run_path, kind) if (kind, os.path.basename(p)) not in known]
                if not files:
                    continue
                cols = ", ".join(column_names(kind))
                # Row counts from the Parquet footers: no second pass over the data.
                per_file = con.execute(
                    "SELECT parse_filename(file_name), num_rows FROM parquet_file_metadata(?)", [files]
                ).fetchall()
                counts = dict(per_file)
                source = "read_parquet(?, union_by_name=true, filename=true)"
                con.execute(
                    f"INSERT INTO {kind} ({cols}, {SEGMENT_COLUMN}) "
                    f"SELECT {select_list(con, source, kind, [files])}, parse_filename(filename) FROM {source}",
                    [files],
                )
                now = time.time_ns()
                con.executemany(
                    f"INSERT INTO {SEGMENTS_TABLE} VALUES (?, ?, ?, ?)",
                    [(kind, os.path.basename(p), int(counts.get(os.path.basename(p), 0)), now) for p in files],
                )
                rows_by_kind[kind] = int(sum(counts.values()))
                added += len(files)
            con.execute("COMMIT")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, target)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(lock_fd)
    return IngestResult(target, added, sum(rows_by_kind.values()), rows_by_kind, time.perf_counter() - started)


@dataclass(frozen=True)
class PruneResult:
    """What one prune deleted."""

    files: int
    bytes: int
    kept_recent: int  # ingested segments younger than the grace period, left in place


def prune(run_path: str, older_than_s: float = PRUNE_AFTER_S) -> PruneResult:
    """Delete spool segments the store holds, once they were ingested ``older_than_s`` ago.

    Only what the store's ``_segments`` table lists is touched, so nothing that is not in the store can
    go. Holds the ingest lock meanwhile (an ingest running elsewhere makes this fail, clearly).
    """
    import duckdb

    check_run_dir(run_path)
    target = store_path(run_path)
    if not os.path.exists(target):
        raise RunDirError(f"{run_path}: no store to prune against yet (run `ranksight ingest` first)")
    lock_fd = _locked(run_path)
    try:
        with duckdb.connect(target, read_only=True) as con:
            listed = con.execute(f"SELECT kind, file, ingested_ns FROM {SEGMENTS_TABLE}").fetchall()
        cutoff = time.time_ns() - int(older_than_s * 1e9)
        files = nbytes = recent = 0
        for kind, name, ingested_ns in listed:
            path = os.path.join(run_path, kind, name)
            if kind not in KINDS or not is_segment_name(name) or os.path.basename(name) != name:
                continue  # never follow a name out of the run's spool folders
            if ingested_ns > cutoff:
                recent += os.path.exists(path)
                continue
            try:
                size = os.path.getsize(path)
                os.remove(path)
            except FileNotFoundError:
                continue  # pruned before
            files += 1
            nbytes += size
    finally:
        os.close(lock_fd)
    return PruneResult(files, nbytes, recent)
