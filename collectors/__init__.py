"""Get the records of all ranks into one queryable place (DuckDB), live and after a crash."""

from ._queries import PHASES, step_breakdown
from ._spool_reader import RankMeta, RunDirError, check_run_dir, open_run, read_rank_meta, segment_glob

__all__ = [
    "PHASES",
    "step_breakdown",
    "RankMeta",
    "RunDirError",
    "check_run_dir",
    "open_run",
    "read_rank_meta",
    "segment_glob",
]
