"""Get the records of all ranks into one queryable place (DuckDB), live and after a crash.

The run directory belongs to this package: the CLI, the rules, the dashboard and the exporters find runs
(``list_runs``, ``read_rank_meta``), read them (``open_run`` gives a ``Run``, whose methods are the figures:
``breakdown``, ``total``, ``features``, ``context``, ``rollup`` ...) and compact them (``ingest``, ``prune``)
through the names below. The query functions behind the Run live in the modules, every step figure read from one
summary relation of the run's step rows (``Run.summary``, made in ``_summary``); callers ask the Run, never them.
"""

from ._features import CONTEXT, CONTEXT_DEFAULTS, FEATURES
from ._prometheus_reader import PrometheusError, PrometheusReader
from ._queries import PHASES
from ._rank_files import RankMeta
from ._rollup import Rollup
from ._run import Run, open_run, open_segments
from ._rundir import RunDirError, SkippedFile, StoreError, spool_signature, store_path
from ._runs import FINAL_STATUSES, LIVE_FLUSHES, LOST_STATUS, list_runs, rank_is_live, read_rank_meta
from ._segment_checks import segment_files
from ._spool_digests import SpoolDigests, digest_spool
from ._store import PRUNE_AFTER_S, IngestResult, PruneResult, ingest, prune

__all__ = [
    # finding runs, and whether their ranks still write
    "FINAL_STATUSES",
    "LIVE_FLUSHES",
    "LOST_STATUS",
    "RankMeta",
    "list_runs",
    "rank_is_live",
    "read_rank_meta",
    # reading one: a Run and its figures
    "Rollup",
    "Run",
    "open_run",
    "open_segments",
    "segment_files",
    "spool_signature",
    # what the figures are named (the rules' features and context, the breakdown's phases)
    "CONTEXT",
    "CONTEXT_DEFAULTS",
    "FEATURES",
    "PHASES",
    # errors, and the files a reading left out (Run.skipped)
    "RunDirError",
    "SkippedFile",
    "StoreError",
    # the compacted store
    "PRUNE_AFTER_S",
    "IngestResult",
    "PruneResult",
    "ingest",
    "prune",
    "SpoolDigests",
    "digest_spool",
    "store_path",
    # multi-node jobs
    "PrometheusError",
    "PrometheusReader",
]
