"""The step digests that stand for a connection's step rows, so that queries of sums read them instead.

Why: on a live spool of 1,024 ranks x 10,000 steps, ``step_breakdown`` spent most of its 1.7 s summing the
phase expressions row by row, and the node spool's publisher had already written those sums per file
(``ranksight.format.digest``). ``open_run`` notes the digests of the files and store segments its views read; a
query takes them only when their row counts add up to exactly the view's rows -- every row has its digest,
none is counted twice -- and reads the rows otherwise (a file published without one, a window, node stores).
"""

from __future__ import annotations

import os

from ranksight.format.digest import COLUMNS, chunk_of_key, digest_keys, digest_paths
from ranksight.format.digest_file import DigestError, read_digests
from ranksight.format.phases import SAMPLED_SQL
from ranksight.format.verdict_digest import MEDIANS
from ranksight.format.warmup import WARMUP_STEPS

from ._digest_fold import folded_parts
from ._run_state import state_of
from ._rundir import first_line, warn_once
from ._segment_checks import segment_rows
from ._tables import (
    DIGESTS_TABLE,
    SEGMENT_COLUMN,
    STORE_ALIAS,
    VERDICT_PART_TABLES,
    fetch_rows,
    register_arrow,
    sql_literal,
    store_tables,
)

_REGISTERED = "_ranksight_step_digests"
"""The name the spool's digest rows are registered under on a connection, once a query takes them."""


VERDICT_PARTS = ("sums", "medians", "steps")
"""The verdict's digest parts the features read."""


class _Noted:
    """What ``open_run`` noted: the digest files of the pending step files and whether the store's count too.
    The files are read on first use, not at open: most readers never ask."""

    def __init__(self, key: str, paths: list[str], store: bool, view_files: list[str] | None = None) -> None:
        self.key, self.paths, self.store = key, paths, store
        self.view_files = view_files  # the step files the view names, as DuckDB opens them; None: a glob
        self.source: str | None = None
        self.verdict: dict[str, str] | None = None  # part -> registered name; {} when they do not serve
        self.rows: int | None = None  # of the steps view
        self.footer_rows: int | None = None  # the rows its files' footers hold (``_footer_count``)
        self.medians: dict[str, dict[int, float]] = {}  # figure -> {rank: median}: the files', or the rows'
        self.rank_summaries: dict[str, tuple] = {}  # sums part -> its ``rank_summary``
        self.median_figures: set[str] = set()  # the figures found so far
        self.expected: tuple[str, ...] = VERDICT_PARTS  # read on the first read of any: each file opened once


def _noted(con) -> _Noted | None:
    state = state_of(con)
    return state.digests if state is not None else None


def _forget(con) -> None:
    """Read the rows from now on, on this Run."""
    state = state_of(con)
    if state is not None:
        state.digests = None


def note_digests(
    con, run_path: str, spool_names: list[str], store_digests: bool, view_files: list[str] | None = None
) -> None:
    """Note for ``con`` the digests of the pending step files ``spool_names`` and (``store_digests``) the
    attached store's; only one digest definition at a time (two would count their rows twice).
    ``view_files``: the files the ``steps`` view names, exactly (``follow_spool=False``), whose footers then
    count its rows (``_holds_every_row``); None where the view globs the folder."""
    state = state_of(con)
    if state is None:
        return  # a bare connection reads the rows
    state.digests = None
    steps_dir = os.path.join(run_path, "steps")
    keys = set(digest_keys(steps_dir))
    if store_digests and DIGESTS_TABLE in store_tables(con, STORE_ALIAS):
        stored = con.execute(f"SELECT DISTINCT key FROM {STORE_ALIAS}.{DIGESTS_TABLE}").fetchall()
        keys |= {k for (k,) in stored if chunk_of_key(k) is not None}
    if len(keys) != 1:
        return
    key = keys.pop()
    found = digest_paths(steps_dir, chunk_of_key(key), spool_names)
    if found or store_digests:
        state.digests = _Noted(key, [found[n] for n in sorted(found)], store_digests, view_files)


def digests_may_serve(warmup_steps: int, since_ns: int | None) -> bool:
    """Whether digests may stand for the rows of a query: they were folded for the default warm-up over whole
    files, so they serve that warm-up over the whole run, never another warm-up or a recent window. The one
    test every query makes before it asks ``covering_digests`` or ``verdict_digests`` (``Run.path_for``)."""
    return warmup_steps == WARMUP_STEPS and since_ns is None


def _source(con, noted: _Noted) -> str:
    """The FROM-able SQL of the noted digest rows; reads the spool's digest files the first time."""
    if noted.source is None:
        columns = ", ".join(c for c, _ in COLUMNS)
        parts = []
        if noted.paths:
            # The breakdown asks for the verdict's parts first; this rollup part is its fallback (they did not serve).
            register_arrow(con, _REGISTERED, read_digests(noted.paths, with_file=False))
            parts.append(f"SELECT {columns} FROM {_REGISTERED}")
        if noted.store:
            parts.append(f"SELECT {columns} FROM {STORE_ALIAS}.{DIGESTS_TABLE} WHERE key = {sql_literal(noted.key)}")
        noted.source = "(" + " UNION ALL ".join(parts) + ")"
    return noted.source


def covering_digests(con) -> str | None:
    """A FROM-able source of digest rows that stands for every row of ``con``'s ``steps`` view, or None.

    None also when the digests do not read: the rows are there to read instead."""
    import duckdb

    noted = _noted(con)
    if noted is None:
        return None
    try:
        source = _source(con, noted)
        held = con.execute(f"SELECT sum(n) FROM {source}").fetchall()[0][0]
        covered = _holds_every_row(con, held)
    except (duckdb.Error, DigestError):
        _forget(con)  # do not try again on this connection
        return None
    return source if covered else None


def verdict_digests(con, *wanted: str) -> dict[str, str] | None:
    """{part: name to read it from} of the verdict's digest parts (``ranksight.format.verdict_digest``) ``wanted``
    -- ``sums`` always, ``medians`` and ``steps`` when asked -- when they stand for every row of ``con``'s
    ``steps`` view, else None. Every part is read at the first call, whichever it asks for (each file opened
    once): from the pending files' digests (merged and kept for the next reader, ``_digest_fold``), and from
    the store's copies of the ingested segments' (``VERDICT_PART_TABLES``), so a
    live run that ``ingest --every`` compacts is judged from them too. A part that does not read, or a file
    or segment without it, leaves the queries to the rows."""
    import duckdb

    noted = _noted(con)
    if noted is None or not (noted.paths or noted.store) or noted.verdict == {}:
        return None
    if noted.verdict is None:
        noted.verdict = {}
    missing = [p for p in dict.fromkeys(("sums", *wanted, *noted.expected)) if p not in noted.verdict]
    try:
        if missing:
            _footer_count(con, noted) if _footers_count(noted) else _step_rows(con)
        read, missing = _read_parts(con, noted, missing, wanted)
        stored = store_tables(con, STORE_ALIAS) if noted.store else set()
        for part in missing:
            name = f"{_REGISTERED}_{part}"
            sources = []
            if part in read:
                register_arrow(con, f"{name}_spool", read[part].table)
                sources.append(f"SELECT * FROM {name}_spool")
            if noted.store:
                if VERDICT_PART_TABLES[part] not in stored:
                    raise DigestError(f"the store holds no {part} part")
                sources.append(
                    f"SELECT * EXCLUDE (key, {SEGMENT_COLUMN}) FROM {STORE_ALIAS}.{VERDICT_PART_TABLES[part]}"
                    f" WHERE key = {sql_literal(noted.key)}"
                )
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {' UNION ALL BY NAME '.join(sources)}")
            if part in ("sums", "steps"):  # one row per step row: their counts add up to the view's rows
                held = con.execute(f"SELECT sum(n) FROM {name}").fetchall()[0][0]
                if not _holds_every_row(con, held):
                    raise DigestError(f"the digests hold {held} step rows of {_step_rows(con)}")
            if part == "medians":
                _keep_file_medians(con, noted, name, read.get(part))
            noted.verdict[part] = name
    except (duckdb.Error, DigestError):
        noted.verdict = {}  # do not try again on this connection
        return None
    return dict(noted.verdict)


def _keep_file_medians(con, noted: _Noted, name: str, kept) -> None:
    """Keep the files' per-rank medians (the ``medians`` part registered as ``name``) where each (rank, figure)
    is in one file's part alone: then it is the median of all that rank's rows. Where a rank's rows after
    warm-up are in several files (a long run's node files cut by time) none is kept, and the readers take the
    rows' medians (``_digest_queries.medians``): a median means the same whatever the files. What is found
    from a part read from the files is kept with it (``_digest_fold``) for the next reader of the same files."""
    derived = kept.derived if kept is not None and not noted.store else {}
    if "one_file_each" not in derived:
        rows = con.execute(f"SELECT rank, figure, median FROM {name}").fetchnumpy()
        rank, figure = rows["rank"].astype("int64"), rows["figure"].astype("int64")
        one_file_each = len(set(zip(rank.tolist(), figure.tolist()))) == len(rank)
        medians: dict[str, dict[int, float]] = {}
        if one_file_each:
            for position, figure_name in enumerate(MEDIANS, 1):
                at = figure == position
                if at.any():
                    medians[figure_name] = dict(zip(rank[at].tolist(), rows["median"][at].tolist()))
        derived.update(medians=medians, median_figures=set(MEDIANS) if one_file_each else set())
        derived["one_file_each"] = one_file_each  # last: a reader that sees it finds the medians complete
    if derived["one_file_each"]:
        noted.medians = derived["medians"]
        noted.median_figures = derived["median_figures"]


def _read_parts(con, noted: _Noted, missing: list[str], wanted: tuple[str, ...]) -> tuple[dict, list[str]]:
    """({part: ``KeptPart``} of the pending files' parts, the verdict's parts read): ``missing``, each file opened
    once. Where a file fails to read, the wanted parts are read alone (the parts only expected are left to the
    rows): a part cut short sends only its own figures to the rows."""
    if not (missing and noted.paths):
        return {}, missing
    try:
        return folded_parts(con, noted.paths, tuple(missing)), missing
    except DigestError as exc:
        # One line naming the file (``DigestError`` does); its figures come from the rows, so none is lost.
        warn_once(f"ranksight: step digest parts do not read ({first_line(exc)}); reading those figures from the rows")
        needed = [p for p in missing if p == "sums" or p in wanted]
        if needed == missing:
            raise
        noted.expected = ()
        return folded_parts(con, noted.paths, tuple(needed)), needed


def _footers_count(noted: _Noted) -> bool:
    """Whether the view's rows can be counted from its files' footers: it names them (no glob, no store)."""
    return noted.view_files is not None and not noted.store


def _holds_every_row(con, held) -> bool:
    """Whether ``held`` (the rows the digests folded) is every row of ``con``'s ``steps`` view that digests
    fold. First against the rows the footers of the view's files count (no scan: the first scan of a view
    over 1,250 node files costs 0.2 s of opening them, where the footers, read at open and kept by the
    connection, sum in 0.05 s): a digest folds only ``SAMPLED_SQL`` rows, so equal counts say that every row
    is folded once and none is a GPU step left unsampled. Otherwise the rows are counted (``_step_rows``)."""
    if not held:
        return False
    noted = _noted(con)
    if noted is not None and noted.rows is None and _footers_count(noted) and noted.view_files:
        if _footer_count(con, noted) == held:
            noted.rows = held
            return True
    return held == _step_rows(con)


def _footer_count(con, noted: _Noted) -> int | None:
    """``_footer_rows`` of the view's files, counted once per noted connection."""
    if noted.footer_rows is None and noted.view_files:
        noted.footer_rows = _footer_rows(con, noted.view_files)
    return noted.footer_rows


def _footer_rows(con, files: list[str]) -> int | None:
    """The rows the footers of ``files`` hold: as their cards say where cards vouched for every one of them
    (``_file_cards``: 0.07 s of DuckDB reading 1,250 footers again at 10,000 ranks), else DuckDB's Parquet
    metadata, kept by the reading connection."""
    import duckdb

    carded = segment_rows(files)
    if carded is not None:
        return carded
    cur = con.cursor()
    try:
        return cur.execute("SELECT sum(num_rows) FROM parquet_file_metadata($files)", {"files": files}).fetchall()[0][0]
    except duckdb.Error:
        return None
    finally:
        cur.close()


def _step_rows(con) -> int:
    """The rows of ``con``'s ``steps`` view that digests fold (``SAMPLED_SQL``: not a GPU rank's steps without
    CUDA events), counted once per noted connection (the views do not change)."""
    noted = _noted(con)
    if noted is not None and noted.rows is not None:
        return noted.rows
    rows = con.execute(f"SELECT count(*) FROM steps WHERE {SAMPLED_SQL}").fetchall()[0][0]
    if noted is not None:
        noted.rows = rows
    return rows


def rank_summary(con, sums: str) -> tuple[list[int], int | None]:
    """(the ranks of the ``sums`` part registered as ``sums``, sorted; the fewest step rows any of them has),
    found once per reading: the part does not change, and each figure from the digests asks whether a rank is
    short of the warm-up (10,000 ranks, four times per verdict)."""
    noted = _noted(con)
    if noted is not None and sums in noted.rank_summaries:
        return noted.rank_summaries[sums]
    rows = fetch_rows(con.execute(f"SELECT rank, CAST(sum(n) AS BIGINT) FROM {sums} GROUP BY rank"))
    summary = (sorted(r for r, _ in rows), min((n for _, n in rows), default=None))
    if noted is not None:
        noted.rank_summaries[sums] = summary
    return summary


def incremental_step_files(con) -> list[str] | None:
    """The step files whose rows are exactly ``con``'s ``steps`` view, for a reading refreshed again and again
    (``open_run(incremental=True)``): its view names them and no store adds rows. None otherwise."""
    state, noted = state_of(con), _noted(con)
    if state is None or not state.incremental or noted is None or noted.store or not noted.view_files:
        return None
    return noted.view_files


def noted_medians(con) -> tuple[dict[str, dict[int, float]], set[str]]:
    """The per-rank medians ``keep_medians`` kept for ``con`` ({figure: {rank: median}}), and the figures
    they hold."""
    noted = _noted(con)
    return (noted.medians, noted.median_figures) if noted is not None else ({}, set())


def keep_medians(con, medians: dict[str, dict[int, float]], figures) -> dict[str, dict[int, float]]:
    """Add the per-rank medians of ``figures`` ({figure: {rank: median}}) read from ``con``'s digests (they do
    not change with the views) to those kept; returns all kept. One set: the digests serve one warm-up, their
    own."""
    noted = _noted(con)
    if noted is None:
        return medians
    for figure, by_rank in medians.items():
        noted.medians.setdefault(figure, {}).update(by_rank)
    noted.median_figures.update(figures)
    return noted.medians
