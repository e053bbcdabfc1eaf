"""``open_run(path) -> Run``: a run folder opened for reading, the one object a reader holds.

Why an object: a reading is more than its DuckDB views. It knows which files it left out and where its step
rows' summary relation comes from (``_summary``); a verdict asks a dozen queries of the same reading, and the
relation it makes first is the one every figure reads. Held by the Run (as Holistic Trace Analysis' ``Trace``
holds a parsed trace), that state goes where the reading goes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ranksight.format.phases import breakdown_total
from ranksight.format.schema import duckdb_columns
from ranksight.format.warmup import WARMUP_STEPS

from ._features import compute_context, compute_features
from ._queries import (
    step_breakdown,
    step_series,
    steps_recorded,
    stretch_figures,
)
from ._rank_files import RankMeta
from ._rollup import Rollup
from ._rundir import SkippedFile, spool_signature, store_signature
from ._runs import read_rank_meta
from ._spool_reader import open_views, reading_connection
from ._summary import KeptDigests, Sources, Summary, summarize
from ._tables import quiet_connection, select_list, sql_list


class Run:
    """A run folder's records, read: DuckDB views per record kind plus what the reading knows about them.

    Make one with ``open_run`` (or ``open_segments``). Each figure is kept for the reading (ask twice, read
    once), every step figure read from one ``summary`` relation. Every method of the DuckDB connection (``con``)
    works on the views, so code written for the connection reads a Run as well.
    """

    def __init__(
        self, path: str, con=None, *, follow_spool: bool = True, make_views: bool = True, incremental: bool = False
    ) -> None:
        """Use ``open_run``. ``make_views=False``: a Run over the views ``con`` already has, which ``refresh``
        leaves alone."""
        self.path = path
        """The run folder."""
        self.follow_spool = follow_spool
        """Whether the views glob the spool at each query (``open_run``)."""
        self.incremental = incremental
        """Whether ``refresh`` brings this reading up to date again and again (``open_run``)."""
        self._skipped: list[SkippedFile] = []
        self._sources: Sources | None = None
        self._kept_digests = KeptDigests() if incremental else None
        self._con = con if con is not None else reading_connection()
        self._kept: dict = {}
        self._ranks: list[RankMeta] | None = None
        self._signature = None
        self._rollup: Rollup | None = None
        if make_views:
            self._open(reopened=con is not None)

    def _open(self, *, reopened: bool) -> None:
        self._signature = (spool_signature(self.path), store_signature(self.path))
        self._skipped, self._sources = open_views(
            self, self.path, reopened=reopened, follow_spool=self.follow_spool, incremental=self.incremental
        )
        for key, kept in self._kept.items():  # the relations of the last opening: their tables go
            if key[0] == "summary":
                self._con.execute(f"DROP TABLE IF EXISTS {kept.sums}; DROP TABLE IF EXISTS {kept.steps}")
        self._kept = {}
        self._ranks = None

    # ------------------------------------------------------------------ the reading itself

    @property
    def con(self):
        """The DuckDB connection the views live on (one thread at a time; ``cursor()`` for another)."""
        return self._con

    def execute(self, sql: str, parameters=None):
        """Run ``sql`` over the views (DuckDB's ``execute``)."""
        return self._con.execute(sql) if parameters is None else self._con.execute(sql, parameters)

    def __getattr__(self, name: str):
        # Everything else a DuckDB connection offers (sql, cursor, register, fetchall, ...), on the views.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._con, name)

    def close(self) -> None:
        """End the reading (the connection and what DuckDB holds for it)."""
        self._con.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Run({self.path!r})"

    @property
    def store_signature_at_open(self):
        """The run's store as this reading's views found it (``store_signature``, taken before they were made)."""
        return None if self._signature is None else self._signature[1]

    @property
    def ranks(self) -> list[RankMeta]:
        """Each rank's metadata file (identity, status, heartbeat, facts), read once per reading."""
        if self._ranks is None:
            self._ranks = read_rank_meta(self.path)
        return self._ranks

    @property
    def skipped(self) -> list[SkippedFile]:
        """The files this reading left out of its views, and why: each a ``SkippedFile`` (``path``, ``reason``),
        a damaged spool segment or one of another schema, also logged once as a warning line."""
        return list(self._skipped)

    def refresh(self, *, force: bool = False) -> bool:
        """Take in the segments and store written since this reading: True when anything changed (the views
        are made again, the kept figures dropped); one directory listing and one stat when nothing did."""
        if self._signature is None or (
            not force and (spool_signature(self.path), store_signature(self.path)) == self._signature
        ):
            return False
        self._open(reopened=True)
        return True

    # ------------------------------------------------------------------ the window and the relation

    @property
    def end_ns(self) -> int | None:
        """When the last step row of this reading ended (Unix ns); None before the first."""
        return self._steps_max("time_ns")

    def since_ns(self, window_s: float | None) -> int | None:
        """The start (Unix ns) of the last ``window_s`` seconds of the run's steps; None for the whole run
        (``window_s`` None, or no step yet)."""
        if window_s is None or self.end_ns is None:
            return None
        return int(self.end_ns - window_s * 1e9)

    def summary(self, *, warmup_steps: int = WARMUP_STEPS, window: float | None = None) -> Summary:
        """The summary relation of the step rows (``_summary``) every step figure of this reading is read from,
        made on the first call; ``read_from`` says where its parts came from."""
        return self.summary_for(warmup_steps, self.since_ns(window))

    def summary_for(self, warmup_steps: int, since_ns: int | None) -> Summary:
        """``summary`` of the steps that ended after ``since_ns`` (the query functions' call)."""
        return self._once(
            ("summary", warmup_steps, since_ns),
            lambda: summarize(
                self, self._sources, warmup_steps, since_ns, incremental=self.incremental, kept=self._kept_digests
            ),
        )

    # ------------------------------------------------------------------ figures

    def _once(self, key: tuple, make):
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def breakdown(self, *, warmup_steps: int = WARMUP_STEPS, window: float | None = None) -> list[dict]:
        """Per rank: steps, median and mean step period, each phase's share (``step_breakdown``); over the
        last ``window`` seconds of the run's steps when given."""
        since = self.since_ns(window)
        return self._once(("breakdown", warmup_steps, since), lambda: step_breakdown(self, warmup_steps, since))

    def total(self, *, warmup_steps: int = WARMUP_STEPS, window: float | None = None) -> dict:
        """All ranks in one row (``breakdown_total`` of ``breakdown``)."""
        return breakdown_total(self.breakdown(warmup_steps=warmup_steps, window=window))

    def features(self, *, warmup_steps: int = WARMUP_STEPS, window: float | None = None) -> dict[int, dict]:
        """Per rank, the features the rules judge (``FEATURES``), from the breakdown this reading keeps."""
        since = self.since_ns(window)

        def make() -> dict[int, dict]:
            rows = self.breakdown(warmup_steps=warmup_steps, window=window)
            return compute_features(self, self.ranks, warmup_steps, rows, since)

        return self._once(("features", warmup_steps, since), make)

    def context(self, *, warmup_steps: int = WARMUP_STEPS, window: float | None = None) -> Mapping[int, dict]:
        """Per rank, the context strings fix templates are fitted to (``CONTEXT``)."""
        since = self.since_ns(window)
        features = self.features(warmup_steps=warmup_steps, window=window)
        return self._once(
            ("context", warmup_steps, since),
            lambda: compute_context(self, self.ranks, features, warmup_steps, since),
        )

    def rollup(self, chunk_steps: int | None = None) -> Rollup:
        """The per-rank, per-chunk-of-steps rollup of the step records (the dashboard's panels read it), made
        on the first call (``chunk_steps`` by default from the world size) and brought up to date with the
        segments written since on each later one; it lives beside the views, on this reading's connection."""
        if self._rollup is None or (chunk_steps is not None and int(chunk_steps) != self._rollup.chunk_steps):
            self._rollup = Rollup(self, chunk_steps)
        else:
            self._rollup.refresh()
        return self._rollup

    @property
    def last_step(self) -> int | None:
        """The highest step number any rank recorded; None before the first step row."""
        return self._steps_max("step")

    def _steps_max(self, column: str) -> int | None:
        found = self._once((column,), lambda: self._con.execute(f"SELECT max({column}) FROM steps").fetchone()[0])
        return None if found is None else int(found)

    def steps_recorded(self) -> dict[int, int]:
        """Per rank, how many step rows it recorded, warm-up included (what a kept count is a part of)."""
        return self._once(("steps_recorded",), lambda: steps_recorded(self))

    def step_series(self, *, warmup_steps: int = WARMUP_STEPS) -> list[tuple[int, float]]:
        """(end time ns, mean period across ranks) per step after warm-up, in time order: where a recent
        window's step time began (``rules.diagnose(since_s=...)``)."""
        return self._once(("step_series", warmup_steps), lambda: step_series(self, warmup_steps))

    def stretches(self, width: int, *, warmup_steps: int = 0) -> list[dict]:
        """Per stretch of ``width`` steps and rank: ``stretch``, ``rank``, ``last_step``, ``step_time_s``
        (median), each ``<phase>_share`` and ``gpu_utilization`` (None where not sampled). A tracker logs a
        bounded number of points whatever the step rate; ``warmup_steps`` 0 keeps every step, so each
        stretch of a live run counts once."""
        return self._once(("stretches", int(width), warmup_steps), lambda: stretch_figures(self, width, warmup_steps))


def open_run(run_path: str | os.PathLike, con=None, *, follow_spool: bool = True, incremental: bool = False) -> Run:
    """Open a run folder for reading: a ``Run`` over one DuckDB view per record kind.

    The views read the compacted store (``store.duckdb``, written by ``ranksight ingest``) when there is one,
    plus every spool segment that store has not ingested yet, so a run reads the same whether it is live,
    finished, compacted or half-compacted, and no row is counted twice. A kind with no records yet gets an
    empty table of the right schema, so queries never fail on a young run.

    ``follow_spool`` (the default) makes the views glob the spool at each query, so segments written later
    show up without opening again; a ``prune`` running meanwhile can fail a query (``refresh`` or open again).
    ``follow_spool=False`` names the segments there now instead: no prune can break those views within the
    grace period (``PRUNE_AFTER_S``), and new segments show up at the next ``refresh``. For a reader that
    opens once and answers (the CLI), not for one that keeps its reading.

    ``incremental``: a reading that ``refresh`` brings up to date again and again (the live dashboard's, with
    ``follow_spool=False``): its pending segments are not read into memory at each opening; the reading keeps
    the step digests' parts it read (``KeptDigests``) and the process the per-rank medians (``_median_fold``),
    each fed only the files added since.

    ``con``: a DuckDB connection to make the views on (the dashboard's rollup adds its own tables beside
    them); by default a new one. Segments that cannot be read are left out (``Run.skipped``); a
    ``store.duckdb`` that is not a ranksight store raises ``StoreError`` (a ``RunDirError``) naming it:
    reading around it could give a verdict on part of the run without saying so.
    """
    if isinstance(con, Run):
        con.refresh(force=True)
        return con
    return Run(os.fspath(run_path), con, follow_spool=follow_spool, incremental=incremental)


def open_segments(run_path: str, files: dict[str, list[str]]) -> Run:
    """A ``Run`` over exactly the segment files given per record kind (``segment_files``' paths), not the
    store nor the rest of the spool: a live follower reads each new segment once. A kind without files reads
    as an empty table; ``refresh`` leaves the reading as it is."""
    con = quiet_connection()
    for kind, paths in files.items():
        if paths:
            source = f"read_parquet({sql_list(paths)}, union_by_name = true)"
            con.execute(f"CREATE TEMP VIEW {kind} AS SELECT {select_list(con, source, kind)} FROM {source}")
        else:
            con.execute(f"CREATE TEMP TABLE {kind} ({duckdb_columns(kind)})")
    return Run(run_path, con, make_views=False)
