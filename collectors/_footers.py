"""Judging many spool segments' footers at once: one per schema with pyarrow, the rest matched by DuckDB.

Why: a reader checks every segment's footer once per process before DuckDB reads it (a damaged or foreign
file is left out, not read). pyarrow parses footers one at a time, holding the GIL; DuckDB reads their schemas
in C++, in parallel, several times faster. A spool's files share a handful of schemas, so each distinct schema
(column names and Parquet types, repetition included) is judged once, by the same pyarrow check as a lone
file, and its verdict holds for every file that has it.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from ._tables import quiet_connection

Verdict = Optional[tuple]  # (problem or None, (name, type) columns) as ``_segment_checks.segment_verdict`` gives it

_GLOB_CHARACTERS = frozenset("*?[]{}")

_SIGNATURES_SQL = """
    SELECT file_name, string_agg(concat_ws('|', name, type, repetition_type, converted_type, logical_type), ','
                                 ORDER BY name) AS columns
    FROM parquet_schema($paths) GROUP BY file_name
"""
"""Each file's Parquet schema: what DuckDB reads it by. Not its Arrow schema besides (``parquet_kv_metadata``):
that second pass over the footers cost a third more and told no file of the agent's apart (onescan_52.md)."""


def judge_by_schema(
    folder: str, names: list[str], judge_one: Callable[[str], Verdict], needs_each: Callable[[str], bool], reader=None
) -> dict[str, Verdict] | None:
    """Verdicts of ``names`` (files in ``folder`` whose framing was checked): ``judge_one(name)`` for one
    file of each distinct schema, copied to the others. ``needs_each(name)``: whether that file's verdict
    depends on more than its schema (its data is read), so each file of its schema is judged alone.

    None when DuckDB cannot read every footer (a damaged file among them, or a path DuckDB would expand as
    a glob): the caller then judges each file alone, which names the damaged one.

    ``reader``: the connection that will read these files, whose Parquet metadata cache (``open_run`` sets
    it) then keeps the footers read here, so binding its views over the same files does not parse them
    again. Read on a cursor of it, which leaves its own pending result alone.
    """
    import duckdb

    paths = [os.path.join(folder, n) for n in names]
    if any(c in _GLOB_CHARACTERS for c in folder) or any(c in _GLOB_CHARACTERS for n in names for c in n):
        return None
    con = quiet_connection() if reader is None else reader.cursor()
    try:
        rows = con.execute(_SIGNATURES_SQL, {"paths": paths}).fetchall()
    except duckdb.Error:
        return None
    finally:
        con.close()
    by_path = dict(rows)
    if set(by_path) != set(paths):
        return None
    groups: dict[tuple, list[str]] = {}
    for name, path in zip(names, paths):
        groups.setdefault(by_path[path], []).append(name)
    out: dict[str, Verdict] = {}
    for members in groups.values():
        first = None
        for name in members:  # the first that is still there (one may be pruned while we read)
            out[name] = judge_one(name)
            if out[name] is not None:
                first = name
                break
        if first is None:
            continue
        rest = members[members.index(first) + 1 :]
        if needs_each(first):
            out.update((name, judge_one(name)) for name in rest)
        else:
            out.update((name, out[first]) for name in rest)
    return out
