"""Query a run directory's spool with DuckDB while ranks are still writing it.

Each record kind becomes a view over ``<run>/<kind>/*.parquet``. Segments appear by atomic rename,
so a query sees whole files only; temporary files start with a dot and never match the glob. Views
are read-only and take no lock, so any number of readers run beside the writers.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from ranksight.schema import KINDS, RANKS_DIR, SPOOL_SUFFIX, duckdb_columns


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
    for path in sorted(glob.glob(os.path.join(run_path, RANKS_DIR, "rank-*.json"))):
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
    """The glob of a record kind's spool segments."""
    return os.path.join(run_path, kind, f"*{SPOOL_SUFFIX}")


def open_run(run_path: str, con=None):
    """Return a DuckDB connection with one view per record kind over the run's spool.

    A kind with no segment yet gets an empty table of the right schema, so queries never fail on a
    young run.
    """
    import duckdb

    check_run_dir(run_path)
    con = con or duckdb.connect()
    for kind in KINDS:
        pattern = segment_glob(run_path, kind)
        if glob.glob(pattern):
            # union_by_name: segments from an older agent may lack newer (nullable) columns.
            con.execute(
                f"CREATE OR REPLACE VIEW {kind} AS SELECT * FROM read_parquet($p, union_by_name=true)".replace(
                    "$p", _sql_literal(pattern)
                )
            )
        else:
            con.execute(f"CREATE OR REPLACE TABLE {kind} ({duckdb_columns(kind)})")
    return con


def _sql_literal(text: str) -> str:
    """Quote a path for DuckDB DDL (views cannot take bound parameters)."""
    return "'" + text.replace("'", "''") + "'"
