"""Compact a run's spool segments into one DuckDB file, without ever blocking a reader.

DuckDB lets one process write a database file and locks readers out meanwhile, so the store is
never written in place: ``ingest`` copies the current store (if any) to a dot-prefixed temporary
file, appends the segments it does not hold yet in one transaction, records their file names in
``_segments``, and renames the result over ``store.duckdb``. A reader that attached the old file
keeps reading it (its inode lives on); a new reader attaches the new one. Either way it pairs the
store with exactly the segments that store has not ingested, so no row is counted twice or missed.
Beside the rows, in the same transaction, the store keeps the summary relation of every step row it holds
(``_summary``), which the readers judge a finished run from.

Ingests of one run are serialised with an ``flock`` on ``.store.lock`` (a second one fails with a
clear message); a crash mid-ingest leaves only a temporary file, and the store stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from ranksight.format.digest import remove_digests
from ranksight.format.schema import DUCKDB_TYPES, KINDS, SCHEMA_VERSION, TMP_PREFIX, column_names, duckdb_columns

from ._rundir import (
    LOCK_NAME,
    NODE_STORES_DIR,
    STORE_NAME,
    RunDirError,
    SkippedFile,
    StoreError,
    check_run_dir,
    duckdb_run_path,
    first_line,
    is_listed,
    node_store_paths,
    quarantine_path,
    store_path,
    warn_skipped,
)
from ._segment_checks import one_schema, scan_segments
from ._summary import SUMMARY_TABLES, holds_relation, relation_for_store, summary_key
from ._tables import (
    SEGMENT_COLUMN,
    SEGMENTS_TABLE,
    attach_store,
    ingested_segments,
    quiet_connection,
    select_list,
    sql_list,
    sql_literal,
    store_tables,
)

log = logging.getLogger("ranksight")

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
    quarantined: tuple = ()  # SkippedFile per segment it could not read: moved to <run>/quarantine/<kind>/


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

    try:
        fd = os.open(os.path.join(run_path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError as exc:
        raise RunDirError(f"{run_path}: cannot write the store here ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise RunDirError(f"{run_path}: another `ranksight ingest` is compacting this run; try again") from None
        raise
    return fd


def _open_store(path: str, shown: str):
    """A read-only connection on a store file, checked to be ours; StoreError (one line, naming ``shown``) if not.

    A store that is not ours is never written or pruned against: it may be a damaged copy of the one
    holding rows whose segments were pruned already, and rebuilding over it would lose them.
    """
    con = quiet_connection()
    try:
        attach_store(con, path, _STORE_DB, shown, "the run's store", _MOVE_ASIDE)
        con.execute(f"USE {_STORE_DB}")
    except BaseException:
        con.close()
        raise
    return con


_STORE_DB = "ranksight_store_file"


_MOVE_ASIDE = "move it aside, then ingest again"


def ingest(run_path: str, *, absorb_node_stores: bool = False) -> IngestResult:
    """Append the run's not-yet-ingested spool segments to ``<run>/store.duckdb`` and return counts.

    ``absorb_node_stores`` also appends the rows of the per-node stores in ``<run>/nodes/`` (those of
    segments the store does not hold yet), then moves each absorbed file to ``<run>/nodes/.absorbed/``:
    one store to read instead of one per node. Until it is moved, readers skip the rows
    the store already holds, so a crash between the two counts nothing twice.

    Safe while ranks are still writing (segments that appear later are picked up by the next ingest
    and, until then, read from the spool) and while any number of readers query the run. A segment it
    cannot read is moved to ``<run>/quarantine/<kind>/`` (kept, never deleted) and listed in the
    result's ``quarantined``, with one warning line each; no row is stored without its identity.
    """
    check_run_dir(run_path)
    started = time.perf_counter()
    target = store_path(run_path)
    lock_fd = _locked(run_path)
    try:
        db_run = duckdb_run_path(run_path)
        if os.path.exists(target):
            _open_store(store_path(db_run), target).close()  # ours? checked before copying it
        with _next_store(run_path, db_run) as work:
            con = _connect(work, target)
            try:
                had_tables = store_tables(con, _STORE_DB)
                before = _held_before(con, had_tables)
                _create_schema(con)
                absorbed, node_rows = _absorb_node_stores(con, run_path, db_run) if absorb_node_stores else ([], {})
                if node_rows.get("steps"):  # rows no relation holds, and no digest
                    before = "rows"
                rows_by_kind, added, quarantined = _append_pending(con, run_path, db_run, had_tables, before)
                for kind, n in node_rows.items():
                    rows_by_kind[kind] = rows_by_kind.get(kind, 0) + n
                con.execute(f"CHECKPOINT {_STORE_DB}")
                con.execute("USE memory")
                con.execute(f"DETACH {_STORE_DB}")  # written out in full before the rename
            finally:
                con.close()
        for path, signature in absorbed:  # in the store now: out of the readers' way
            _set_aside(path, signature)
    finally:
        os.close(lock_fd)
    seconds = time.perf_counter() - started
    return IngestResult(target, added, sum(rows_by_kind.values()), rows_by_kind, seconds, tuple(quarantined))


@contextlib.contextmanager
def _next_store(run_path: str, db_run: str):
    """Yield the path (for DuckDB) of a copy of the current store, or of no file yet; when the block ends
    without an error, rename it over ``store.duckdb``. The old store is never opened for writing, so its
    readers are never blocked; after an error it is left as it was.

    DuckDB cuts a database path at ``?`` when it names the write-ahead log, so under a run folder whose
    real path holds one the copy is built in a private temporary folder and copied back before the rename.
    """
    target = store_path(run_path)
    tmp_name = f"{TMP_PREFIX}{STORE_NAME}.{os.getpid()}"
    tmp = os.path.join(run_path, tmp_name)
    build_dir = tempfile.mkdtemp(prefix="ranksight-ingest-") if "?" in os.path.realpath(run_path) else None
    work = os.path.join(build_dir, STORE_NAME) if build_dir else tmp
    try:
        if os.path.exists(target):
            shutil.copyfile(target, work)
        elif os.path.exists(work):
            os.remove(work)
        yield work if build_dir else os.path.join(db_run, tmp_name)
        if build_dir:
            shutil.copyfile(work, tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # gone after the rename; after an error, the half-built copy
        if build_dir:
            shutil.rmtree(build_dir, ignore_errors=True)


def _connect(path: str, shown: str):
    """A connection whose current database is the store's temporary copy at ``path``, for writing: attached
    rather than opened, as ``duckdb.connect(path)`` resolves links, and a run folder named with ``\\`` or ``?``
    is reached through one (``duckdb_run_path``)."""
    import duckdb

    con = quiet_connection()
    try:
        con.execute(f"ATTACH {sql_literal(path)} AS {_STORE_DB}")
        con.execute(f"USE {_STORE_DB}")
    except BaseException as exc:
        con.close()
        if isinstance(exc, duckdb.Error):
            raise RunDirError(f"{shown}: cannot write the store here ({first_line(exc)})") from None
        raise
    # Every reader aggregates or orders what it reads, so the store keeps no row order: DuckDB then reads
    # the segments into the table without re-sequencing them (less CPU).
    con.execute("SET preserve_insertion_order = false")
    return con


def _append_pending(
    con, run_path: str, db_run: str, had_tables: set[str], before: str
) -> tuple[dict[str, int], int, list[SkippedFile]]:
    """Append every readable segment the store does not hold, in one transaction; quarantine the others.

    A segment whose footer reads but whose pages do not decode fails the whole INSERT: then each pending
    segment is read in full once, the ones that fail are quarantined too, and the rest is appended. A
    segment listed for a kind the store had no table for (an older store) is not held: it is appended.
    """
    import duckdb

    listed = con.execute(f"SELECT kind, file FROM {SEGMENTS_TABLE}").fetchall()
    known = {(k, f) for k, f in listed if k in had_tables} | _held_by_node_stores(con, run_path, db_run)
    pending: dict[str, list[str]] = {}
    single: set[str] = set()  # kinds whose pending segments' footers show one schema
    quarantined: list[SkippedFile] = []
    for kind in KINDS:
        held = frozenset(f for k, f in known if k == kind)  # in the store already: not read again
        good, bad = scan_segments(run_path, kind, held)
        pending[kind] = [os.path.basename(p) for p in good]
        if good and one_schema(good):
            single.add(kind)
        quarantined += [_quarantine(run_path, kind, b) for b in bad]
    try:
        rows_by_kind, added = _append(con, run_path, db_run, pending, single, before)
    except duckdb.Error:
        con.execute("ROLLBACK")
        for kind, name, reason in _undecodable(con, db_run, pending):
            pending[kind].remove(name)
            quarantined.append(_quarantine(run_path, kind, SkippedFile(os.path.join(run_path, kind, name), reason)))
        try:
            rows_by_kind, added = _append(con, run_path, db_run, pending, single, before)
        except duckdb.Error as exc:
            raise RunDirError(f"{run_path}: ingest failed, the store is unchanged ({first_line(exc)})") from None
    return rows_by_kind, added, quarantined


def _append(
    con, run_path: str, db_run: str, pending: dict[str, list[str]], single: set[str], before: str
) -> tuple[dict[str, int], int]:
    rows_by_kind: dict[str, int] = {}
    added = 0
    con.execute("BEGIN TRANSACTION")
    for kind, names in pending.items():
        if not names:
            continue
        files = [os.path.join(db_run, kind, name) for name in names]
        cols = ", ".join(column_names(kind))
        # Row counts from the Parquet footers: no second pass over the data.
        counts = dict(
            con.execute("SELECT parse_filename(file_name), num_rows FROM parquet_file_metadata(?)", [files]).fetchall()
        )
        # One schema: DuckDB binds the files as one instead of each by its names (4 % of ingest's time).
        source = f"read_parquet(?, union_by_name={'false' if kind in single else 'true'}, filename=true)"
        con.execute(
            f"INSERT INTO {kind} ({cols}, {SEGMENT_COLUMN}) "
            f"SELECT {select_list(con, source, kind, [files])}, parse_filename(filename) FROM {source}",
            [files],
        )
        # One statement for all the segments: an INSERT per segment costs more the more segments (read_side_history.md).
        con.execute(
            f"INSERT INTO {SEGMENTS_TABLE} SELECT ?, unnest(?), unnest(?), ?",
            [kind, names, [int(counts.get(name, 0)) for name in names], time.time_ns()],
        )
        rows_by_kind[kind] = int(sum(counts.values()))
        added += len(files)
    _keep_summary(con, [os.path.join(run_path, "steps", name) for name in pending.get("steps", [])], before)
    con.execute("COMMIT")
    return rows_by_kind, added


def _keep_summary(con, added: list[str], before: str) -> None:
    """Keep the summary relation of every step row the store holds (``_summary``: per rank and warm-up flag its
    sums, its medians, per step the comparisons across ranks): a finished run's readers read it instead of the
    rows. ``before``: what held the rows the store had (``_held_before``); ``added``: the step files appended."""
    tables, drops = relation_for_store(con, before, added, _rows_of_segments)
    for part, table in zip(("sums", "medians", "steps"), tables):  # temp tables: none reads the store's relation
        con.execute(f"CREATE OR REPLACE TABLE {SUMMARY_TABLES[part]} AS SELECT * FROM {table}")
    for drop in drops:
        drop()
    con.execute("INSERT OR REPLACE INTO _store_meta VALUES ('summary_key', ?)", [summary_key()])


def _rows_of_segments(names: list[str]) -> str:
    """The store's step rows of the segments ``names``."""
    return f"(SELECT * FROM steps WHERE {SEGMENT_COLUMN} IN (SELECT unnest({sql_list(names)})))"


def _held_before(con, had_tables: set[str]) -> str:
    """What holds the store's step rows before this ingest: "none" (there are none), "relation" (its summary
    relation, under this code's definition) or "rows" (they alone: an older store's)."""
    if "steps" not in had_tables or not con.execute("SELECT count(*) FROM steps").fetchone()[0]:
        return "none"
    return "relation" if holds_relation(con, had_tables) else "rows"


def _held_by_node_stores(con, run_path: str, db_run: str) -> set[tuple[str, str]]:
    """(kind, segment) pairs the run's per-node stores hold (``<run>/nodes/*.duckdb``): ``open_run`` reads
    those rows from there, so a copy of the same segment in the spool must not be stored a second time."""

    held: set[tuple[str, str]] = set()
    for i, path in enumerate(node_store_paths(run_path)):
        alias = f"ranksight_ingest_node_{i}"
        _attach_node_store(con, db_run, path, alias)
        try:
            held |= {(kind, name) for kind, names in ingested_segments(con, alias).items() for name in names}
        finally:
            con.execute(f"DETACH {alias}")
    return held


def _attach_node_store(con, db_run: str, path: str, alias: str) -> None:
    """Attach one node's store read-only under ``alias`` (the path as the store's connection sees it)."""
    import duckdb

    try:
        store = os.path.join(db_run, NODE_STORES_DIR, os.path.basename(path))
        con.execute(f"ATTACH {sql_literal(store)} AS {alias} (READ_ONLY)")
    except duckdb.Error as exc:
        raise StoreError(f"{path}: cannot read this node's store ({first_line(exc)})") from None


ABSORBED_DIR = ".absorbed"


def _absorb_node_stores(con, run_path: str, db_run: str) -> tuple[list[tuple[str, tuple]], dict[str, int]]:
    """Append each node store's rows of segments the store does not hold, and list those segments as held;
    return ((path, (size, mtime)) of each node store absorbed, rows added per kind)."""

    absorbed: list[tuple[str, tuple]] = []
    rows: dict[str, int] = {}
    for i, path in enumerate(node_store_paths(run_path)):
        st = os.stat(path)
        alias = f"ranksight_absorb_{i}"
        _attach_node_store(con, db_run, path, alias)
        try:
            tables = store_tables(con, alias)
            if SEGMENTS_TABLE not in tables:
                raise StoreError(f"{path}: not a ranksight store (no {SEGMENTS_TABLE} table); move it out of nodes/")
            for kind in KINDS:
                if kind not in tables:
                    continue
                table = f"{alias}.{kind}"
                before = con.execute(f"SELECT count(*) FROM {kind}").fetchone()[0]
                con.execute(
                    f"INSERT INTO {kind} ({', '.join(column_names(kind))}, {SEGMENT_COLUMN}) "
                    f"SELECT {select_list(con, table, kind)}, {SEGMENT_COLUMN} FROM {table} "
                    f"WHERE {SEGMENT_COLUMN} IS NULL OR {SEGMENT_COLUMN} NOT IN "
                    f"(SELECT file FROM {SEGMENTS_TABLE} WHERE kind = ?)",
                    [kind],
                )
                rows[kind] = rows.get(kind, 0) + con.execute(f"SELECT count(*) FROM {kind}").fetchone()[0] - before
            con.execute(
                f"INSERT INTO {SEGMENTS_TABLE} SELECT n.kind, n.file, n.rows, n.ingested_ns "
                f"FROM {alias}.{SEGMENTS_TABLE} n ANTI JOIN {SEGMENTS_TABLE} s ON s.kind = n.kind AND s.file = n.file"
            )
        finally:
            con.execute(f"DETACH {alias}")
        absorbed.append((path, (st.st_size, st.st_mtime_ns)))
    return absorbed, rows


def _set_aside(path: str, signature: tuple) -> None:
    """Move an absorbed node store to ``nodes/.absorbed/`` unless it was replaced meanwhile (a newer copy
    holds rows the store does not: it stays, and readers take only those from it)."""
    try:
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != signature:
            return
        folder = os.path.join(os.path.dirname(path), ABSORBED_DIR)
        os.makedirs(folder, exist_ok=True)
        os.replace(path, os.path.join(folder, os.path.basename(path)))
    except OSError:
        pass  # left in place: readers skip what the store holds


def _undecodable(con, db_run: str, pending: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(kind, name, reason) of the pending segments whose data pages fail to decode, read one by one."""
    import duckdb

    out = []
    for kind, names in pending.items():
        for name in names:
            try:  # every column, every page: hashing forces each value to be decoded
                con.execute("SELECT bit_xor(hash(COLUMNS(*))) FROM read_parquet(?)", [os.path.join(db_run, kind, name)])
            except duckdb.Error as exc:
                out.append((kind, name, f"its data does not decode ({first_line(exc)})"))
    return out


def _quarantine(run_path: str, kind: str, skipped: SkippedFile) -> SkippedFile:
    """Move a segment ingest cannot read to ``<run>/quarantine/<kind>/`` (same filesystem: a rename),
    so no reader trips on it again and nothing is deleted; one warning line says where it went."""
    target = quarantine_path(run_path, kind, os.path.basename(skipped.path))
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(skipped.path, target)
        moved = SkippedFile(skipped.path, skipped.reason, target)
    except OSError as exc:
        moved = SkippedFile(skipped.path, f"{skipped.reason}; left in place, moving it failed ({exc.strerror})")
    warn_skipped(moved)
    return moved


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
    check_run_dir(run_path)
    target = store_path(run_path)
    if not os.path.exists(target):
        raise RunDirError(f"{run_path}: no store to prune against yet (run `ranksight ingest` first)")
    lock_fd = _locked(run_path)
    try:
        with _open_store(store_path(duckdb_run_path(run_path)), target) as con:
            listed = con.execute(f"SELECT kind, file, ingested_ns FROM {SEGMENTS_TABLE}").fetchall()
        cutoff = time.time_ns() - int(older_than_s * 1e9)
        files = nbytes = recent = 0
        for kind, name, ingested_ns in listed:
            path = os.path.join(run_path, kind, name)
            if kind not in KINDS or not is_listed(name) or os.path.basename(name) != name:
                continue  # never follow a name out of the run's spool folders
            if ingested_ns > cutoff:
                recent += os.path.exists(path)
                continue
            try:
                size = os.path.getsize(path)
                os.remove(path)
            except FileNotFoundError:
                continue  # pruned before
            if kind == "steps":
                remove_digests(os.path.join(run_path, kind), name)  # the store keeps the relation of its rows
            files += 1
            nbytes += size
    finally:
        os.close(lock_fd)
    return PruneResult(files, nbytes, recent)
