"""A per-rank, per-chunk-of-steps rollup of a run's step records, kept up to date file by file.

Why: the step table of a big job (1,024 ranks x 10,000 steps = 10 M rows) takes ~0.3-1 s to scan on
a small machine, for every panel and every refresh. The rollup scans each spool segment once, sums
the step phases per (rank, chunk of steps) into an in-memory table about ``chunk_steps`` times
smaller, and on refresh reads only the segments that appeared since. Every figure the panels show
is a sum, count, min or max, so partial chunks from two segments simply add up.
"""

from __future__ import annotations

import os
import threading

from ranksight.collectors import (
    PERIOD_SQL,
    PHASE_SQL,
    PHASES,
    SEGMENT_COLUMN,
    STORE_ALIAS,
    ingested_segments,
    open_run,
    read_rank_meta,
    segment_columns,
    segment_files,
    select_list,
    store_signature,
)
from ranksight.schema import KINDS

WARMUP_STEPS = 5
"""Leading steps per rank kept apart (compilation, allocator and bucket warm-up), as in ``step_breakdown``."""

# Column -> SQL summed per rollup row; step_sum is the step period, as in ``step_breakdown``.
_SUMS = {**{p: PHASE_SQL[p] for p in PHASES}, "step_s": PERIOD_SQL, "allreduce_s": "allreduce_s"}


def chunk_steps_for(world_size: int) -> int:
    """Steps per rollup row: 1 for small jobs (full detail), 64 at 1,024 ranks (~16 rollup rows per step)."""
    return max(1, int(world_size) // 16)


class Rollup:
    """An in-memory DuckDB database with the run's spool views plus the ``rollup`` table.

    ``refresh()`` is cheap when nothing changed (one directory listing per kind). Connections for
    queries come from ``cursor()``; DuckDB cursors of one database may be used from several threads.
    """

    def __init__(self, run_path: str, chunk_steps: int | None = None) -> None:
        self.run_path = run_path
        self._store_sig = store_signature(run_path)  # before attaching: a newer store is then seen as new
        self.con = open_run(run_path)
        self._lock = threading.Lock()
        self._loaded: set[str] = set()  # step segment file names folded in, from the spool or the store
        self._kinds_with_files = self._present_kinds()
        if chunk_steps is None:
            ws = self.con.execute("SELECT max(world_size) FROM (SELECT world_size FROM steps LIMIT 1)").fetchone()[0]
            chunk_steps = chunk_steps_for(ws or len(read_rank_meta(run_path)))
        self.chunk_steps = int(chunk_steps)
        sums = ", ".join(f"{c[:-2]}_sum DOUBLE" for c in _SUMS)
        self.con.execute(
            f"""CREATE TABLE rollup (rank INTEGER, node VARCHAR, chunk BIGINT, warm BOOLEAN, n BIGINT,
                step_min BIGINT, step_max BIGINT, t_min BIGINT, t_max BIGINT, {sums},
                compute_eff_sum DOUBLE, step_max_s DOUBLE, h2d_n BIGINT)"""
        )
        self.version = 0
        with self._lock:
            if self._fold_store(everything=True):
                self.version += 1
        self.refresh()

    def _present_kinds(self) -> frozenset[str]:
        return frozenset(k for k in KINDS if segment_files(self.run_path, k))

    def cursor(self):
        """A cursor on the rollup's database, for one caller's queries."""
        return self.con.cursor()

    def refresh(self) -> bool:
        """Fold the step segments that appeared since the last call into the rollup; True if any did."""
        with self._lock:
            kinds, store_sig = self._present_kinds(), store_signature(self.run_path)
            if kinds != self._kinds_with_files or store_sig != self._store_sig:
                # A kind got its first segment or lost its last (pruned), or a new store was renamed into
                # place: rebuild the views on the run (spool + the store now there).
                open_run(self.run_path, self.con)  # replaces each kind's table or view
                self._kinds_with_files = kinds
            changed = False
            if store_sig != self._store_sig:
                self._store_sig = store_sig
                changed = self._fold_store(everything=False)
            files = [p for p in segment_files(self.run_path, "steps") if os.path.basename(p) not in self._loaded]
            if files:
                self._fold("read_parquet($files, union_by_name=true)", {"files": files}, segment_columns(files))
                self._loaded.update(os.path.basename(p) for p in files)
                changed = True
            if changed:
                self.version += 1
            return changed

    def _fold(self, source: str, params: dict, present: frozenset | None = None) -> None:
        # Segments and stores from an older agent lack newer (nullable) columns: NULL them, as open_run does.
        # ``present``: the columns the files' footers (read by segment_files) hold, so DuckDB need not read them again.
        source = f"(SELECT {select_list(self.con, source, 'steps', params, present=present)} FROM {source})"
        sums = ", ".join(f"sum({sql}) AS {c[:-2]}_sum" for c, sql in _SUMS.items())
        self.con.execute(
            f"""
            INSERT INTO rollup
            SELECT rank, any_value(node), step // $chunk AS chunk, step < $warm AS warm, count(*),
                   min(step), max(step), min(time_ns), max(time_ns), {sums},
                   sum(coalesce(gpu_compute_s, compute_s)), max({PERIOD_SQL}), count(h2d_s)
            FROM {source} GROUP BY rank, chunk, warm
            """,
            {"chunk": self.chunk_steps, "warm": WARMUP_STEPS, **params},
        )

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
            where = f"(SELECT * FROM {table} WHERE {SEGMENT_COLUMN} IN (SELECT unnest($names)))"
            self._fold(where, {"names": sorted(names)})
        self._loaded.update(names)
        return True

    def close(self) -> None:
        self.con.close()
