"""A reading's summary relation: what the verdict reads of the step rows, per rank and per step, made in one place.

Three parts, of the columns ``ranksight.format.verdict_digest`` defines for readers and publisher alike:
``sums`` (a row per rank and warm-up flag), ``steps`` (a row per step and flag) and each rank's exact
``medians`` after warm-up. The breakdown, the per-rank statistics and the comparisons across ranks are plain
SQL over them (``_queries``). Where the parts come from is chosen here alone (``summarize``):

- the default warm-up over the whole run: the store's copy (``ingest`` keeps the relation of every row it holds,
  in the transaction that publishes the store), the digest of each pending step file that has one (the node
  spool's publisher writes it), and one scan of the rest;
- another warm-up, a recent window, node stores, an older store or a bare connection: one scan of the view.

The digests stay a source because a first verdict from them costs a third of one from the rows
(benchmarks/results/onescan_52.md). A median does not merge: a rank in several parts (files cut by time, a live
run beside its store) has its medians from the rows (``_median_fold``'s, for a reading refreshed again and again).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass

from ranksight.format.digest import DIGEST_DIR, digest_keys
from ranksight.format.digest_file import DigestError, read_digest_parts
from ranksight.format.phases import SAMPLED_SQL
from ranksight.format.verdict_digest import MEDIANS, SUMS_COLUMNS, merge_part_sql, steps_sql
from ranksight.format.warmup import WARM_SQL, WARMUP_STEPS, is_short

from ._median_fold import folded_medians
from ._rundir import file_signature, first_line, warn_once
from ._tables import STORE_ALIAS, fetch_rows, register_arrow, select_list, sql_list, steps_source, unregister_arrow

SUMMARY_TABLES = {"sums": "_summary_sums", "medians": "_summary_medians", "steps": "_summary_steps"}
"""The store's copy of the relation of its rows (``ingest``), made under ``summary_key`` (in ``_store_meta``)."""


_MEDIAN_AGGREGATES = ", ".join(f"median(CAST({v} AS DOUBLE)) AS median_{f}" for f, (v, _) in MEDIANS.items())


def rank_sql(source: str) -> str:
    """Per (rank, warm) of the step rows in ``source``: ``SUMS_COLUMNS`` and each ``MEDIANS`` figure's median
    (``median_<figure>``), in one scan; parameter ``$warm``."""
    cols = ", ".join(f"CAST({sql} AS {t}) AS {c}" for c, t, sql in SUMS_COLUMNS)
    return (
        f"SELECT rank, {WARM_SQL} AS warm, {cols}, {_MEDIAN_AGGREGATES} FROM {source} WHERE {SAMPLED_SQL} "
        "GROUP BY rank, warm"
    )


def summary_key() -> str:
    """The definition of the relation: a store's copy made under another is not read."""
    text = "\n".join([rank_sql("s"), steps_sql("s"), f"warm={WARMUP_STEPS}"])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def holds_relation(con, tables: set[str], schema: str = "") -> bool:
    """Whether a store of ``tables``, attached under ``schema`` ("": the current database), keeps the relation of
    its step rows under this code's definition (``summary_key``)."""
    if not set(SUMMARY_TABLES.values()) <= tables:
        return False
    meta = f"{schema}._store_meta" if schema else "_store_meta"
    return con.execute(f"SELECT value FROM {meta} WHERE key = 'summary_key'").fetchall() == [(summary_key(),)]


@dataclass
class Sources:
    """What ``open_views`` found behind a reading's ``steps`` view."""

    pending: list[str]
    """The spool's step files the view read besides any store when it was made, as DuckDB opens them (a view that
    globs the spool reads later ones too: the relation takes them in at ``Run.refresh``)."""
    store: bool = False
    """Whether the run's store holds step rows; ``store_summary``: with its copy of their relation."""
    store_summary: bool = False
    node_stores: bool = False
    files_only: bool = False
    """Whether the view's rows are exactly those of ``pending`` (named, no store): ``_median_fold`` may serve."""


@dataclass
class Summary:
    """The relation of one (warm-up, window) of a reading: ``sums`` and ``steps`` are tables on its connection,
    a row per key; ``medians`` is {figure: {rank: median}}; ``totals`` {rank: its summed rows}."""

    warmup: int
    sums: str
    steps: str
    medians: dict
    totals: dict
    read_from: tuple[str, ...]
    """Where the parts came from (``store``, ``digests``, ``rows``)."""

    @property
    def ranks(self) -> list[int]:
        """The ranks with a summed row, sorted."""
        return sorted(self.totals)

    @property
    def all_short(self) -> bool:
        """Whether every rank keeps its warm steps (none has more rows than the warm-up)."""
        return bool(self.totals) and is_short(max(self.totals.values()), self.warmup)


_names = itertools.count()


class KeptDigests:
    """The digest parts a reading refreshed again and again (``open_run(incremental=True)``) has read, merged per
    key, and the digest files they hold: each refresh of the live dashboard reads only the files added since, not
    every file's digest again (benchmarks/results/onescan_52.md)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple] = {}  # digest path -> (inode, size, mtime_ns) when read
        self.parts: dict | None = None  # part -> pyarrow table


def summarize(
    con,
    sources: Sources | None,
    warmup: int,
    since_ns: int | None,
    *,
    incremental: bool = False,
    ranks=None,
    kept: KeptDigests | None = None,
) -> Summary:
    """The relation of ``con``'s step rows (``sources``: what ``open_views`` found, None for a bare connection)
    after ``warmup`` steps, of the steps that ended after ``since_ns``, of ``ranks`` alone when given; ``kept``:
    the digest parts this reading read before (its refreshes')."""
    parts: list[tuple[str, tuple]] = []  # (where from, (sums, medians, steps, steps' NULL columns, drops))
    whole_view = (
        sources is None
        or ranks is not None
        or warmup != WARMUP_STEPS
        or since_ns is not None
        or sources.node_stores
        or (sources.store and not sources.store_summary)
        or (not sources.store and not _digest_paths(sources.pending))
    )
    if whole_view:
        source = steps_source(since_ns)
        if ranks is not None:
            source = f"(SELECT * FROM {source} WHERE rank IN ({', '.join(str(int(r)) for r in ranks)}))"
        parts.append(("rows", _rows_parts(con, source, warmup)))
    else:
        if sources.store:
            parts.append(("store", _store_parts()))
        digested, rest = _digest_parts(con, sources.pending, kept)
        if digested is not None:
            parts.append(("digests", digested))
        if rest:
            parts.append(("rows", _rows_parts(con, _files_source(con, rest), warmup)))
    return _merged(con, parts, warmup, since_ns, sources, incremental and not whole_view)


def _merged(con, parts, warmup: int, since_ns, sources: Sources | None, fold: bool) -> Summary:
    """The ``Summary`` of ``parts``: sums and steps merged per key into tables of their own, the medians read."""
    sums, steps = _merge_parts(con, [p for _, p in parts], "_rs")
    totals = dict(fetch_rows(con.execute(f"SELECT rank, CAST(sum(n) AS BIGINT) FROM {sums} GROUP BY rank")))
    summary = Summary(warmup, sums, steps, {}, totals, tuple(where for where, _ in parts))
    summary.medians = _medians(con, parts, summary, since_ns, sources if fold else None)
    for _, part in parts:  # what the parts were read into: merged now
        for drop in part[4]:
            drop()
    return summary


def _merge_parts(con, parts: list[tuple], prefix: str) -> tuple[str, str]:
    """Temp tables of the sums and of the steps of ``parts`` (of disjoint rows), each merged per key."""
    n = next(_names)
    absent = parts[0][3] if len(parts) == 1 else frozenset()
    names = []
    for at, part in ((0, "sums"), (2, "steps")):
        names.append(f"{prefix}_{part}_{n}")
        union = " UNION ALL BY NAME ".join(f"SELECT * FROM {p[at]}" for p in parts)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {names[-1]} AS {merge_part_sql(part, f'({union})', absent)}")
    return names[0], names[1]


def _medians(con, parts, summary: Summary, since_ns, sources: Sources | None) -> dict:
    """{figure: {rank: median of its kept rows}}: the parts' own where no (rank, figure) is in two parts, else the
    rows' (the fold's, ``sources`` given); a rank with no more rows than the warm-up keeps its warm steps, and
    its medians are those of all its rows."""
    union = " UNION ALL ".join(f"SELECT rank, figure, median FROM {p[1]}" for _, p in parts)
    found = None
    if con.execute(f"SELECT count(*) = count(DISTINCT (rank, figure)) FROM ({union})").fetchone()[0]:
        found = {f: {} for f in MEDIANS}
        columns = con.execute(f"SELECT figure, rank, median FROM ({union}) ORDER BY figure").fetchnumpy()
        figure, rank, value = (columns[c] for c in ("figure", "rank", "median"))
        for at, name in enumerate(MEDIANS, 1):
            held = figure == at
            found[name] = dict(zip(rank[held].tolist(), value[held].tolist()))
    else:
        if sources is not None and sources.files_only and sources.pending:
            found = folded_medians(con, sources.pending, tuple(MEDIANS), summary.warmup)
        if found is None:
            found = _rows_medians(con, since_ns, f"step >= {int(summary.warmup)}")
    short = [r for r, total in summary.totals.items() if is_short(total, summary.warmup)]
    if short:  # a few rows each
        by_figure = _rows_medians(con, since_ns, f"rank IN ({', '.join(str(int(r)) for r in short)})")
        for figure, held in found.items():
            for r in short:
                held.pop(r, None)
            held.update(by_figure[figure])
    return found


def _rows_medians(con, since_ns, where: str) -> dict[str, dict[int, float]]:
    """{figure: {rank: median}} of the view's rows that ``where`` keeps (sampled, after ``since_ns``)."""
    cols = ", ".join(f"median(CAST({v} AS DOUBLE))" for v, _ in MEDIANS.values())
    sql = f"SELECT rank, {cols} FROM {steps_source(since_ns)} WHERE {where} AND {SAMPLED_SQL} GROUP BY rank"
    out: dict[str, dict[int, float]] = {f: {} for f in MEDIANS}
    for row in fetch_rows(con.execute(sql)):
        for figure, value in zip(MEDIANS, row[1:]):
            if value is not None:
                out[figure][row[0]] = value
    return out


def medians_sql(table: str) -> str:
    """The (rank, figure, median) rows of a per-(rank, warm) table of ``rank_sql`` (the steps after warm-up), the
    figure its place in ``MEDIANS`` from 1, as a digest's ``medians`` part has them."""
    return " UNION ALL ".join(
        f"SELECT rank, CAST({i} AS TINYINT) AS figure, median_{f} AS median FROM {table}"
        f" WHERE NOT warm AND median_{f} IS NOT NULL"
        for i, f in enumerate(MEDIANS, 1)
    )


_MEDIAN_COLUMNS = ", ".join(f"median_{f}" for f in MEDIANS)


def _rows_parts(con, source: str, warmup: int) -> tuple:
    """The parts of the step rows in ``source``: two scans, a GROUP BY per rank (its sums and medians) and one per
    step. Not one scan of both groupings (GROUPING SETS): it computes every median per step too, and took nearly
    twice as long (benchmarks/results/onescan_52.md)."""
    n = next(_names)
    ranks, steps = f"_rs_rank_{n}", f"_rs_step_{n}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {ranks} AS {rank_sql(source)}", {"warm": warmup})
    con.execute(f"CREATE OR REPLACE TEMP TABLE {steps} AS {steps_sql(source)}", {"warm": warmup})
    drops = [lambda name=name: con.execute(f"DROP TABLE {name}") for name in (ranks, steps)]
    sums = f"(SELECT * EXCLUDE ({_MEDIAN_COLUMNS}) FROM {ranks})"
    return sums, f"({medians_sql(ranks)})", steps, frozenset(), drops


def relation_for_store(con, before: str, added: list[str], rows_of) -> tuple[tuple[str, str, str], list]:
    """((sums, medians, steps) SELECT-able, drops) of the relation of every step row of ``ingest``'s connection
    (``steps``). ``before``: what held the store's rows before this ingest ("none": there were none, "relation":
    its relation, "rows": they alone). The relation kept is merged with the digests of the step files ``added``
    and the rows of those without one (``rows_of(names)``: a source of their rows): what the digests hold is not
    computed again (cpu_scale_store_1024x10000_node_digested_*.json). Without either, one pass over the rows."""
    digested, rest = _digest_parts(con, added) if added and before != "rows" else (None, [])
    if before == "rows" or (before == "none" and digested is None):
        part = _rows_parts(con, "steps", WARMUP_STEPS)
        return part[:3], part[4]
    parts = [_store_parts("")] if before == "relation" else []
    parts += [digested] if digested is not None else []
    if rest:
        parts.append(_rows_parts(con, rows_of([os.path.basename(p) for p in rest]), WARMUP_STEPS))
    tables = _merged_for_store(con, parts)
    drops = [drop for part in parts for drop in part[4]]
    return tables, drops + [lambda name=name: con.execute(f"DROP TABLE {name}") for name in tables]


def _merged_for_store(con, parts: list[tuple]) -> tuple[str, str, str]:
    """Temp tables of ``parts`` (of disjoint rows) merged: sums and steps per key; a rank's medians the part's that
    holds all its kept rows, else the rows' (``steps``): a median does not merge."""
    sums, steps = _merge_parts(con, parts, "_st")
    n = next(_names)
    medians = f"_st_medians_{n}"
    union = " UNION ALL ".join(f"SELECT rank, figure, median FROM {p[1]}" for p in parts)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {medians} AS {union}")
    spread = f"_st_spread_{n}"
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {spread} AS "
        f"SELECT DISTINCT rank FROM {medians} GROUP BY rank, figure HAVING count(*) > 1"
    )
    if con.execute(f"SELECT count(*) FROM {spread}").fetchone()[0]:
        wide = f"_st_wide_{n}"
        con.execute(f"DELETE FROM {medians} WHERE rank IN (SELECT rank FROM {spread})")
        source = f"(SELECT * FROM steps WHERE rank IN (SELECT rank FROM {spread}))"
        con.execute(f"CREATE OR REPLACE TEMP TABLE {wide} AS {_rank_medians_sql(source)}", {"warm": WARMUP_STEPS})
        con.execute(f"INSERT INTO {medians} {medians_sql(wide)}")
        con.execute(f"DROP TABLE {wide}")
    con.execute(f"DROP TABLE {spread}")
    return sums, medians, steps


def _rank_medians_sql(source: str) -> str:
    """Per rank of the step rows in ``source`` after warm-up, each ``MEDIANS`` figure's median as ``rank_sql`` has
    it (its row of ``warm`` false); parameter ``$warm``."""
    return (
        f"SELECT rank, false AS warm, {_MEDIAN_AGGREGATES} FROM {source} WHERE NOT ({WARM_SQL}) AND {SAMPLED_SQL} "
        "GROUP BY rank"
    )


def _store_parts(schema: str = STORE_ALIAS) -> tuple:
    """The parts the run's store keeps of its rows (``ingest``), attached under ``schema`` ("": the current one)."""
    t = {part: f"{schema}.{name}" if schema else name for part, name in SUMMARY_TABLES.items()}
    return t["sums"], t["medians"], t["steps"], frozenset(), ()


def _digest_parts(con, paths: list[str], kept: KeptDigests | None = None) -> tuple[tuple | None, list[str]]:
    """(the parts of the digests of those ``paths`` that have one, the paths left to scan). A digest that does not
    read costs its file's speed, never a row: that file's rows are scanned, with one warning line."""
    by_name = _digest_paths(paths)
    digests = [by_name[os.path.basename(p)] for p in paths if os.path.basename(p) in by_name]
    rest = [p for p in paths if os.path.basename(p) not in by_name]
    signatures = {d: file_signature(d) for d in digests} if kept is not None else {}
    if kept is not None and (kept.parts is None or any(signatures.get(d) != s for d, s in kept.files.items())):
        kept.files, kept.parts = {}, None  # a file gone or changed: read every one again
    fresh = [d for d in digests if kept is None or d not in kept.files]
    read = None
    while fresh and read is None:
        try:
            read = _read_merging(con, fresh)
        except DigestError as exc:
            warn_once(f"ranksight: step digests do not read ({first_line(exc)}); reading their files' rows")
            bad = [d for d in fresh if str(exc).startswith(d + ":")] or fresh
            rest += [os.path.join(os.path.dirname(paths[0]), os.path.basename(d)) for d in bad]
            fresh = [d for d in fresh if d not in bad]
    if kept is not None and read is not None:
        if kept.parts is not None:  # the new files merged into what the reading kept
            read = {part: _merge(con, part, [kept.parts[part], table]) for part, table in read.items()}
        kept.parts, kept.files = read, {**kept.files, **{d: signatures[d] for d in fresh}}
    elif kept is not None:
        read = kept.parts  # every file read before
    if read is None:
        return None, rest
    n = next(_names)
    names = [f"_rs_digest_{part}_{n}" for part in ("sums", "medians", "steps")]
    for name, part in zip(names, ("sums", "medians", "steps")):
        register_arrow(con, name, read[part])
    drops = [lambda name=name: unregister_arrow(con, name) for name in names]
    return (names[0], names[1], names[2], _null_columns(read["steps"]), drops), rest


MERGE_BATCH = 128
"""Digest files read at a time, their per-step part merged per step (on a thread, while the next are read)."""


def _read_merging(con, paths: list[str]) -> dict:
    """{part: one pyarrow table} of the verdict's parts of the digests ``paths``, the per-step part merged per step
    every ``MERGE_BATCH`` files, each batch freed before the next: read whole, a fresh process paid the page faults
    of all of it (cpu_scale_history.md "Scale v5"). Raises ``DigestError`` naming the first file that does not
    read."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    pieces: dict[str, list] = {"sums": [], "medians": [], "steps": []}
    with ThreadPoolExecutor(1, thread_name_prefix="ranksight-merge") as merger:
        for at in range(0, len(paths), MERGE_BATCH):  # in path order: the first file that does not read is named
            read = read_digest_parts(paths[at : at + MERGE_BATCH], tuple(pieces), threads=False)
            pieces["sums"].append(read["sums"])
            pieces["medians"].append(read["medians"])
            pieces["steps"].append(merger.submit(_merge, con, "steps", [read["steps"]]))
        pieces["steps"] = [future.result() for future in pieces["steps"]]
    return {part: pa.concat_tables(tables, promote_options="permissive") for part, tables in pieces.items()}


def _merge(con, part: str, tables: list):
    """One pyarrow table: the ``part`` rows of ``tables`` merged per key (the ``medians`` rows joined as they are:
    each file's own), on a cursor of ``con`` (a database of its own would start its own threads)."""
    import pyarrow as pa

    table = pa.concat_tables(tables, promote_options="permissive")
    if part == "medians":
        return table
    cur = con.cursor()
    try:
        cur.register("_part", table)
        result = cur.sql(merge_part_sql(part, "_part", _null_columns(table)))
        return (getattr(result, "to_arrow_table", None) or result.arrow)()  # DuckDB 2's name, and 1.x's
    finally:
        cur.close()


def _null_columns(table) -> frozenset[str]:
    """The columns of a pyarrow table that are NULL on every row (its digests left them out): a merge leaves
    them NULL without aggregating them (``merge_steps_sql``'s ``absent``)."""
    return frozenset(name for name in table.column_names if table[name].null_count == table.num_rows)


def _digest_paths(paths: list[str]) -> dict[str, str]:
    """Step file name -> its digest, of ``paths`` (one folder), under this code's definition: one definition at a
    time (two would count their rows twice)."""
    if not paths:
        return {}
    steps_dir = os.path.dirname(paths[0])
    keys = digest_keys(steps_dir)
    if len(keys) != 1:
        return {}
    folder = os.path.join(steps_dir, DIGEST_DIR, keys[0])
    try:
        present = set(os.listdir(folder))
    except OSError:
        return {}
    names = (os.path.basename(p) for p in paths)
    return {name: os.path.join(folder, name) for name in names if name in present}


def _files_source(con, paths: list[str]) -> str:
    """The step rows of ``paths``, with each column of the schema (NULL where the files lack one)."""
    from ._segment_checks import one_schema, segment_columns

    union = "false" if one_schema(paths) else "true"
    source = f"read_parquet({sql_list(paths)}, union_by_name = {union})"
    return f"(SELECT {select_list(con, source, 'steps', present=segment_columns(paths))} FROM {source})"
