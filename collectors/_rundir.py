"""A run directory's files: where each lives and what the plain files say (no DuckDB here).

The reader (``open_run``), the store (``ingest``, ``prune``), the runs listing and the dashboard all
find a run's files through this module, so the layout (docs/schema.md) is spelled out once.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from ranksight.schema import RANKS_DIR, SPOOL_SUFFIX, TMP_PREFIX

STORE_NAME = "store.duckdb"
LOCK_NAME = ".store.lock"


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


def segment_files(run_path: str, kind: str) -> list[str]:
    """Paths of a record kind's finished spool segments, sorted (segments appear whole, by rename)."""
    return sorted(glob.glob(segment_glob(run_path, kind)))


def is_segment_name(name: str) -> bool:
    """Whether a file name is a finished spool segment (not a temporary file)."""
    return name.endswith(SPOOL_SUFFIX) and not name.startswith(TMP_PREFIX)


def spool_signature(run_path: str) -> tuple[int, int]:
    """(segments, newest mtime) of the step segments: changes exactly when new steps were written.

    One directory listing, no file opened: cheap enough to call on every dashboard refresh.
    """
    count, newest = 0, 0
    try:
        with os.scandir(os.path.join(run_path, "steps")) as it:
            for e in it:
                if e.name.endswith(SPOOL_SUFFIX) and not e.name.startswith("."):
                    count += 1
                    newest = max(newest, e.stat().st_mtime_ns)
    except OSError:
        pass
    return (count, newest)


def store_path(run_path: str) -> str:
    """Where a run's compacted store lives."""
    return os.path.join(run_path, STORE_NAME)


def store_signature(run_path: str) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of the run's store, None without one: changes when an ingest renames a new
    store into place."""
    try:
        st = os.stat(store_path(run_path))
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
