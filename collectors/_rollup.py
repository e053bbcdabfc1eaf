"""A per-rank, per-chunk-of-steps rollup of a run's step records, kept up to date file by file.

Why: a big job's step table takes up to a second to scan, for every panel and every refresh. The rollup scans
each spool segment once, sums the step phases per (rank, chunk of steps) into an in-memory table about
``chunk_steps`` times smaller, and on refresh reads only the segments that appeared since. Every figure the
panels show is a sum, count, min or max, so partial chunks from two segments simply add up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Mapping

from ranksight.format.digest import COLUMNS, chunk_steps_for, column_steps, digest_folder, digest_paths, fold_sql
from ranksight.format.digest_file import DigestError, read_digests
from ranksight.format.schema import KINDS
from ranksight.format.warmup import WARMUP_STEPS

from ._rundir import is_listed, store_signature
from ._runs import read_rank_meta
from ._segment_checks import segment_columns, segment_files
from ._spool_reader import _any_segment
from ._tables import SEGMENT_COLUMN, STORE_ALIAS, ingested_segments, register_arrow, select_list, unregister_arrow

log = logging.getLogger("ranksight")

MAX_COLUMNS = 120
"""The most columns a heatmap asks of the rollup (the Heatmaps page's slider tops out here): the rollup's rows
past its head are merged no wider than such a column, so every column still holds whole rows."""
STAT_DIGESTS_BELOW = 8
"""A refresh's new step files are looked up in the digest folder one ``stat`` each while they are fewer than
1 in this many of the files folded so far, else the folder is listed (a ``stat`` costs about as much as listing
eight names)."""
FINE_STEPS = 64
"""Steps after the warm-up the rollup keeps at its own chunk whatever the run's length: the heatmaps' colour
scale is read from them (``SCALE_STEPS``, 50), so it stays what it was once fixed."""
RANKS_TABLE = "rollup_ranks"
"""The rollup's rows totalled per (rank, warm), kept beside it: the pages' per-rank figures (the breakdown, the
stragglers, the rank order, the run's overview) read these 2 rows a rank, not every row of the rollup, so
their cost stays what it is at any length of the run (benchmarks/results/cpu_dashboard_live_history.md)."""
_MERGED = {"node": "any_value(node)", "chunk": "min(chunk)", "warm": "warm", "rank": "rank",
           "step_min": "min(step_min)", "t_min": "min(t_min)", "step_max": "max(step_max)",
           "t_max": "max(t_max)", "step_max_s": "max(step_max_s)"}  # fmt: skip
"""How rows of one key merge, column by column (every other column is a sum)."""


def merged_select() -> str:
    """The rollup's columns, in order, of its rows merged per key (the caller's GROUP BY, with ``rank`` and
    ``warm`` in it): each figure a sum, count, minimum or maximum, so merged rows give the same totals."""
    return ", ".join(f"CAST({_MERGED.get(c, f'sum({c})')} AS {t}) AS {c}" for c, t in COLUMNS)


class Rollup:
    """The ``rollup`` table beside a ``Run``'s views, on its connection (``Run.rollup()`` makes it).

    ``refresh()`` is cheap when nothing changed (one directory listing per kind). Connections for
    queries come from ``cursor()``; DuckDB cursors of one database may be used from several threads.
    """

    max_columns = MAX_COLUMNS
    ranks_table = RANKS_TABLE

    def __init__(self, run, chunk_steps: int | None = None) -> None:
        """``run``: the ``Run`` whose views the rollup reads (opened before the store's signature is taken
        would miss a newer store: ``Run.rollup`` takes it first, then opens)."""
        self.run = run
        self.run_path = run_path = run.path
        self._store_sig = run.store_signature_at_open
        self.con = run
        self._lock = threading.Lock()
        self._loaded: set[str] = set()  # step segment file names folded in, from the spool or the store
        self._kinds_with_files = self._present_kinds()
        if chunk_steps is None:
            chunk_steps = chunk_steps_for(self._world_size() or len(read_rank_meta(run_path)))
        self.chunk_steps = int(chunk_steps)
        for table in ("rollup", RANKS_TABLE):
            self.con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in COLUMNS)})")
        self.digested = 0  # step files folded from their digests rather than their rows
        self._merged_rows = 64  # the table's rows after its last merge (``_compact_if_grown``)
        self.version = 0
        with self._lock:
            if self._fold_store(everything=True):
                self.version += 1
        self.refresh()

    def _world_size(self) -> int | None:
        """The job's world size from one step row: the first spool file's (one footer, one column chunk),
        else the views' (a query that opens every file of a big spool)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted(n for n in _listed(self.run_path, "steps") if is_listed(n))
        if files:
            try:
                path = os.path.join(self.run_path, "steps", files[0])
                column = pq.ParquetFile(path).read_row_group(0, columns=["world_size"]).column(0)
                if len(column) and column[0].is_valid:
                    return int(column[0].as_py())
            except (OSError, ValueError, KeyError, IndexError, pa.ArrowException):
                pass  # read by the query below
        return self.con.execute("SELECT max(world_size) FROM (SELECT world_size FROM steps LIMIT 1)").fetchone()[0]

    def _present_kinds(self) -> frozenset[str]:
        # The first segment name of each folder is enough: checking every segment of every kind at each refresh
        # cost more the longer the run; the step files are checked once, in ``refresh``.
        return frozenset(k for k in KINDS if _any_segment(self.run_path, k))

    def cursor(self):
        """A cursor on the rollup's database, for one caller's queries."""
        return self.con.cursor()

    def refresh(self, listing: Mapping[str, Iterable[str]] | None = None) -> bool:
        """Fold the step segments that appeared since the last call into the rollup; True if any did.
        ``listing``: kind -> the segment names the caller just listed in the run (the dashboard's snapshot
        does), so that only the new ones are looked at, not every segment again (``run_listing``)."""
        with self._lock:
            if listing is not None:
                kinds = frozenset(k for k in KINDS if listing.get(k))
            else:
                kinds = self._present_kinds()
            store_sig = store_signature(self.run_path)
            if kinds != self._kinds_with_files or store_sig != self._store_sig:
                # A kind got its first segment or lost its last (pruned), or a new store was renamed into
                # place: rebuild the views on the run (spool + the store now there).
                self.run.refresh(force=True)  # replaces each kind's table or view
                self._kinds_with_files = kinds
            changed = False
            if store_sig != self._store_sig:
                self._store_sig = store_sig
                changed = self._fold_store(everything=False)
            names = listing.get("steps", ()) if listing is not None else _listed(self.run_path, "steps")
            # A set difference (in C) rather than a look at each name: the run's names grow with its length.
            new = sorted(n for n in _as_set(names) - self._loaded if is_listed(n))
            if new:
                # A file with a digest is folded from it, its rows not read: the footers of the rest alone are
                # checked (``segment_files``; benchmarks/results/onescan_52.md).
                rest = self._fold_digests(new)
                files = segment_files(self.run_path, "steps", rest) if rest else []
                if files:
                    self._fold("read_parquet($files, union_by_name=true)", {"files": files}, segment_columns(files))
                self._loaded.update(n for n in new if n not in rest)
                self._loaded.update(os.path.basename(p) for p in files)
                changed = bool(files) or len(rest) < len(new)
            if changed:
                self._compact_if_grown()
                self.version += 1
            return changed

    def _compact_if_grown(self) -> None:
        """Merge the rollup's rows once they have doubled since the last merge, so that every page query's scan of
        it stops growing with the run: a rank keeps the head's rows (warm-up and ``FINE_STEPS``) plus at most
        ``MAX_COLUMNS`` rows, each as wide as the narrowest column a heatmap of ``MAX_COLUMNS`` columns draws
        (``column_steps``). Every figure in a row is a sum, count, minimum or maximum, so the merged rows give the
        same totals, and every heatmap column the same cells."""
        sql = f"SELECT (SELECT count(*) FROM rollup), max(step_max) FROM {RANKS_TABLE}"  # the totals': no scan
        rows, last = self.con.execute(sql).fetchone()
        if rows <= 2 * self._merged_rows or last is None:
            return
        fine = WARMUP_STEPS + max(FINE_STEPS, 4 * self.chunk_steps)
        key = "CASE WHEN step_min < $fine THEN chunk ELSE -1 - step_min // $width END"
        params = {"fine": fine, "width": column_steps(last, MAX_COLUMNS, self.chunk_steps)}
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute(
                f"CREATE TEMP TABLE _merged AS SELECT {merged_select()} FROM rollup GROUP BY rank, warm, {key}", params
            )
            self.con.execute("DELETE FROM rollup")
            self.con.execute("INSERT INTO rollup SELECT * FROM _merged")
            self.con.execute("DROP TABLE _merged")
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise
        self._merged_rows = self.con.execute("SELECT count(*) FROM rollup").fetchone()[0]

    def _fold_digests(self, names: list[str]) -> list[str]:
        """Fold the step files ``names`` that have a digest under this rollup's definition from their digests; the
        names left to read row by row (all of them, with one warning line, when the digests do not read)."""
        import duckdb

        digests = self._digests_of(names)
        if not digests:
            return names
        try:
            table = read_digests(sorted(digests.values()), with_file=False)
            register_arrow(self.con, "_digest_rows", table)
            try:
                self._append("_digest_rows")
            finally:
                unregister_arrow(self.con, "_digest_rows")
        except (DigestError, duckdb.Error) as exc:
            log.warning("ranksight: step digests do not read (%s); reading the rows instead", exc)
            return names
        self.digested += len(digests)
        return [n for n in names if n not in digests]

    def _digests_of(self, names: list[str]) -> dict[str, str]:
        """File name -> its digest's path under this rollup's definition, for those of ``names`` that have one: a
        ``stat`` per name where they are few beside the files folded so far (a refresh's new files), else one
        listing of the digest folder (``digest_paths``), which holds a digest per step file of the run."""
        steps_dir = os.path.join(self.run_path, "steps")
        if STAT_DIGESTS_BELOW * len(names) >= len(self._loaded):
            return digest_paths(steps_dir, self.chunk_steps, names)
        folder = digest_folder(steps_dir, self.chunk_steps)
        found = {name: os.path.join(folder, name) for name in names}
        # A digest is written before its step file (the publisher's order): a listed file's digest is there.
        return {name: path for name, path in found.items() if os.path.isfile(path)}

    def _fold(self, source: str, params: dict, present: frozenset | None = None) -> None:
        # Segments and stores from an older agent lack newer (nullable) columns: NULL them, as open_run does.
        # ``present``: the columns the files' footers (read by segment_files) hold, so DuckDB need not read them again.
        source = f"(SELECT {select_list(self.con, source, 'steps', params, present=present)} FROM {source})"
        params = {"chunk": self.chunk_steps, "warm": WARMUP_STEPS, **params}
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE _rollup_new AS {fold_sql(source)}", params)
        try:
            self._append("temp._rollup_new")
        finally:
            self.con.execute("DROP TABLE IF EXISTS temp._rollup_new")

    def _append(self, source: str) -> None:
        """Add the rows of ``source`` (a table or view of the rollup's columns, read twice) to the rollup, and their
        totals to ``RANKS_TABLE``'s, in one transaction (a page's query sees both tables of the same refresh) and
        one call (each statement costs DuckDB's fixed overhead again)."""
        cols = ", ".join(c for c, _ in COLUMNS)
        totals = f"SELECT {merged_select()} FROM (SELECT * FROM {RANKS_TABLE} UNION ALL SELECT {cols} FROM {source})"
        try:
            self.con.execute(
                f"BEGIN TRANSACTION; INSERT INTO rollup SELECT {cols} FROM {source}; "
                f"CREATE OR REPLACE TABLE {RANKS_TABLE} AS {totals} GROUP BY rank, warm; COMMIT"
            )
        except Exception:
            with contextlib.suppress(Exception):
                self.con.execute("ROLLBACK")  # where the error came before the end of the transaction
            raise

    def _fold_store(self, everything: bool) -> bool:
        """Fold the store's step rows of segments not folded in yet (all of them at start); True if any.

        Segments a later ingest added are picked by the store's per-row segment name, so they count
        once whether their spool files are still there or were pruned.
        """
        if self._store_sig is None:
            return False
        names = set(ingested_segments(self.con).get("steps", ())) - self._loaded
        if not names:
            return False
        table = f"{STORE_ALIAS}.steps"
        if everything:  # also rows an older ingest wrote without their segment name
            self._fold(table, {})
        else:
            source = f"(SELECT * FROM {table} WHERE {SEGMENT_COLUMN} IN (SELECT unnest($names)))"
            self._fold(source, {"names": sorted(names)})
        self._loaded.update(names)
        return True

    def close(self) -> None:
        """End the reading the rollup lives on (its Run)."""
        self.run.close()


def _as_set(names: Iterable[str]) -> frozenset[str] | set[str]:
    return names if isinstance(names, (set, frozenset)) else set(names)


def _listed(run_path: str, kind: str) -> list[str]:
    """The names in a kind's spool folder (none when it cannot be listed)."""
    try:
        return os.listdir(os.path.join(run_path, kind))
    except OSError:
        return []
