"""Query a run directory's spool with DuckDB while ranks are still writing it.

Each record kind becomes a view over ``<run>/<kind>/[!.]*.parquet``. Segments appear by atomic rename,
so a query sees whole files only; temporary files start with a dot and never match the glob. Views
are read-only and take no lock, so any number of readers run beside the writers.
"""

from __future__ import annotations

import glob
import os
import time

from ranksight.schema import KINDS, duckdb_columns

from ._rundir import RunDirError, check_run_dir, read_rank_meta, segment_glob, store_path
from ._runs import rank_is_live
from ._tables import STORE_ALIAS, ingested_segments, select_list, sql_literal


def open_run(run_path: str, con=None):
    """Return a DuckDB connection with one view per record kind over the run's records.

    The views read the compacted store (``store.duckdb``, written by ``ranksight ingest``) when there
    is one, plus every spool segment that store has not ingested yet, so a run reads the same whether
    it is live, finished, compacted or half-compacted, and no row is counted twice. A kind with no
    records yet gets an empty table of the right schema, so queries never fail on a young run.
    """
    import duckdb

    check_run_dir(run_path)
    con = con or duckdb.connect()
    store = store_path(run_path)
    has_store = _attach_store(con, store)
    ingested = ingested_segments(con, STORE_ALIAS) if has_store else {}
    quiet = has_store and _no_rank_writing(run_path)
    for kind in KINDS:
        pattern = segment_glob(run_path, kind)
        parts = []
        if has_store:
            table = f"{STORE_ALIAS}.{kind}"  # an older store may lack newer columns: NULL for those
            parts.append(f"SELECT {select_list(con, table, kind)} FROM {table}")
        files = glob.glob(pattern)
        pending = {os.path.basename(p) for p in files} - set(ingested.get(kind, ()))
        # A finished (or long silent) run whose segments are all in the store reads the store alone:
        # no segment can arrive any more, and a UNION with an empty spool scan makes queries ~2x slower.
        if files and (pending or not quiet):
            source = f"read_parquet({sql_literal(pattern)}, union_by_name=true, filename=true)"
            spool = f"SELECT {select_list(con, source, kind)} FROM {source}"
            if ingested.get(kind):
                # Constants, not a subquery: the attached store is fixed for this connection, and a
                # constant list lets DuckDB skip the ingested files instead of reading and dropping them.
                names = ", ".join(sql_literal(f) for f in ingested[kind])
                spool += f" WHERE parse_filename(filename) NOT IN ({names})"
            parts.append(spool)
        _drop(con, kind)  # a re-opened connection may hold the other kind of object under this name
        if parts:
            con.execute(f"CREATE VIEW {kind} AS " + " UNION ALL ".join(parts))
        else:
            con.execute(f"CREATE TABLE {kind} ({duckdb_columns(kind)})")
    return con


def _no_rank_writing(run_path: str) -> bool:
    """True when no rank may still write segments: each finished, or went silent (see ``LIVE_FLUSHES``)."""
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


def _attach_store(con, path: str) -> bool:
    """Attach a run's store read-only (it is replaced by rename, never written in place)."""
    if not os.path.exists(path):
        return False
    con.execute(f"DETACH DATABASE IF EXISTS {STORE_ALIAS}")
    try:
        con.execute(f"ATTACH {sql_literal(path)} AS {STORE_ALIAS} (READ_ONLY)")
    except Exception as exc:  # duckdb.Error: not a DuckDB file, newer format...
        raise RunDirError(f"{path}: cannot read the run's store ({str(exc).splitlines()[0]})") from None
    return True
