"""Get the records of all ranks into one queryable place (DuckDB), live and after a crash.

The run directory belongs to this package: the CLI, the rules and the dashboard find runs
(``list_runs``), read them (``open_run``, ``read_rank_meta``, ``spool_signature``, ``segment_files``)
and compact them (``ingest``, ``prune``) through the names below, never through its modules.
"""

from ranksight.format.phases import breakdown_total

from ._digest_source import expect_verdict
from ._features import CONTEXT, CONTEXT_DEFAULTS, FEATURES, compute_context, compute_features
from ._prometheus_reader import PrometheusError, PrometheusReader
from ._queries import PERIOD_SQL, PHASE_SQL, PHASES, kept_steps_sql, step_breakdown, steps_source
from ._rollup import Rollup
from ._run import Run, open_run, open_segments, run_features
from ._rundir import (
    QUARANTINE_DIR,
    RankMeta,
    RunDirError,
    SkippedFile,
    StoreError,
    check_run_dir,
    segment_columns,
    segment_files,
    spool_signature,
    store_path,
    store_signature,
)
from ._runs import FINAL_STATUSES, LIVE_FLUSHES, LOST_STATUS, list_runs, rank_is_live, read_rank_meta
from ._spool_reader import skipped_files
from ._store import PRUNE_AFTER_S, IngestResult, PruneResult, ingest, prune
from ._tables import (
    DIGESTS_TABLE,
    SEGMENT_COLUMN,
    STORE_ALIAS,
    ingested_segments,
    register_arrow,
    select_list,
    stored_digests,
    unregister_arrow,
)
from ._trace_import import ImportResult, find_trace_files, import_traces

__all__ = [
    # finding and reading runs
    "FINAL_STATUSES",
    "LIVE_FLUSHES",
    "LOST_STATUS",
    "RankMeta",
    "Rollup",
    "Run",
    "RunDirError",
    "check_run_dir",
    "list_runs",
    "open_run",
    "open_segments",
    "rank_is_live",
    "read_rank_meta",
    "segment_columns",
    "segment_files",
    "spool_signature",
    # files readers left out, and why (damaged or foreign segments, a store that is not ours)
    "QUARANTINE_DIR",
    "SkippedFile",
    "StoreError",
    "skipped_files",
    # queries and features over an open run
    "CONTEXT",
    "CONTEXT_DEFAULTS",
    "FEATURES",
    "compute_context",
    "kept_steps_sql",
    "steps_source",
    "PERIOD_SQL",
    "PHASES",
    "PHASE_SQL",
    "compute_features",
    "expect_verdict",
    "run_features",
    "breakdown_total",
    "step_breakdown",
    # the compacted store
    "PRUNE_AFTER_S",
    "IngestResult",
    "PruneResult",
    "ingest",
    "prune",
    "store_path",
    "store_signature",
    # what open_run defines on its connection, for readers that add their own views (the dashboard's rollup)
    "DIGESTS_TABLE",
    "SEGMENT_COLUMN",
    "STORE_ALIAS",
    "ingested_segments",
    "select_list",
    "stored_digests",
    "register_arrow",
    "unregister_arrow",
    # torch.profiler traces -> a run (ranksight import)
    "ImportResult",
    "find_trace_files",
    "import_traces",
    # multi-node jobs
    "PrometheusError",
    "PrometheusReader",
]
