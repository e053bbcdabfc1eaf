"""Get the records of all ranks into one queryable place (DuckDB), live and after a crash."""

from ._features import FEATURES, compute_features, run_features
from ._prometheus_reader import PrometheusError, PrometheusReader
from ._queries import PERIOD_SQL, PHASE_SQL, PHASES, step_breakdown
from ._spool_reader import (
    STORE_ALIAS,
    RankMeta,
    RunDirError,
    check_run_dir,
    open_run,
    read_rank_meta,
    segment_glob,
    select_list,
)
from ._store import (
    PRUNE_AFTER_S,
    SEGMENT_COLUMN,
    IngestResult,
    PruneResult,
    ingest,
    ingested_segments,
    prune,
    store_path,
)

__all__ = [
    "FEATURES",
    "compute_features",
    "run_features",
    "PHASES",
    "PHASE_SQL",
    "PERIOD_SQL",
    "step_breakdown",
    "IngestResult",
    "PruneResult",
    "ingest",
    "prune",
    "ingested_segments",
    "SEGMENT_COLUMN",
    "PRUNE_AFTER_S",
    "STORE_ALIAS",
    "store_path",
    "PrometheusError",
    "PrometheusReader",
    "RankMeta",
    "RunDirError",
    "check_run_dir",
    "open_run",
    "read_rank_meta",
    "segment_glob",
    "select_list",
]
