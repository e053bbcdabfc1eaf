"""Which spool segments read: DuckDB reads the Parquet schema of every file not judged yet, in one pass, and each
distinct schema is judged once against the record kind's; a file DuckDB cannot read, or of another schema, is left
out with its reason (``SkippedFile``). Verdicts are kept per process by name, size and mtime (a segment is written
once and renamed into place), and readers build their select lists from the columns they found.

Why DuckDB and one pass: it reads the footers in C++, in parallel, where a check of each file in Python held the
GIL for every file of a big spool; and on the reading connection (its Parquet metadata cache,
``reading_connection``) the footers read here are not parsed again to bind its views.
"""

from __future__ import annotations

import functools
import os
import stat
import threading

from ranksight.format.schema import IDENTITY, KINDS

from ._rundir import SkippedFile, first_line, is_listed, warn_skipped
from ._tables import quiet_connection

_FAMILIES = {
    "VARCHAR": "string",
    **dict.fromkeys(("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"), "integer"),
    **dict.fromkeys(("UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"), "integer"),
    **dict.fromkeys(("FLOAT", "DOUBLE"), "floating"),
    "BOOLEAN": "boolean",
    '"NULL"': "null",
}
"""DuckDB column types by the family a schema type accepts; any other type is one ranksight does not read."""
_ALLOWED_TYPES = {
    "string": ("string",),
    "int32": ("integer",),
    "int64": ("integer",),
    "float64": ("floating", "integer"),
    "bool": ("boolean",),
}
"""Type families each schema type accepts: what DuckDB reads into the column without surprise."""

_SIGNATURES_SQL = """
    SELECT file_name, string_agg(concat_ws('|', name, type, repetition_type, converted_type, logical_type), ','
                                 ORDER BY name) AS columns
    FROM parquet_schema($paths) GROUP BY file_name
"""
"""Each file's Parquet schema: what DuckDB reads it by, so files of one signature get one verdict (the Arrow schema
in their metadata besides cost a second pass and told no file of the agent's apart, onescan_52.md)."""

_NO_COLUMNS: frozenset = frozenset()


@functools.lru_cache(maxsize=256)
def _schema_problem(kind: str, columns: tuple[tuple[str, str], ...]) -> str | None:
    """What is wrong with a ``kind`` segment of these (name, DuckDB type) columns, in the file's order, or None."""
    present = {name for name, _ in columns}
    wanted = {c.name: c for c in KINDS[kind]}
    missing = [name for name, c in wanted.items() if not c.nullable and name not in present]
    if missing:
        return f"not a {kind} segment: no column {', '.join(missing)}"
    for name, duckdb_type in columns:
        family, column = _FAMILIES.get(duckdb_type), wanted.get(name)
        if column is None:
            if family is None:
                return f"column {name} has type {duckdb_type}, which ranksight does not read"
        elif family not in _ALLOWED_TYPES[column.type] and not (family == "null" and column.nullable):
            return f"column {name} has type {duckdb_type}, expected {column.type}"
    return None


def _judge(folder: str, kind: str, names: list[str], con=None) -> dict[str, tuple[str | None, frozenset] | None]:
    """name -> (why the file cannot be read as ``kind`` rows or None, its (name, DuckDB type) columns when it can);
    None for a file gone since the listing (pruned or renamed: not a damaged file). ``con``: the connection that
    will read the files (read on a cursor of it, whose Parquet metadata cache keeps the footers for its views)."""
    import duckdb

    paths = [os.path.join(folder, n) for n in names]
    cur = (_judging_connection() if con is None else con).cursor()
    out: dict[str, tuple[str | None, frozenset] | None] = {}
    try:
        try:  # one file is a group of its own: no signature to read
            signatures = dict(cur.execute(_SIGNATURES_SQL, {"paths": paths}).fetchall()) if len(paths) > 1 else {}
        except duckdb.Error:  # a file that does not read among them: each alone names it
            signatures = {}
            for name, path in zip(names, paths):
                try:
                    signatures.update(cur.execute(_SIGNATURES_SQL, {"paths": [path]}).fetchall())
                except duckdb.Error as exc:
                    gone = not os.path.lexists(path)
                    out[name] = None if gone else (f"not a readable Parquet file ({first_line(exc)})", _NO_COLUMNS)
        groups: dict[str, list[str]] = {}
        for name, path in zip(names, paths):
            if name not in out:
                groups.setdefault(signatures.get(path, path), []).append(name)
        for members in groups.values():
            out.update(_judge_schema(cur, folder, kind, members))
    finally:
        cur.close()
    return out


@functools.cache
def _judging_connection():
    """The connection files are judged on where no reader's is given, made once: a cursor of it costs nothing, a new
    connection ~10 ms, more than judging a refresh's new file (read_side_history.md)."""
    return quiet_connection()


def _judge_schema(cur, folder: str, kind: str, members: list[str]) -> dict:
    """The verdicts of files of one Parquet schema, read from the first one's; each file's own where its identity
    columns may hold NULL (the agent writes them required, so only a file from elsewhere gets here)."""
    import duckdb

    out: dict = {}
    for at, first in enumerate(members):  # the first that is still there (one may be pruned meanwhile)
        path = os.path.join(folder, first)
        try:
            types = cur.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()
            optional = cur.execute("SELECT name FROM parquet_schema(?) WHERE repetition_type = 'OPTIONAL'", [path])
            nullable = {name for (name,) in optional.fetchall()}
            break
        except duckdb.Error as exc:
            if os.path.lexists(path):
                return {
                    **out,
                    **dict.fromkeys(members[at:], (f"not a readable Parquet file ({first_line(exc)})", _NO_COLUMNS)),
                }
            out[first] = None
    else:
        return out
    columns = tuple((row[0], row[1]) for row in types)
    problem, found = _schema_problem(kind, columns), frozenset(columns)
    identity = [c.name for c in IDENTITY if c.name in nullable]
    if problem is not None or not identity:
        return {**out, **dict.fromkeys(members[at:], (problem, _NO_COLUMNS if problem else found))}
    counts = ", ".join(f"count(*) FILTER (WHERE {c} IS NULL)" for c in identity)
    for name in members[at:]:
        try:
            nulls = cur.execute(f"SELECT {counts} FROM read_parquet(?)", [os.path.join(folder, name)]).fetchone()
        except duckdb.Error as exc:
            out[name] = (f"its data does not decode ({first_line(exc)})", _NO_COLUMNS)
            continue
        with_nulls = ", ".join(c for c, n in zip(identity, nulls) if n)
        out[name] = (
            (f"rows without their identity (NULL in {with_nulls})", _NO_COLUMNS) if with_nulls else (None, found)
        )
    return out


class _SegmentVerdicts:
    """Each segment's verdict, kept per folder by (name, size, mtime); entries of files no longer listed are dropped
    at each scan (memory follows the spool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # name -> (size, mtime_ns, problem or None, columns of a readable file)
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
            if reason is not None:
                verdicts[name] = (size, mtime_ns, reason, _NO_COLUMNS)
            elif seen is not None and seen[:2] == (size, mtime_ns):
                verdicts[name] = seen
            else:
                to_judge.append(name)
        if to_judge:
            for name, verdict in _judge(folder, kind, to_judge, con).items():
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


def _listing(folder: str, names: list[str] | None = None) -> dict[str, tuple[int, int, str | None]]:
    """name -> (size, mtime_ns, None) of the files the segment glob matches (of ``names`` alone when given: no
    listing); a reason in place of None for what is not a file to read."""
    out: dict[str, tuple[int, int, str | None]] = {}
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
        regular = stat.S_ISREG(st.st_mode)
        out[name] = (st.st_size, st.st_mtime_ns, None if regular else "not a regular file")
    return out


_verdicts = _SegmentVerdicts()


def scan_segments(
    run_path: str, kind: str, unread: frozenset = frozenset(), con=None
) -> tuple[list[str], list[SkippedFile]]:
    """(readable segment paths, sorted; the segments left out and why) of a record kind.

    Each file is judged once per process; names in ``unread`` (segments a store holds, whose rows come from it)
    are left out without being read. Logs nothing: each caller warns about what matters to it. ``con``: the
    DuckDB connection that will read the segments, if any (see ``_judge``).
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
    """Paths of a record kind's readable spool segments, sorted, each judged once per process; each damaged or
    foreign one is left out with one warning line (an agent never leaves one: segments appear whole, by rename).
    ``names``: of these segments alone (a caller that listed the folder itself and wants the new ones), the folder
    not listed again."""
    good, bad = _verdicts.scan(os.path.join(run_path, kind), kind, frozenset(), None, names)
    for skipped in bad:
        warn_skipped(skipped)
    return good
