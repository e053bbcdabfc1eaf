"""DuckDB names and helpers that both the reader (``open_run``) and the store (``ingest``) use."""

from __future__ import annotations

from ranksight.format.schema import DUCKDB_TYPES, KINDS

from ._rundir import StoreError, first_line

STORE_ALIAS = "ranksight_store"
"""The schema name ``open_run`` attaches a run's store under (``ranksight_store.steps`` ...)."""
SEGMENTS_TABLE = "_segments"
"""Store table listing each ingested spool segment: kind, file name, rows, when it was ingested."""
SEGMENT_COLUMN = "_segment"
"""Store-only column: the spool segment each row came from, so a reader can pick up exactly the
segments it has not seen yet, also after ``prune`` deleted their files (NULL for rows an older
ingest wrote)."""


def quiet_connection():
    """A new in-memory DuckDB connection that draws no progress bar. In a process DuckDB takes for
    interactive (``python -c``, a REPL, a notebook) it draws one on stdout for any query past 2 s, also
    when stdout is a pipe: it would land inside the output of a script that reads ours (JSON from
    ``python -c``, a notebook cell's result). Cursors of the connection inherit the setting."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    return con


_EXACT_IN_NUMPY = frozenset(
    {"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
    | {"FLOAT", "DOUBLE", "VARCHAR"}
)
"""DuckDB result types whose values numpy carries unchanged to Python (``fetch_rows``): not HUGEINT (a sum of
BIGINTs, float64 in numpy), DECIMAL, temporal or nested types."""


def fetch_rows(cur) -> list[tuple]:
    """The rows of ``cur``'s result as ``fetchall`` gives them (Python values, None for NULL), fetched column by
    column where every column's type is one numpy carries unchanged (``_EXACT_IN_NUMPY``): a fifth of the time
    of ``fetchall``, which makes each value on its own."""
    names = [d[0] for d in cur.description]
    if len(set(names)) < len(names) or not all(str(d[1]) in _EXACT_IN_NUMPY for d in cur.description):
        return cur.fetchall()  # numpy's columns come back by name: two of one name would be one
    return list(zip(*(column.tolist() for column in cur.fetchnumpy().values())))


def select_list(con, source: str, kind: str, params: list | dict | None = None, present: dict | None = None) -> str:
    """The schema's columns of ``kind`` from ``source``, in order, with NULLs for columns it lacks.

    Segments written by an older agent may lack newer (nullable) columns; union_by_name fills them
    with NULL only when some file has them, so a column no file has yet is typed here explicitly.
    ``present`` is the source's ``describe`` when the caller has it already (it reads every footer).
    """
    present = describe(con, source, params) if present is None else present
    return ", ".join(
        c.name if c.name in present else f"CAST(NULL AS {DUCKDB_TYPES[c.type]}) AS {c.name}" for c in KINDS[kind]
    )


def describe(con, source: str, params: list | dict | None = None) -> dict[str, str]:
    """Column name -> DuckDB type of ``source`` (for a Parquet glob: the union of every file's schema)."""
    return {row[0]: row[1] for row in con.execute(f"DESCRIBE SELECT * FROM {source}", params or []).fetchall()}


def ingested_segments(con, schema: str = STORE_ALIAS) -> dict[str, list[str]]:
    """Segment file names held by an attached store, per kind (by default the one ``open_run`` attached);
    empty when no store is attached under that name."""
    out: dict[str, list[str]] = {k: [] for k in KINDS}
    if SEGMENTS_TABLE not in store_tables(con, schema):
        return out
    for kind, file in con.execute(f"SELECT kind, file FROM {schema}.{SEGMENTS_TABLE}").fetchall():
        out.setdefault(kind, []).append(file)
    return out


def attach_store(con, path: str, alias: str, shown: str, what: str, move: str) -> set[str]:
    """Attach the store at ``path`` (as DuckDB opens it) read-only under ``alias`` and return its tables. Raises
    ``StoreError`` naming ``shown`` (``what`` it is, and ``move``: what to do) for a file DuckDB cannot read
    (not a DuckDB file, a newer storage format) or one without ``_segments`` (not a ranksight store)."""
    import duckdb

    con.execute(f"DETACH DATABASE IF EXISTS {alias}")
    try:
        con.execute(f"ATTACH {sql_literal(path)} AS {alias} (READ_ONLY)")
    except duckdb.Error as exc:
        raise StoreError(f"{shown}: cannot read {what} ({first_line(exc)}); {move}") from None
    tables = store_tables(con, alias)
    if SEGMENTS_TABLE not in tables:
        con.execute(f"DETACH DATABASE {alias}")
        raise StoreError(f"{shown}: not a ranksight store (no {SEGMENTS_TABLE} table); {move}")
    return tables


def has_table(con, name: str) -> bool:
    """Whether ``con`` has a table or view ``name`` (a reading over some kinds only lacks the others)."""
    return name in {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}


def store_tables(con, catalog: str) -> set[str]:
    """Names of the tables in an attached database (empty when nothing is attached under that name)."""
    rows = con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = ?", [catalog])
    return {name for (name,) in rows.fetchall()}


def sql_literal(text: str) -> str:
    """Quote a path for DuckDB DDL (views cannot take bound parameters)."""
    return "'" + text.replace("'", "''") + "'"


def sql_list(paths: list[str]) -> str:
    """A DuckDB list literal of quoted paths (``sql_literal``)."""
    return f"[{', '.join(sql_literal(p) for p in paths)}]"


def register_arrow(con, name: str, table) -> None:
    """``con.register(name, table)``, after finishing any result a caller left half-read on ``con``:
    DuckDB 2 refuses to register or unregister while one is pending ("unfinished result")."""
    con.execute("SELECT 1").fetchall()
    con.register(name, table)


def unregister_arrow(con, name: str) -> None:
    """``con.unregister(name)``, after finishing any half-read result (see ``register_arrow``)."""
    con.execute("SELECT 1").fetchall()
    con.unregister(name)


def query(con, sql: str, params: list | tuple = ()) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of ``sql`` with ``params`` on ``con`` (a ``Run`` or a DuckDB connection)."""
    cur = con.execute(sql, list(params))
    return [d[0] for d in cur.description], fetch_rows(cur)


def steps_source(since_ns: int | None = None) -> str:
    """A FROM-able SQL source of the ``steps`` view's rows that ended after ``since_ns`` (Unix ns; all without
    it), for "now" verdicts. The view has every column of the schema (``select_list``: NULL where an older
    agent's rows lack one)."""
    return "steps" if since_ns is None else f"(SELECT * FROM steps WHERE time_ns > {int(since_ns)})"
