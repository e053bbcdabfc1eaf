"""A run directory's layout: where each file lives, what a segment or store is called, and how DuckDB reaches
the folder (no DuckDB and no file opened here).

The reader (``open_run``), the store (``ingest``, ``prune``), the runs listing and the dashboard all find a
run's files through this module, so the layout is spelled out once. What the files say, and whether they can
be read, is judged beside it: the spool segments in ``_segment_checks`` and the rank files in ``_rank_files``.
A file left out is named with one warning line (``SkippedFile``), so one bad file never costs the rest of the
run or a traceback.
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass

from ranksight.format.schema import RANKS_DIR, SPOOL_SUFFIX

STORE_NAME = "store.duckdb"
LOCK_NAME = ".store.lock"
QUARANTINE_DIR = "quarantine"
"""Where ``ingest`` moves spool segments it cannot read (``<run>/quarantine/<kind>/``): kept, never deleted."""

log = logging.getLogger("ranksight")


class RunDirError(ValueError):
    """The path is missing, empty, or not a ranksight run directory."""


class StoreError(RunDirError):
    """The run's ``store.duckdb`` is not a store ranksight can read or extend (not DuckDB, or not ours)."""


# --- files left out ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkippedFile:
    """A file a reader left out (or ``ingest`` moved to quarantine), and why, for the CLI and dashboard to show."""

    path: str
    reason: str
    moved_to: str | None = None  # set by ingest: where the file is kept now

    def __str__(self) -> str:
        moved = f" (moved to {self.moved_to})" if self.moved_to else ""
        return f"{self.path}: {self.reason}{moved}"


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_skipped(skipped: SkippedFile) -> None:
    """Log one warning line naming the file (once per file and reason per process)."""
    done = f"moved {skipped.path} to {skipped.moved_to}" if skipped.moved_to else f"skipped {skipped.path}"
    warn_once(f"ranksight: {done}: {skipped.reason}")


def warn_once(line: str) -> None:
    """Log a warning line once per process: a dashboard re-reads the run every few seconds."""
    with _warned_lock:
        if line in _warned:
            return
        _warned.add(line)
    log.warning("%s", line)


def first_line(exc: BaseException) -> str:
    """An error's first line, bounded: DuckDB's and pyarrow's messages run over several lines, a warning is one."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def check_run_dir(run_path: str) -> None:
    """Raise RunDirError with a one-line reason unless ``run_path`` is a ranksight run directory."""
    if not os.path.exists(run_path):
        raise RunDirError(f"{run_path}: no such directory")
    if not os.path.isdir(run_path):
        raise RunDirError(f"{run_path}: not a directory")
    if not os.path.isdir(os.path.join(run_path, RANKS_DIR)):
        hint = ""
        try:
            if any(os.path.isdir(os.path.join(run_path, d, RANKS_DIR)) for d in os.listdir(run_path)):
                hint = " (it holds runs: pass one of its sub-folders, see `ranksight runs`)"
        except OSError:
            pass
        raise RunDirError(f"{run_path}: not a ranksight run directory (no {RANKS_DIR}/ folder){hint}")


# --- spool segments -----------------------------------------------------------------------------------


def segment_glob(run_path: str, kind: str) -> str:
    """The glob of a record kind's finished spool segments, for DuckDB (pass a ``duckdb_run_path``).

    ``[!.]`` matters: DuckDB's glob, unlike Python's, matches dot-files, and a segment being written
    is ``.tmp-<name>.parquet`` -- reading it would fail on a half-written footer.
    """
    # escape(): a run folder may contain glob characters ("[", "*", "?"); DuckDB's glob honours the same escapes.
    return os.path.join(glob.escape(run_path), kind, f"[!.]*{SPOOL_SUFFIX}")


def is_listed(name: str) -> bool:
    """What the segment glob matches: ``*.parquet`` not starting with a dot."""
    return name.endswith(SPOOL_SUFFIX) and not name.startswith(".")


def spool_signature(run_path: str) -> tuple[int, int]:
    """(segments, newest mtime) of the step segments: changes exactly when new steps were written.

    One directory listing, no file opened: cheap enough to call on every dashboard refresh.
    """
    count, newest = 0, 0
    try:
        with os.scandir(os.path.join(run_path, "steps")) as it:
            for e in it:
                if is_listed(e.name):
                    count += 1
                    newest = max(newest, e.stat().st_mtime_ns)
    except OSError:
        pass
    return (count, newest)


def file_signature(path: str) -> tuple[int, int, int]:
    """(inode, size, mtime_ns) of a file: a file written once and renamed into place that keeps it is unchanged
    (``(0, -1, 0)`` where it cannot be seen: never equal to a file that was there)."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def quarantine_path(run_path: str, kind: str, name: str) -> str:
    """A free path under ``<run>/quarantine/<kind>/`` for a segment ``ingest`` could not read."""
    folder = os.path.join(run_path, QUARANTINE_DIR, kind)
    target = os.path.join(folder, name)
    n = 1
    while os.path.lexists(target):
        target = os.path.join(folder, f"{name}.{n}")
        n += 1
    return target


# --- the store and DuckDB paths -----------------------------------------------------------------------


NODE_STORES_DIR = "nodes"
"""Where per-node stores go (``<run>/nodes/<node>.duckdb``): each node's ``ranksight ingest`` of its own run
folder, copied here when the nodes share no filesystem; ``open_run`` reads them beside the run's store."""


def node_store_paths(run_path: str) -> list[str]:
    """The per-node stores of a run (``<run>/nodes/*.duckdb``, dot-files left out: a copy in progress)."""
    folder = os.path.join(run_path, NODE_STORES_DIR)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".duckdb") and not n.startswith("."))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names]


def store_path(run_path: str) -> str:
    """Where a run's compacted store lives."""
    return os.path.join(run_path, STORE_NAME)


def store_signature(run_path: str) -> tuple[int, int, int] | None:
    """``file_signature`` of the run's store, None without one: changes when an ingest renames a new store
    into place."""
    found = file_signature(store_path(run_path))
    return None if found[1] < 0 else found


_DUCKDB_UNSAFE = ("\\", "?")
"""Characters DuckDB reads as something else in a path: a path separator (``\\``), the start of URL
parameters (``?``). A run folder named with them is reached through a private link instead."""
_aliases: dict[str, str] = {}
_alias_lock = threading.Lock()


def duckdb_run_path(run_path: str) -> str:
    """A path to the run folder that DuckDB opens as the same folder: the path itself, or a link to it in
    a private temporary folder when the path holds ``\\`` or ``?`` (removed when the process exits)."""
    if not any(ch in run_path for ch in _DUCKDB_UNSAFE):
        return run_path
    real = os.path.abspath(run_path)
    with _alias_lock:
        if real not in _aliases:
            _aliases[real] = _make_alias(real)
        return _aliases[real]


def _make_alias(real: str) -> str:
    alias = os.path.join(_alias_folder(), hashlib.sha256(os.fsencode(real)).hexdigest()[:16])
    if any(ch in alias for ch in _DUCKDB_UNSAFE):
        raise RunDirError(f"{real}: holds '\\' or '?', and so does the temporary folder: DuckDB cannot open it")
    if not os.path.islink(alias):
        os.symlink(real, alias)
    return alias


@functools.cache  # called under _alias_lock: made once
def _alias_folder() -> str:
    """This process's folder of links, made on first use (mode 0700: nobody else can plant a link in it)."""
    folder = tempfile.mkdtemp(prefix="ranksight-paths-")
    atexit.register(shutil.rmtree, folder, True)
    return folder
