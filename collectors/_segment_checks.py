"""Which spool segments read: each file's framing and footer judged against the record kind's schema, once per
process (kept by name, size and mtime), so a damaged or foreign segment is left out with its reason
(``SkippedFile``) and readers build their select lists from the footers already read.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
from typing import TYPE_CHECKING

from ranksight.format.schema import IDENTITY, KINDS

from ._footers import judge_by_schema
from ._rundir import SkippedFile, first_line, is_listed, warn_skipped

if TYPE_CHECKING:
    import pyarrow as pa

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


_NO_COLUMNS: frozenset = frozenset()


def segment_verdict(path: str, kind: str) -> tuple[str | None, frozenset]:
    """(why a spool segment cannot be read as ``kind`` rows or None when it can; the file's columns when it can,
    as (name, Arrow type) pairs). The names let readers build their select list without DuckDB reading every
    footer again (``segment_columns``), the types tell files DuckDB can read as one schema (``one_schema``).

    First the framing (a Parquet file starts and ends with PAR1): empty, truncated and non-Parquet files
    fail here. Then the footer (pyarrow, no data read): every non-null column of the kind must be there
    with a type of the right family, and the identity columns must hold no NULL, so no row is read (or
    stored) without knowing which rank it came from.
    """
    return _verdict(_framing_problem(path) or _schema_verdict(path, kind)[0])


def _verdict(answer: str | frozenset) -> tuple[str | None, frozenset]:
    """A ``_schema_verdict`` answer (a problem, or the columns) as a verdict: (problem or None, columns)."""
    return (answer, _NO_COLUMNS) if isinstance(answer, str) else (None, answer)


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
    catches empty, truncated and non-Parquet files before a footer is parsed. A file that cannot be opened is
    the problem; one that is gone raises FileNotFoundError."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return "empty file (0 bytes)"
            head = f.read(4)
            f.seek(max(0, size - 4))
            tail = f.read(4)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"not a readable Parquet file ({first_line(exc)})"
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

    def scan(
        self, folder: str, kind: str, unread: frozenset, con=None, names: list[str] | None = None
    ) -> tuple[list[str], list[SkippedFile]]:
        listed = {n: sig for n, sig in _listing(folder, names).items() if n not in unread}
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
            if names is not None:  # only these were looked at: what is known of the others stays
                kept = self._by_folder.get(folder, {})
            else:
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

    def readable_columns(self, folder: str, names: list[str]) -> list[frozenset | None]:
        """Each named file's (name, type) columns where it was judged readable, else None."""
        with self._lock:
            known = self._by_folder.get(folder, {})
            return [v[3] if (v := known.get(n)) is not None and v[2] is None else None for n in names]


_NOT_JUDGED = "\0not judged"


def _listing(folder: str, names: list[str] | None = None) -> dict[str, tuple[int, int, str]]:
    """name -> (size, mtime_ns, placeholder) of the files the segment glob matches (of ``names`` alone when
    given: no listing); non-files get a reason."""
    out: dict[str, tuple[int, int, str]] = {}
    if names is None:
        try:
            names = os.listdir(folder)
        except OSError:
            return out
    for name in names:
        if not is_listed(name):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if os.path.lexists(path):
                out[name] = (-1, -1, "a link to a file that does not exist")
            continue
        except OSError as exc:
            out[name] = (-1, -1, f"cannot be read ({exc.strerror})")
            continue
        if not stat.S_ISREG(st.st_mode):
            out[name] = (st.st_size, st.st_mtime_ns, "not a regular file")
            continue
        out[name] = (st.st_size, st.st_mtime_ns, _NOT_JUDGED)
    return out


_BATCH_FROM = 64  # footers to judge before one DuckDB pass over their schemas pays off


def _judge_all(folder: str, kind: str, names: list[str], con=None) -> dict[str, tuple[str | None, frozenset] | None]:
    """Verdicts of files not judged before (or changed since), reading their footers; None for a file pruned
    (or renamed) between the listing and the footer read: not a damaged file. Each file's framing is checked
    first; many files are then judged one per schema, one footer per schema read (``_footers``)."""
    out: dict[str, tuple[str | None, frozenset] | None] = {}
    scopes: dict[str, bool] = {}

    def judge_schema(name: str) -> tuple[str | None, frozenset] | None:
        try:
            answer, scopes[name] = _schema_verdict(os.path.join(folder, name), kind)
        except FileNotFoundError:
            return None
        return _verdict(answer)

    framed = []
    for name in names:
        try:
            framing = _framing_problem(os.path.join(folder, name))
        except FileNotFoundError:
            out[name] = None
            continue
        if framing:
            out[name] = (framing, _NO_COLUMNS)
        else:
            framed.append(name)
    batch = None
    if framed and len(names) >= _BATCH_FROM:
        batch = judge_by_schema(folder, framed, judge_schema, lambda name: scopes.get(name, True), con)
    out.update(batch if batch is not None else {name: judge_schema(name) for name in framed})
    return out


_verdicts = _SegmentVerdicts()


def scan_segments(
    run_path: str, kind: str, unread: frozenset = frozenset(), con=None
) -> tuple[list[str], list[SkippedFile]]:
    """(readable segment paths, sorted; the segments left out and why) of a record kind.

    Each file's footer is read once per process (``segment_verdict``); names in ``unread`` (segments a
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
        cols = _verdicts.readable_columns(folder, names)
        if not all(cols):
            return None
        out |= {name for pairs in set(cols) for name, _ in pairs}
    return out


def one_schema(paths: list[str]) -> bool:
    """Whether the given segments, all judged readable in this process (``scan_segments``), hold the same
    columns of the same types, so that DuckDB can read them as one schema rather than bind every file by its
    names (``union_by_name``) for the view and again for each query; files of several schemas need that."""
    folders = {os.path.dirname(p) for p in paths}
    if len(folders) != 1:
        return False
    cols = set(_verdicts.readable_columns(folders.pop(), [os.path.basename(p) for p in paths]))
    return len(cols) == 1 and bool(next(iter(cols)))


def segment_files(run_path: str, kind: str, names: list[str] | None = None) -> list[str]:
    """Paths of a record kind's readable spool segments, sorted, every footer checked once per process;
    each damaged or foreign one is left out with one warning line (an agent never leaves one: segments
    appear whole, by rename). ``names``: of these segments alone (a caller that listed the folder itself and
    wants the new ones), the folder not listed again."""
    good, bad = _verdicts.scan(os.path.join(run_path, kind), kind, frozenset(), None, names)
    for skipped in bad:
        warn_skipped(skipped)
    return good
