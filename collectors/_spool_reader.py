"""Query a run directory's spool with DuckDB while ranks are still writing it.

Each record kind becomes a view over ``<run>/<kind>/[!.]*.parquet``. Segments appear by atomic rename,
so a query sees whole files only; temporary files start with a dot and never match the glob. Views
are read-only and take no lock, so any number of readers run beside the writers.
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass

from ranksight.schema import DUCKDB_TYPES, KINDS, RANKS_DIR, SPOOL_SUFFIX, duckdb_columns


class RunDirError(ValueError):
    """The path is missing, empty, or not a ranksight run directory."""


@dataclass(frozen=True)
class RankMeta:
    """What one rank's metadata file says about it."""

    rank: int
    status: str
    heartbeat_ns: int
    steps: int
    data: dict


def read_rank_meta(run_path: str) -> list[RankMeta]:
    """Read every rank's metadata file; unreadable files are skipped (a rank may be mid-rename)."""
    metas = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_path), RANKS_DIR, "rank-*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
            metas.append(
                RankMeta(
                    int(data["rank"]),
                    str(data.get("status", "?")),
                    int(data.get("heartbeat_ns", 0)),
                    int(data.get("steps", 0)),
                    data,
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return metas


def check_run_dir(run_path: str) -> None:
    """Raise RunDirError with a one-line reason unless ``run_path`` is a ranksight run directory."""
    if not os.path.exists(run_path):
        raise RunDirError(f"{run_path}: no such directory")
    if not os.path.isdir(run_path):
        raise RunDirError(f"{run_path}: not a directory")
    if not os.path.isdir(os.path.join(run_path, RANKS_DIR)):
        hint = ""
        if any(os.path.isdir(os.path.join(run_path, d, RANKS_DIR)) for d in os.listdir(run_path)):
            hint = " (it holds runs: pass one of its sub-folders, see `ranksight runs`)"
        raise RunDirError(f"{run_path}: not a ranksight run directory (no {RANKS_DIR}/ folder){hint}")


def segment_glob(run_path: str, kind: str) -> str:
    """The glob of a record kind's finished spool segments.

    ``[!.]`` matters: DuckDB's glob, unlike Python's, matches dot-files, and a segment being written
    is ``.tmp-<name>.parquet`` -- reading it would fail on a half-written footer.
    """
    # escape(): a run folder may contain glob characters ("[", "*", "?"); DuckDB's glob honours the same escapes.
    return os.path.join(glob.escape(run_path), kind, f"[!.]*{SPOOL_SUFFIX}")


STORE_ALIAS = "ranksight_store"
SILENT_FLUSHES = 30  # a rank without a heartbeat for this many flush intervals writes no more segments


def open_run(run_path: str, con=None):
    """Return a DuckDB connection with one view per record kind over the run's records.

    The views read the compacted store (``store.duckdb``, written by ``ranksight ingest``) when there
    is one, plus every spool segment that store has not ingested yet, so a run reads the same whether
    it is live, finished, compacted or half-compacted, and no row is counted twice. A kind with no
    records yet gets an empty table of the right schema, so queries never fail on a young run.
    """
    import duckdb

    from ._store import ingested_segments, store_path

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
            source = f"read_parquet({_sql_literal(pattern)}, union_by_name=true, filename=true)"
            spool = f"SELECT {select_list(con, source, kind)} FROM {source}"
            if ingested.get(kind):
                # Constants, not a subquery: the attached store is fixed for this connection, and a
                # constant list lets DuckDB skip the ingested files instead of reading and dropping them.
                names = ", ".join(_sql_literal(f) for f in ingested[kind])
                spool += f" WHERE parse_filename(filename) NOT IN ({names})"
            parts.append(spool)
        _drop(con, kind)  # a re-opened connection may hold the other kind of object under this name
        if parts:
            con.execute(f"CREATE VIEW {kind} AS " + " UNION ALL ".join(parts))
        else:
            con.execute(f"CREATE TABLE {kind} ({duckdb_columns(kind)})")
    return con


def _no_rank_writing(run_path: str) -> bool:
    """True when every rank has finished, or has been silent for many flush intervals (crashed)."""
    now = time.time_ns()
    for meta in read_rank_meta(run_path):
        if meta.status == "finished":
            continue
        silent_ns = SILENT_FLUSHES * 1e9 * float(meta.data.get("flush_interval_s", 2.0))
        if now - meta.heartbeat_ns < silent_ns:
            return False
    return True


def select_list(con, source: str, kind: str, params: list | None = None) -> str:
    """The schema's columns of ``kind`` from ``source``, in order, with NULLs for columns it lacks.

    Segments written by an older agent may lack newer (nullable) columns; union_by_name fills them
    with NULL only when some file has them, so a column no file has yet is typed here explicitly.
    """
    present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}", params or []).fetchall()}
    return ", ".join(
        c.name if c.name in present else f"CAST(NULL AS {DUCKDB_TYPES[c.type]}) AS {c.name}" for c in KINDS[kind]
    )


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
        con.execute(f"ATTACH {_sql_literal(path)} AS {STORE_ALIAS} (READ_ONLY)")
    except Exception as exc:  # duckdb.Error: not a DuckDB file, newer format...
        raise RunDirError(f"{path}: cannot read the run's store ({str(exc).splitlines()[0]})") from None
    return True


def _sql_literal(text: str) -> str:
    """Quote a path for DuckDB DDL (views cannot take bound parameters)."""
    return "'" + text.replace("'", "''") + "'"
