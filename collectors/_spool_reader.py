"""Query a run directory's spool with DuckDB while ranks are still writing it.

Each record kind becomes a view over ``<run>/<kind>/[!.]*.parquet``. Segments appear by atomic rename,
so a query sees whole files only; temporary files start with a dot and never match the glob. Views
are read-only and take no lock, so any number of readers run beside the writers.

A segment that cannot be read (empty, truncated, not Parquet, another schema) is left out of the
views with one warning line, and ``Run.skipped`` lists it, so one bad file costs neither the
rest of the run nor a traceback.
"""

from __future__ import annotations

import os
import time

from ranksight.format.schema import KINDS, duckdb_columns

from ._rundir import (
    NODE_STORES_DIR,
    SkippedFile,
    check_run_dir,
    duckdb_run_path,
    is_listed,
    node_store_paths,
    segment_glob,
    store_path,
    warn_skipped,
)
from ._runs import rank_is_live, read_rank_meta
from ._segment_checks import one_schema, scan_segments, segment_columns
from ._summary import Sources, holds_relation
from ._tables import (
    SEGMENT_COLUMN,
    SEGMENTS_TABLE,
    STORE_ALIAS,
    attach_store,
    describe,
    ingested_segments,
    quiet_connection,
    select_list,
    sql_list,
    sql_literal,
    store_tables,
)


def open_views(
    con, run_path: str, *, reopened: bool, follow_spool: bool = True, incremental: bool = False
) -> tuple[list[SkippedFile], Sources]:
    """Make one view per record kind over the run's records on ``con`` (what they read, and the arguments: see
    ``open_run``); return the segments left out and what the ``steps`` view reads (``Sources``, for its summary
    relation, ``_summary``)."""
    check_run_dir(run_path)
    db_run = duckdb_run_path(run_path)
    store_kinds = _attach_store(con, run_path, db_run)
    ingested = ingested_segments(con, STORE_ALIAS) if store_kinds is not None else {}
    nodes = _attach_node_stores(con, run_path, db_run)
    quiet = store_kinds is not None and _no_rank_writing(run_path)
    skipped: list[SkippedFile] = []
    sources = Sources([], store=store_kinds is not None and "steps" in store_kinds, node_stores=bool(nodes))
    for kind in KINDS:
        parts = []
        if store_kinds is not None and kind in store_kinds:
            # The schema's columns (NULL for those an older store lacks), not the store's own ``_segment``.
            parts.append(f"SELECT {select_list(con, f'{STORE_ALIAS}.{kind}', kind)} FROM {STORE_ALIAS}.{kind}")
        # A kind the store has no table for (an older store) holds none of its rows, whatever it lists.
        done = None if store_kinds is None else set(ingested.get(kind, ())) if kind in store_kinds else set()
        for alias, kinds, held in nodes:
            if kind in kinds:
                # A segment is read from one place only: the run's store first (it may have absorbed this
                # node store, or ingested a copy of the node's spool), then the node store, then the spool.
                where = ""
                if store_kinds is not None:
                    where = (
                        f" WHERE {SEGMENT_COLUMN} IS NULL OR {SEGMENT_COLUMN} NOT IN "
                        f"(SELECT file FROM {STORE_ALIAS}.{SEGMENTS_TABLE} WHERE kind = {sql_literal(kind)})"
                    )
                parts.append(f"SELECT {select_list(con, f'{alias}.{kind}', kind)} FROM {alias}.{kind}{where}")
                done = (done or set()) | set(held.get(kind, ()))
        spool, left_out, pending = _spool_part(con, run_path, db_run, kind, done, quiet, follow_spool, incremental)
        skipped += left_out
        if kind == "steps":
            sources.pending = pending
            sources.files_only = not follow_spool and not parts  # the view names exactly these files
        if spool:
            parts.append(spool)
        if reopened:  # a re-opened connection may hold the other kind of object under this name
            _drop(con, kind)
        if parts:
            con.execute(f"CREATE VIEW {kind} AS " + " UNION ALL ".join(parts))
        else:
            con.execute(f"CREATE TABLE {kind} ({duckdb_columns(kind)})")
    for item in skipped:
        warn_skipped(item)
    sources.store_summary = sources.store and holds_relation(con, store_tables(con, STORE_ALIAS), STORE_ALIAS)
    return skipped, sources


def reading_connection():
    """A new DuckDB connection for a run's views.

    A spool's files never change once published: DuckDB may keep their footers for the connection's next
    queries (a verdict asks a dozen over the same files) instead of parsing them again each time."""
    import duckdb

    con = quiet_connection()
    try:
        con.execute("SET parquet_metadata_cache = true")
    except duckdb.Error:  # a DuckDB without the setting reads the footers again: slower, same rows
        pass
    return con


def _spool_part(
    con, run_path: str, db_run: str, kind: str, ingested: set[str] | None, quiet: bool, follow: bool, incremental: bool
) -> tuple[str | None, list[SkippedFile], list[str]]:
    """(the SELECT over a kind's spool segments the store has not ingested, or None; the segments left out; the
    readable pending segments, as DuckDB opens them).

    ``ingested`` is None without a store. Each pending segment's footer is checked once per process
    (``scan_segments``); segments the store holds are not read at all. Then, with ``follow`` and every
    segment readable, the view globs the folder (minus the ingested names), so segments written after
    ``open_run`` show up in the next query. Otherwise it names the readable pending segments: one bad file
    in a glob fails the whole query, and DuckDB opens every file a glob lists to bind it, ingested ones
    included, which a concurrent ``prune`` may be deleting.
    """
    done = frozenset(ingested or ())
    pending, bad = scan_segments(run_path, kind, done, con)
    paths = [os.path.join(db_run, kind, os.path.basename(p)) for p in pending]
    # A finished (or long silent) run whose segments are all in the store reads the store alone:
    # no segment can arrive any more, and a UNION with an empty spool scan makes queries ~2x slower.
    if quiet and not pending:
        return None, bad, paths
    if follow and not bad and (pending or (done and _any_segment(run_path, kind))):
        spool = _globbed(con, db_run, kind, done, None if done else segment_columns(pending))
        if spool is not None:
            return spool, [], paths
    if not pending:
        return None, bad, paths
    # One schema: DuckDB reads the files as one (by name still) instead of binding each at every query.
    source = f"read_parquet({sql_list(paths)}, union_by_name={'false' if one_schema(pending) else 'true'})"
    select = f"SELECT {select_list(con, source, kind, present=segment_columns(pending))} FROM {source}"
    if (
        not incremental  # a reading refreshed again and again would read every row at each refresh
        and not follow
        and len(pending) >= MATERIALIZE_FROM_FILES
        and _total_bytes(pending) <= MATERIALIZE_MAX_BYTES
    ):
        # One reading, many queries (diagnose runs a dozen): read many small segments once, into memory,
        # rather than every query opening every file again.
        table = f"{PENDING_PREFIX}{kind}"
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
        con.execute(f"CREATE TEMP TABLE {table} AS {select}")  # temp: never in a database the caller attached
        return f"SELECT * FROM temp.{table}", bad, paths
    return select, bad, paths


MATERIALIZE_MAX_BYTES = 128 * 1024 * 1024
"""With ``follow_spool=False``, pending segments up to this much Parquet (~1.7 M step rows, ~550 MB in
memory) are read once at open into a table of the connection; more stay a view read at each query."""
MATERIALIZE_FROM_FILES = 256
"""... and only from this many pending segments: it is the per-file cost of every query that reading once saves."""
PENDING_PREFIX = "_pending_"


def _total_bytes(paths: list[str]) -> int:
    total = 0
    for path in paths:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def _globbed(con, db_run: str, kind: str, ingested: frozenset, columns: frozenset | None) -> str | None:
    """The SELECT over the kind's segment glob minus the ingested ones, or None when the glob does not
    bind (a segment the store holds was damaged after it was ingested: its footer was not checked).

    ``columns``: what the footers already read say the listed segments hold, when none was ingested; else
    DuckDB reads every footer of the glob to bind it (a second reading).
    """
    import duckdb

    source = f"read_parquet({sql_literal(segment_glob(db_run, kind))}, union_by_name=true, filename=true)"
    if columns is not None:
        return f"SELECT {select_list(con, source, kind, present=columns)} FROM {source}"
    try:
        spool = f"SELECT {select_list(con, source, kind, present=describe(con, source))} FROM {source}"
    except duckdb.Error:
        return None
    if ingested:
        # Constants, not a subquery: the attached store is fixed for this connection, and a
        # constant list lets DuckDB skip the ingested files instead of reading and dropping them.
        spool += f" WHERE parse_filename(filename) NOT IN ({', '.join(sql_literal(f) for f in sorted(ingested))})"
    return spool


def _any_segment(run_path: str, kind: str) -> bool:
    """Whether the kind's spool folder holds a segment at all (ingested or not): while a rank may write,
    the view keeps globbing it so that new segments show up in the next query."""
    try:
        with os.scandir(os.path.join(run_path, kind)) as entries:
            return any(is_listed(e.name) for e in entries)
    except OSError:
        return False


def _no_rank_writing(run_path: str) -> bool:
    """True when no rank may still write segments: each ended, or went silent (see ``LIVE_FLUSHES``)."""
    now = time.time_ns()
    return not any(rank_is_live(meta, now) for meta in read_rank_meta(run_path))


def _drop(con, name: str) -> None:
    found = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_name = ? AND table_schema = 'main'"
        " AND table_catalog = current_database()",
        [name],
    ).fetchall()
    if found:
        con.execute(f"DROP {'VIEW' if found[0][0] == 'VIEW' else 'TABLE'} {name}")


def _attach_store(con, run_path: str, db_run: str) -> set[str] | None:
    """Attach a run's store read-only (it is replaced by rename, never written in place) and return the
    record kinds it holds; None without a store. Raises StoreError for a file that is not our store."""
    path = store_path(run_path)
    if not os.path.exists(path):
        return None
    tables = attach_store(con, store_path(db_run), STORE_ALIAS, path, "the run's store", _MOVE_ASIDE)
    return {kind for kind in KINDS if kind in tables}


def _attach_node_stores(con, run_path: str, db_run: str) -> list[tuple[str, set[str], dict[str, list[str]]]]:
    """Attach each per-node store (``<run>/nodes/*.duckdb``) read-only: (alias, kinds it holds, the segment
    names it holds per kind). One that is not our store raises StoreError, as the run's own store does."""
    out = []
    for i, path in enumerate(node_store_paths(run_path)):
        alias = f"{NODE_ALIAS}{i}"
        shown = os.path.join(db_run, NODE_STORES_DIR, os.path.basename(path))
        tables = attach_store(con, shown, alias, path, "this node's store", _MOVE_NODE)
        out.append((alias, {k for k in KINDS if k in tables}, ingested_segments(con, alias)))
    return out


NODE_ALIAS = "ranksight_node_"
_MOVE_NODE = "move it out of the run's nodes/ folder"
_MOVE_ASIDE = "move it aside to read the run's spool segments alone"
