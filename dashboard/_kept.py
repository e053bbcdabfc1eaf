"""The rows of a live run the dashboard has read, kept in memory and added to file by file: what its verdict is
made from at each refresh.

Why: the rules' ``diagnose`` asks about 30 queries of the run, and over the run's files each one opens every
segment again: on a 2-rank demo, 0.34-0.56 CPU-s per verdict at 115 segments per record kind (600 steps), and
growing with every flush. Over these tables, each refresh reads only
the segments written since, and the verdict reads memory. Beyond ``KEEP_STEP_ROWS`` step rows, for a run
whose step files come with digests (the node spool's), or once an ``ingest`` has compacted the run into a
store, the dashboard judges the run's own reading instead (``open_run``), as before.
"""

from __future__ import annotations

import os

import duckdb

from ranksight.collectors import Run, open_segments, segment_files, store_path
from ranksight.format.digest import DIGEST_DIR
from ranksight.format.schema import KINDS, duckdb_columns

KEEP_STEP_ROWS = 2_000_000
"""Step rows kept in memory at most (2 ranks x 1 M steps, 1,024 ranks x ~2,000 steps: a few hundred MB with
the other kinds); a bigger run is judged from its files."""


class KeptRows:
    """One table per record kind on an in-memory DuckDB database, holding every row of the segments read so far."""

    def __init__(self, run_path: str) -> None:
        self.path = run_path
        self.con = duckdb.connect()
        for kind in KINDS:
            self.con.execute(f"CREATE TABLE {kind} ({duckdb_columns(kind)})")
        self._read: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self.step_rows = 0

    @staticmethod
    def suits(run_path: str) -> bool:
        """Whether a run is judged from kept rows: a spool without step digests. A compacted run's rows are in
        its store; where the node spool wrote a digest beside each step file, the verdict reads those instead,
        which costs less (at 1,024 ranks: 0.92 CPU-s at 4,000 steps from the digests, 3.49 at 2,000 from 2 M
        kept rows; from the digests and the kept medians, ``open_run(incremental=True)``, 0.56 at 2,000)."""
        digests = os.path.join(run_path, "steps", DIGEST_DIR)
        return not os.path.exists(store_path(run_path)) and not os.path.isdir(digests)

    def take_in(self, listing: dict[str, frozenset[str]]) -> bool:
        """Add the rows of the segments in ``listing`` (kind -> the segment names in its folder now) not read
        yet; True when there were any. A segment that does not read sends that kind through ``segment_files``,
        which leaves damaged files out (with one warning line) as every reader does."""
        fresh = {kind: sorted(names - self._read[kind]) for kind, names in listing.items() if kind in self._read}
        changed = False
        for kind, names in fresh.items():
            if not names:
                continue
            paths = [os.path.join(self.path, kind, n) for n in names]
            try:
                self._insert(kind, paths)
            except duckdb.Error:
                good = set(segment_files(self.path, kind))
                self._insert(kind, [p for p in paths if p in good])
            self._read[kind].update(names)
            changed = True
        return changed

    def _insert(self, kind: str, paths: list[str]) -> None:
        """Append the rows of ``paths`` to the kind's table: read on the kept database itself (a reading of its
        own, ``open_segments``, cost a DuckDB connection per kind and refresh: 40 % of a refresh), columns
        matched by name, so a segment of an older agent without a newer column reads as NULL there."""
        if not paths:
            return
        try:
            self.con.execute(
                f"INSERT INTO {kind} BY NAME SELECT * FROM read_parquet($files, union_by_name = true)",
                {"files": paths},
            )
        except duckdb.Error:  # a column of another type or name than the schema's: the readers' own reading
            reading = open_segments(self.path, {kind: paths})
            try:
                rows = reading.sql(f"SELECT * FROM {kind}").to_arrow_table()
            finally:
                reading.close()
            self.con.register("_fresh", rows)
            try:
                self.con.execute(f"INSERT INTO {kind} BY NAME SELECT * FROM _fresh")
            finally:
                self.con.unregister("_fresh")
        if kind == "steps":
            self.step_rows = self.con.execute("SELECT count(*) FROM steps").fetchone()[0]

    def run(self) -> Run:
        """A ``Run`` over the kept tables: a new one per refresh, so no figure of the last one is reused."""
        return Run(self.path, self.con.cursor(), make_views=False)

    def close(self) -> None:
        self.con.close()
