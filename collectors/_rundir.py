"""A run directory's files: where each lives and what the plain files say (no DuckDB here).

The reader (``open_run``), the store (``ingest``, ``prune``), the runs listing and the dashboard all
find a run's files through this module, so the layout (docs/schema.md) is spelled out once.

It is also where a damaged file is recognised: a spool segment that is empty, truncated, not Parquet
or of another schema, and a rank file that does not parse. Readers leave such a file out with one
warning line naming it (``SkippedFile``), so one bad file never costs the rest of the run or a
traceback (docs/reliability.md).
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ranksight.format.schema import IDENTITY, KINDS, RANKS_DIR, SPOOL_SUFFIX, TMP_PREFIX

from ._footers import judge_by_schema

if TYPE_CHECKING:
    import pyarrow as pa

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
    if skipped.moved_to:
        _warn_once(f"ranksight: moved {skipped.path} to {skipped.moved_to}: {skipped.reason}")
    else:
        _warn_once(f"ranksight: skipped {skipped.path}: {skipped.reason}")


def _warn_once(line: str) -> None:
    """Log a warning line once per process: a dashboard re-reads the run every few seconds."""
    with _warned_lock:
        if line in _warned:
            return
        _warned.add(line)
    log.warning("%s", line)


# --- rank metadata files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankMeta:
    """What one rank's metadata file says about it.

    ``status`` is what the agent wrote (``running``, or the final ``finished``, ``crashed``,
    ``terminated``), ``lost`` once a running rank's heartbeat stopped (see ``LIVE_FLUSHES``), or
    ``unknown`` when the file does not parse or holds a field of the wrong type (``problem`` says which;
    such fields are left out of ``data``).
    """

    rank: int
    status: str
    heartbeat_ns: int
    steps: int
    data: dict
    problem: str | None = None
    path: str = field(default="", compare=False)


UNKNOWN_STATUS = "unknown"
_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
_INT, _NUMBER, _TEXT, _OBJECT = "an integer", "a positive number", "a string", "an object"
_RANK_FIELDS = {
    **dict.fromkeys(("rank", "local_rank", "world_size", "pid", "node_rank"), _INT),
    **dict.fromkeys(("heartbeat_ns", "started_ns", "steps", "schema_version"), _INT),
    "flush_interval_s": _NUMBER,
    **dict.fromkeys(("status", "job", "run", "node", "hostname", "framework", "parallelism", "data_source"), _TEXT),
    **dict.fromkeys(("counters", "model", "gpu_device", "optimizer", "ddp", "ddp_logging", "loader", "host"), _OBJECT),
}
"""Types of the rank file's fields that readers compute with; a field of another type is left out."""
_REQUIRED_RANK_FIELDS = ("rank", "status", "heartbeat_ns")
_NESTED_NUMBERS = {
    "counters": ("agent_errors_total", "records_dropped_total", "rows_spooled_total"),
    "model": ("parameter_bytes",),
    "gpu_device": ("total_memory_bytes",),
    "optimizer": ("states_per_param",),
    "ddp": ("bucket_cap_bytes",),
    "ddp_logging": ("iteration", "unused_parameter_size"),
}
"""Numbers inside the rank file's objects that become rule features as they are."""


def read_rank_files(run_path: str) -> list[RankMeta]:
    """Every rank file of the run as the agent wrote it (status not derived; see ``read_rank_meta``).

    A file that does not parse, or whose fields have the wrong types, reads as a rank with status
    ``unknown`` (its rank from the file name) and one warning line; a file that vanished mid-read (an
    atomic rewrite) is simply not there this time.
    """
    folder = os.path.join(run_path, RANKS_DIR)
    try:
        listed = sorted(e.name for e in os.scandir(folder))
    except OSError:
        return []
    names = [n for n in listed if _RANK_FILE.match(n)]
    metas = [m for m in (_read_rank_file(os.path.join(folder, n)) for n in names) if m is not None]
    node_files = [n for n in listed if _NODE_FILE.match(n)]
    if node_files:  # a node spool's publisher (docs/scale.md): the newest heartbeat of each rank wins
        newest: dict[int, RankMeta] = {}
        for meta in metas + [m for n in node_files for m in _read_node_file(os.path.join(folder, n))]:
            held = newest.get(meta.rank)
            if held is None or meta.heartbeat_ns > held.heartbeat_ns:
                newest[meta.rank] = meta
        metas = [newest[r] for r in sorted(newest)]
    for meta in metas:
        if meta.problem:
            _warn_once(f"ranksight: read {meta.path} as status {UNKNOWN_STATUS}: {meta.problem}")
    return metas


_NODE_FILE = re.compile(r"^node-[^/]+\.json$")


def _read_node_file(path: str) -> list[RankMeta]:
    """The ranks of one node's rank file (``{"node": ..., "ranks": [rank file, ...]}``), each checked like a
    ``rank-N.json``; a file that does not parse is left out with one warning line (it names no rank)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        mtime_ns = os.stat(path).st_mtime_ns
        data = json.loads(raw.decode("utf-8"))
        ranks = data["ranks"]
        if not isinstance(ranks, list):
            raise ValueError("its ranks are not a list")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as exc:
        _warn_once(f"ranksight: skipped {path}: not a node rank file ({first_line(exc)})")
        return []
    metas = (_rank_from_data(path, entry, mtime_ns) for entry in ranks if isinstance(entry, dict))
    return [m for m in metas if m is not None]


def _read_rank_file(path: str) -> RankMeta | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        mtime_ns = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _unknown_rank(path, {}, f"cannot be read ({exc.strerror})", 0)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _unknown_rank(path, {}, f"not valid JSON ({first_line(exc)})", mtime_ns)
    if not isinstance(data, dict):
        return _unknown_rank(path, {}, f"not a JSON object (a {type(data).__name__})", mtime_ns)
    return _rank_from_data(path, data, mtime_ns)


def _rank_from_data(path: str, data: dict, mtime_ns: int) -> RankMeta | None:
    clean, problems = _checked_fields(data)
    problems += [f"no {key} field" for key in _REQUIRED_RANK_FIELDS if data.get(key) is None]
    if problems:
        return _unknown_rank(path, clean, "; ".join(problems), mtime_ns)
    return RankMeta(
        clean["rank"],
        clean.get("status", UNKNOWN_STATUS),
        clean.get("heartbeat_ns", mtime_ns),
        clean.get("steps", 0),
        clean,
        None,
        path,
    )


def _unknown_rank(path: str, clean: dict, problem: str, mtime_ns: int) -> RankMeta | None:
    """A rank file readers cannot trust: status unknown; the heartbeat falls back to the file's mtime
    (the agent rewrites it every flush), so a rank still writing is not taken for a dead one."""
    rank = clean.get("rank", _rank_of_name(path))
    if rank is None:
        return None
    heartbeat_ns, steps = clean.get("heartbeat_ns", mtime_ns), clean.get("steps", 0)
    return RankMeta(rank, UNKNOWN_STATUS, heartbeat_ns, steps, {**clean, "rank": rank}, problem, path)


def _rank_of_name(path: str) -> int | None:
    match = _RANK_FILE.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def _checked_fields(data: dict) -> tuple[dict, list[str]]:
    """(the data without fields of the wrong type, one line per such field). A typed field that is None is
    left out too: absent, so every reader's default applies."""
    clean, problems = {}, []
    for key, value in data.items():
        kind = _RANK_FIELDS.get(key)
        if kind is None:
            clean[key] = value
            continue
        if value is None:
            continue
        fitted = _fit(value, kind)
        if fitted is None:
            problems.append(f"{key} is {_shown(value)}, expected {kind}")
            continue
        if kind == _OBJECT:
            fitted, nested = _checked_numbers(key, fitted)
            problems += nested
        clean[key] = fitted
    return clean, problems


def _checked_numbers(key: str, obj: dict) -> tuple[dict, list[str]]:
    clean, problems = dict(obj), []
    for name in _NESTED_NUMBERS.get(key, ()):
        value = clean.get(name)
        if value is not None and not _is_number(value):
            problems.append(f"{key}.{name} is {_shown(value)}, expected a number")
            del clean[name]
    return clean, problems


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fit(value, kind: str):
    """The value as ``kind`` (an integral float is an integer), or None when it is not one."""
    if kind == _TEXT:
        return value if isinstance(value, str) else None
    if kind == _OBJECT:
        return value if isinstance(value, dict) else None
    if not _is_number(value):
        return None
    if kind == _INT:
        return int(value) if float(value).is_integer() else None
    return value if value > 0 else None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def is_segment_name(name: str) -> bool:
    """Whether a file name is a finished spool segment (not a temporary file)."""
    return name.endswith(SPOOL_SUFFIX) and not name.startswith(TMP_PREFIX)


def _is_listed(name: str) -> bool:
    """What the segment glob matches: ``*.parquet`` not starting with a dot."""
    return name.endswith(SPOOL_SUFFIX) and not name.startswith(".")


_ALLOWED_TYPES = {
    "string": ("string",),
    "int32": ("integer",),
    "int64": ("integer",),
    "float64": ("floating", "integer"),
    "bool": ("boolean",),
}
"""Arrow type families each schema type accepts: what DuckDB reads into the column without surprise."""
_READABLE_FAMILIES = ("string", "integer", "floating", "boolean", "null")


def _family(arrow_type) -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    checks = (
        ("string", pa.types.is_string),
        ("string", pa.types.is_large_string),
        ("integer", pa.types.is_integer),
        ("floating", pa.types.is_floating),
        ("boolean", pa.types.is_boolean),
        ("null", pa.types.is_null),
    )
    return next((name for name, check in checks if check(arrow_type)), str(arrow_type))


def segment_problem(path: str, kind: str) -> str | None:
    """Why a spool segment cannot be read as ``kind`` rows, or None when it can.

    First the framing (a Parquet file starts and ends with PAR1): empty, truncated and non-Parquet files
    fail here. Then the footer (pyarrow, no data read): every non-null column of the kind must be there
    with a type of the right family, and the identity columns must hold no NULL, so no row is read (or
    stored) without knowing which rank it came from.
    """
    return _segment_verdict(path, kind)[0]


_NO_COLUMNS: frozenset = frozenset()


def _segment_verdict(path: str, kind: str) -> tuple[str | None, frozenset]:
    """(``segment_problem``'s answer, the file's columns when it is readable, as (name, Arrow type) pairs): the
    names let readers build their select list without DuckDB reading every footer again (``segment_columns``),
    the types tell files DuckDB can read as one schema (``one_schema``)."""
    problem = _footer_problem(path, kind)
    return problem if isinstance(problem, str) else None, problem if isinstance(problem, frozenset) else _NO_COLUMNS


def _footer_problem(path: str, kind: str) -> str | frozenset:
    framing = _checked_framing(path)
    return framing if framing else _schema_verdict(path, kind)[0]


def _checked_framing(path: str) -> str | None:
    """``_framing_problem``, with a file that cannot be opened as the problem (FileNotFoundError raised)."""
    try:
        return _framing_problem(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"not a readable Parquet file ({first_line(exc)})"


def _schema_verdict(path: str, kind: str) -> tuple[str | frozenset, bool]:
    """(what the footer says is wrong, or the file's columns as (name, Arrow type) pairs; whether that answer
    read the file's data, so that it holds for this file alone rather than for every file of its schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as parquet:  # the footer only; half the CPU of pq.read_schema
            schema = parquet.schema_arrow
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:
        return f"not a readable Parquet file ({first_line(exc)})", True
    problem, nullable_identity = _schema_problem(kind, schema)
    if problem is not None:
        return problem, False
    with_nulls = _columns_with_nulls(path, list(nullable_identity)) if nullable_identity else []
    if with_nulls:
        return f"rows without their identity (NULL in {', '.join(with_nulls)})", True
    return frozenset((f.name, str(f.type)) for f in schema), bool(nullable_identity)


@functools.lru_cache(maxsize=256)
def _schema_problem(kind: str, schema: pa.Schema) -> tuple[str | None, tuple[str, ...]]:
    """(what is wrong with a ``kind`` segment of this Arrow schema, or None; its nullable identity columns).

    A pure function of the schema, kept per process: a spool's files share a handful of schemas, so each
    is judged once rather than column by column in Python for every one of a big spool's files."""
    fields = {f.name: f for f in schema}
    columns = {c.name: c for c in KINDS[kind]}
    missing = [name for name, c in columns.items() if not c.nullable and name not in fields]
    if missing:
        return f"not a {kind} segment: no column {', '.join(missing)}", ()
    for name, f in fields.items():
        family = _family(f.type)
        wanted = columns.get(name)
        if wanted is None:
            if family not in _READABLE_FAMILIES:
                return f"column {name} has type {f.type}, which ranksight does not read", ()
        elif family not in _ALLOWED_TYPES[wanted.type] and not (family == "null" and wanted.nullable):
            return f"column {name} has type {f.type}, expected {wanted.type}", ()
    return None, tuple(c.name for c in IDENTITY if fields[c.name].nullable)


_MAGIC = b"PAR1"


def _framing_problem(path: str) -> str | None:
    """What the first and last bytes say (a Parquet file starts and ends with PAR1): the cheap check that
    catches empty, truncated and non-Parquet files before a footer is parsed."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return "empty file (0 bytes)"
        head = f.read(4)
        f.seek(max(0, size - 4))
        tail = f.read(4)
    if head != _MAGIC:
        return f"not a Parquet file (it does not start with {_MAGIC.decode()})"
    if tail != _MAGIC or size < 12:
        return f"truncated: no Parquet footer at the end of its {size:,} bytes"
    return None


def _columns_with_nulls(path: str, names: list[str]) -> list[str]:
    """Which of the (nullable) columns hold a NULL: the agent writes identity columns as required, so
    only a file from elsewhere gets here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=names)
    except (OSError, pa.ArrowException, ValueError):
        return names
    return [name for name in names if table.column(name).null_count]


class _SegmentVerdicts:
    """Each segment's verdict, kept per folder by (name, size, mtime): a footer is read once per process.

    Segments are written once and renamed into place, so a file with the same size and mtime has the
    same footer; entries of files no longer listed are dropped at each scan (memory follows the spool).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # name -> (size, mtime_ns, problem or None, column names of a readable file)
        self._by_folder: dict[str, dict[str, tuple[int, int, str | None, frozenset]]] = {}

    def scan(self, folder: str, kind: str, unread: frozenset, con=None) -> tuple[list[str], list[SkippedFile]]:
        listed = {n: sig for n, sig in _listing(folder).items() if n not in unread}
        with self._lock:
            known = self._by_folder.get(folder, {})
        verdicts: dict[str, tuple[int, int, str | None, frozenset]] = {}
        to_judge = []
        for name, (size, mtime_ns, reason) in listed.items():
            seen = known.get(name)
            if reason != _NOT_JUDGED:
                verdicts[name] = (size, mtime_ns, reason, _NO_COLUMNS)
            elif seen is not None and seen[:2] == (size, mtime_ns):
                verdicts[name] = seen
            else:
                to_judge.append(name)
        for name, verdict in _judge_all(folder, kind, to_judge, con).items():
            if verdict is not None:
                verdicts[name] = (*listed[name][:2], *verdict)
        with self._lock:  # keep what is known of the files left unread: another caller may want them
            kept = {n: v for n, v in known.items() if n in unread and os.path.lexists(os.path.join(folder, n))}
            self._by_folder[folder] = {**kept, **verdicts}
        good, bad = [], []
        for name in sorted(verdicts):
            reason = verdicts[name][2]
            if reason is None:
                good.append(os.path.join(folder, name))
            else:
                bad.append(SkippedFile(os.path.join(folder, name), reason))
        return good, bad

    def columns(self, folder: str, names: list[str]) -> frozenset | None:
        """The union of the named (judged, readable) files' column names; None when one is not known."""
        with self._lock:
            known = self._by_folder.get(folder, {})
            cols = [known.get(name) for name in names]
        if any(c is None or c[2] is not None or not c[3] for c in cols):
            return None
        return frozenset(name for pairs in {c[3] for c in cols} for name, _ in pairs)

    def one_schema(self, folder: str, names: list[str]) -> bool:
        """Whether the named files were all judged readable with the same columns of the same types."""
        with self._lock:
            known = self._by_folder.get(folder, {})
            cols = {known[n][3] if n in known and known[n][2] is None else None for n in names}
        return len(cols) == 1 and None not in cols and bool(next(iter(cols)))


_NOT_JUDGED = "\0not judged"


def _listing(folder: str) -> dict[str, tuple[int, int, str]]:
    """name -> (size, mtime_ns, placeholder) of the files the segment glob matches; non-files get a reason."""
    out: dict[str, tuple[int, int, str]] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for entry in entries:
        if not _is_listed(entry.name):
            continue
        try:
            st = entry.stat()
        except FileNotFoundError:
            if os.path.lexists(entry.path):
                out[entry.name] = (-1, -1, "a link to a file that does not exist")
            continue
        except OSError as exc:
            out[entry.name] = (-1, -1, f"cannot be read ({exc.strerror})")
            continue
        if not entry.is_file():
            out[entry.name] = (st.st_size, st.st_mtime_ns, "not a regular file")
            continue
        out[entry.name] = (st.st_size, st.st_mtime_ns, _NOT_JUDGED)
    return out


_BATCH_FROM = 64  # footers to judge before one DuckDB pass over their schemas pays off


def _judge_all(folder: str, kind: str, names: list[str], con=None) -> dict[str, tuple[str | None, frozenset] | None]:
    """Verdicts of files not judged before (or changed since), reading their footers; None for a file pruned
    (or renamed) between the listing and the footer read: not a damaged file. Many files are judged one per
    schema (``_footers``), each file's framing still checked on its own."""

    def judge(name: str) -> tuple[str | None, frozenset] | None:
        try:
            return _segment_verdict(os.path.join(folder, name), kind)
        except FileNotFoundError:
            return None

    if len(names) < _BATCH_FROM:
        return {name: judge(name) for name in names}
    out: dict[str, tuple[str | None, frozenset] | None] = {}
    framed = []
    for name in names:
        try:
            framing = _checked_framing(os.path.join(folder, name))
        except FileNotFoundError:
            out[name] = None
            continue
        if framing:
            out[name] = (framing, _NO_COLUMNS)
        else:
            framed.append(name)
    scopes: dict[str, bool] = {}

    def judge_schema(name: str) -> tuple[str | None, frozenset] | None:
        try:
            answer, scopes[name] = _schema_verdict(os.path.join(folder, name), kind)
        except FileNotFoundError:
            return None
        return (answer, _NO_COLUMNS) if isinstance(answer, str) else (None, answer)

    batch = judge_by_schema(folder, framed, judge_schema, lambda name: scopes.get(name, True), con)
    if batch is None:
        batch = {name: judge(name) for name in framed}
    out.update(batch)
    return out


_verdicts = _SegmentVerdicts()


def scan_segments(
    run_path: str, kind: str, unread: frozenset = frozenset(), con=None
) -> tuple[list[str], list[SkippedFile]]:
    """(readable segment paths, sorted; the segments left out and why) of a record kind.

    Each file's footer is read once per process (``segment_problem``); names in ``unread`` (segments a
    store holds, whose rows come from it) are left out without being read. Logs nothing: each caller
    warns about what matters to it. ``con``: the DuckDB connection that will read the segments, if any;
    many footers are then read on it (a cursor), so its Parquet metadata cache keeps them for its views.
    """
    return _verdicts.scan(os.path.join(run_path, kind), kind, unread, con)


def segment_columns(paths: list[str]) -> frozenset | None:
    """The column names the given segments hold between them, from the footers ``scan_segments`` read
    (no file opened); None when one was not judged readable in this process (ask DuckDB then)."""
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        folder, name = os.path.split(path)
        by_folder.setdefault(folder, []).append(name)
    out: frozenset = frozenset()
    for folder, names in by_folder.items():
        cols = _verdicts.columns(folder, names)
        if cols is None:
            return None
        out |= cols
    return out


def one_schema(paths: list[str]) -> bool:
    """Whether the given segments, all judged readable in this process (``scan_segments``), hold the same
    columns of the same types, so that DuckDB can read them as one schema. Why: read with
    ``union_by_name``, DuckDB binds every file by its names for the view and again for each query that
    binds it -- at 1,250 node files 0.13 s of ``open_run`` against 0.02 s read as one (docs/scale.md); files
    of several schemas need it."""
    folders = {os.path.dirname(p) for p in paths}
    return len(folders) == 1 and _verdicts.one_schema(folders.pop(), [os.path.basename(p) for p in paths])


def segment_files(run_path: str, kind: str) -> list[str]:
    """Paths of a record kind's readable spool segments, sorted, every footer checked once per process;
    each damaged or foreign one is left out with one warning line (an agent never leaves one: segments
    appear whole, by rename)."""
    good, bad = scan_segments(run_path, kind)
    for skipped in bad:
        warn_skipped(skipped)
    return good


def spool_signature(run_path: str) -> tuple[int, int]:
    """(segments, newest mtime) of the step segments: changes exactly when new steps were written.

    One directory listing, no file opened: cheap enough to call on every dashboard refresh.
    """
    count, newest = 0, 0
    try:
        with os.scandir(os.path.join(run_path, "steps")) as it:
            for e in it:
                if _is_listed(e.name):
                    count += 1
                    newest = max(newest, e.stat().st_mtime_ns)
    except OSError:
        pass
    return (count, newest)


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
    """(inode, mtime, size) of the run's store, None without one: changes when an ingest renames a new
    store into place."""
    try:
        st = os.stat(store_path(run_path))
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


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


_alias_root: list[str] = []


def _alias_folder() -> str:
    """This process's folder of links, made on first use (mode 0700: nobody else can plant a link in it)."""
    if not _alias_root:
        _alias_root.append(tempfile.mkdtemp(prefix="ranksight-paths-"))
        atexit.register(shutil.rmtree, _alias_root[0], True)
    return _alias_root[0]
