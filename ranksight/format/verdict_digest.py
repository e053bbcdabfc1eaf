"""The verdict's part of a step digest: what ``diagnose()`` reads of a file's rows, folded where they are written.

Why: at 1,024 ranks x 10,000 steps the verdict's feature queries read every step row four times (per-rank
medians and sums, and two per-step comparisons across ranks): 4-5 s on a live spool on 2 cores, against a
1 s target (docs/scale.md). The node spool's publisher holds each file's rows when it writes it, so it also
folds them into three small tables, written in the file's digest (``ranksight.format.digest``):

- ``sums``: per (rank, warm-up or not), the sums, counts and sums of squares the per-rank figures need;
- ``hist``: per (rank, warm-up or not, figure), a histogram of the figures whose per-rank median the rules
  read: durations in logarithmic buckets ``RELATIVE_ERROR`` wide (a median read from them is within 0.5 %
  of the exact one, and exact where a bucket holds one value), whole numbers (bucket counts, bytes) one
  bucket per value (exact);
- ``steps``: per (step, warm-up or not), what each comparison across ranks keeps of the file's ranks: the
  least and second-least wait at collectives and who waited least, the longest compute and whose it was.

Like the readers' queries over rows, every part leaves out a GPU rank's steps without CUDA events
(``ranksight.format.phases.SAMPLED_SQL``). Every column is a sum, count, minimum or maximum (or the value of the row
holding one), so a rank's or a step's rows spread over several files merge exactly. Text only (no imports of
the readers): the publisher is part of the agent."""

from __future__ import annotations

import math
import re

from .phases import BLOCKED_SQL, GRAD_COMM_SQL, PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL
from .warmup import WARM_SQL

RELATIVE_ERROR = 0.005
"""Largest relative error of a duration's median read from ``hist``: buckets (1 - a, 1 + a) apart."""
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
ZERO_BUCKET = -(2**62)
"""The bucket of durations of 0 (or below: a clock that stepped back), read as 0."""

_DATA = PHASE_SQL["data_wait_s"]
_BLOCKED_OR_NULL = f"CASE WHEN comm_blocked_s IS NULL AND gpu_comm_blocked_s IS NULL THEN NULL ELSE {BLOCKED_SQL} END"
_DATA_SHARE = f"({_DATA}) / nullif({PERIOD_SQL}, 0)"

SUMS_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("n", "BIGINT", "count(*)"),
    ("node", "VARCHAR", "any_value(node)"),
    ("period_sum", "DOUBLE", f"sum({PERIOD_SQL})"),
    ("exposed_sum", "DOUBLE", "sum(comm_exposed_s)"),
    ("allreduce_sum", "DOUBLE", "sum(allreduce_s)"),
    ("bytes_sum", "DOUBLE", "sum(bucket_bytes) FILTER (WHERE allreduce_s > 0)"),
    ("gpu_rows", "BIGINT", "count(gpu_compute_s)"),
    ("world_size", "BIGINT", "max(world_size)"),
    ("grad_comm_sum", "DOUBLE", f"sum({GRAD_COMM_SQL})"),
    ("blocked_sum", "DOUBLE", f"sum({_BLOCKED_OR_NULL})"),
    ("data_share_n", "BIGINT", f"count({_DATA_SHARE})"),
    ("data_share_sum", "DOUBLE", f"sum({_DATA_SHARE})"),
    ("data_share_sq", "DOUBLE", f"sum(({_DATA_SHARE}) * ({_DATA_SHARE}))"),
    ("step_min", "BIGINT", "min(step)"),
    ("step_max", "BIGINT", "max(step)"),
    *((f"{p[:-2]}_sum", "DOUBLE", f"sum({PHASE_SQL[p]})") for p in PHASES),
    ("data_wait_host_sum", "DOUBLE", "sum(data_wait_s)"),
)
"""Per (rank, warm) of ``sums``: column, type, SQL over the file's rows. The phase sums are the breakdown's
(``step_breakdown`` reads two rows per rank and file, not the rollup's row per chunk of steps)."""

MEDIANS: dict[str, tuple[str, bool]] = {
    "period": (PERIOD_SQL, False),
    "compute": ("compute_s", False),
    "gpu_compute": ("gpu_compute_s", False),
    "buckets": ("buckets", True),
    "bucket_bytes": ("bucket_bytes", True),
    "collectives": ("collectives", True),
    "collective_bytes": ("collective_bytes", True),
}
"""Figure -> (SQL of one row's value, whole numbers: one bucket per value) of ``hist``."""

_TOTAL_WAIT = f"({GRAD_COMM_SQL}) + ({BLOCKED_SQL})"
LEAST_KEY = f"({_TOTAL_WAIT}, rank)"
"""Who waited least at a step: the least total wait, the lowest rank among equal waits (a tie -- two ranks
that waited nothing -- names the same rank whichever order the rows are read in, here and in the rows'
query, ``collectors._queries``)."""
_CPU = "CASE WHEN gpu_step_s IS NULL THEN cpu_s END"
_BUSY = f"{PERIOD_SQL} - ({GRAD_COMM_SQL}) - ({BLOCKED_SQL}) - coalesce(data_wait_s, 0)"

STEPS_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("n", "INTEGER", "count(*)"),
    ("period_sum", "DOUBLE", f"sum({PERIOD_SQL})"),
    ("grad_min", "DOUBLE", f"min({GRAD_COMM_SQL})"),
    ("blocked_min", "DOUBLE", f"min({BLOCKED_SQL})"),
    ("timed", "BOOLEAN", "bool_or(comm_blocked_s IS NOT NULL OR gpu_comm_blocked_s IS NOT NULL)"),
    ("least", "DOUBLE", f"min({_TOTAL_WAIT})"),
    ("second", "DOUBLE", f"CASE WHEN count(*) >= 2 THEN min({_TOTAL_WAIT}, 2)[2] END"),
    ("least_rank", "INTEGER", f"arg_min(rank, {LEAST_KEY})"),
    ("cpu_n", "INTEGER", f"count({_CPU})"),
    ("cpu_sum", "DOUBLE", f"sum({_CPU})"),
    ("cpu_key", "DOUBLE", f"min({_TOTAL_WAIT}) FILTER (WHERE ({_CPU}) IS NOT NULL)"),
    ("cpu_key_rank", "INTEGER", f"arg_min(rank, {LEAST_KEY}) FILTER (WHERE ({_CPU}) IS NOT NULL)"),
    ("least_cpu", "DOUBLE", f"arg_min({_CPU}, {LEAST_KEY}) FILTER (WHERE ({_CPU}) IS NOT NULL)"),
    ("least_busy", "DOUBLE", f"arg_min({_BUSY}, {LEAST_KEY})"),
    ("compute_n", "INTEGER", "count(compute_s)"),
    ("compute_max", "DOUBLE", "max(compute_s)"),
    ("compute_rank", "INTEGER", "arg_max(rank, compute_s) FILTER (WHERE compute_s IS NOT NULL)"),
    ("gpu_compute_n", "INTEGER", "count(gpu_compute_s)"),
    ("gpu_compute_max", "DOUBLE", "max(gpu_compute_s)"),
    ("gpu_compute_rank", "INTEGER", "arg_max(rank, gpu_compute_s) FILTER (WHERE gpu_compute_s IS NOT NULL)"),
)
"""Per (step, warm) of ``steps``: column, type, SQL over the file's rows. Counts are 32-bit (a step's ranks) and
a column that is NULL on every row of a file (a CPU job's GPU figures, a GPU job's CPU-timed ones) is left
out of its digest (``ranksight.format.digest``): this part has a row per step and file, 1.28 M rows at 1,024 ranks
x 10,000 steps, and a fresh reader's time goes with its bytes."""


def sums_sql(source: str) -> str:
    """SELECT of ``sums`` rows of the step rows in ``source``; parameter ``$warm``."""
    cols = ", ".join(f"CAST({sql} AS {t}) AS {c}" for c, t, sql in SUMS_COLUMNS)
    return f"SELECT rank, {WARM_SQL} AS warm, {cols} FROM {source} WHERE {SAMPLED_SQL} GROUP BY rank, warm"


def bucket_sql(value: str, whole: bool) -> str:
    """The ``hist`` bucket of one value (NULL stays NULL and is not counted)."""
    if whole:
        return f"CAST({value} AS BIGINT)"
    return (
        f"CASE WHEN {value} IS NULL THEN NULL WHEN {value} <= 0 THEN {ZERO_BUCKET}"
        f" ELSE CAST(ceil(ln({value}) / {_LOG_GAMMA!r}) AS BIGINT) END"
    )


def bucket_values(bucket, lo, hi):
    """The values ``hist`` buckets stand for (numpy arrays in, one out): their values' own where they are all
    one (whole numbers, a duration repeated), else the point of the bucket whose relative distance to every
    value in it is at most ``RELATIVE_ERROR``, kept within the least and greatest value the bucket holds."""
    import numpy as np

    with np.errstate(over="ignore", under="ignore"):
        point = 2 * np.exp(bucket.astype(np.float64) * _LOG_GAMMA) / (GAMMA + 1)
    return np.where(lo == hi, lo, np.clip(point, lo, hi))


def medians_of(rows) -> dict:
    """{(rank, figure): median} from ``hist`` rows -- numpy arrays ``rank``, ``figure`` (numbers), ``bucket``,
    ``n``, ``lo``, ``hi``, in any order, a bucket on several rows where several files hold it -- the way
    DuckDB's median reads the values: the mean of the two middle ones (one for an odd count). Sorted (unless
    ``_grouped``) and merged here: a GROUP BY ... ORDER BY in DuckDB sorted the same rows more slowly."""
    import numpy as np

    if not len(rows["n"]):
        return {}
    rank, figure, bucket, lo, hi = (np.asarray(rows[c]) for c in ("rank", "figure", "bucket", "lo", "hi"))
    n = np.asarray(rows["n"]).astype(np.int64)
    if not _grouped(rank, figure, bucket):
        order = np.lexsort((bucket, figure, rank))
        rank, figure, bucket, lo, hi, n = (a[order] for a in (rank, figure, bucket, lo, hi, n))
    same_key = (rank[1:] == rank[:-1]) & (figure[1:] == figure[:-1])
    same_bucket = same_key & (bucket[1:] == bucket[:-1])
    if same_bucket.any():  # one row per bucket, merged as MERGED_HIST merges them in SQL: n added, lo/hi kept
        at = np.flatnonzero(np.r_[True, ~same_bucket])
        n, lo, hi = np.add.reduceat(n, at), np.minimum.reduceat(lo, at), np.maximum.reduceat(hi, at)
        rank, figure, bucket = rank[at], figure[at], bucket[at]
        same_key = (rank[1:] == rank[:-1]) & (figure[1:] == figure[:-1])
    starts = np.flatnonzero(np.r_[True, ~same_key])
    cum = np.cumsum(n)
    before = np.r_[0, cum][starts]  # rows counted before each (rank, figure)
    total = np.add.reduceat(n, starts)
    low = np.searchsorted(cum, before + (total - 1) // 2, side="right")
    high = np.searchsorted(cum, before + total // 2, side="right")
    # The values of the middle buckets alone: a bucket's value depends on that bucket only.
    middle = (bucket_values(bucket[low], lo[low], hi[low]) + bucket_values(bucket[high], lo[high], hi[high])) / 2
    return {(int(rank[s]), int(figure[s])): float(m) for s, m in zip(starts, middle)}


def _grouped(rank, figure, bucket) -> bool:
    """Whether the rows of each (rank, figure) are already together, their buckets strictly ascending (one
    file's ``hist`` part, or node files of disjoint ranks read in turn): then the middles are found without
    sorting them (most of ``medians_of``'s time at 1,024 ranks). Checked in one pass, not assumed."""
    import numpy as np

    if len(rank) < 2:
        return True
    same = (rank[1:] == rank[:-1]) & (figure[1:] == figure[:-1])
    if not (bucket[1:][same] > bucket[:-1][same]).all():
        return False
    starts = np.r_[0, np.flatnonzero(~same) + 1]
    ranks, figures = rank[starts].astype(np.int64), figure[starts].astype(np.int64)
    low, span = int(figures.min()), int(figures.max() - figures.min()) + 1
    if span < 2**16 and int(np.abs(ranks).max()) < 2**46:  # one number per key: a sort of numbers, not of pairs
        keys = ranks * span + (figures - low)
        return len(np.unique(keys)) == len(starts)  # no (rank, figure) begins twice
    return len(np.unique(np.stack([ranks, figures], axis=1), axis=0)) == len(starts)


MEDIANS_COLUMNS: tuple[tuple[str, str], ...] = (("rank", "INTEGER"), ("figure", "TINYINT"), ("median", "DOUBLE"))
"""Per (rank, figure) of ``medians``: the figure as its position in ``MEDIANS`` (from 1), the median of the
file's rows after warm-up as ``medians_of`` reads it from this file's ``hist`` rows."""


def figure_rows_sql(source: str, figures: tuple[str, ...] = tuple(MEDIANS)) -> str:
    """SELECT of the ``hist`` rows in ``source`` after warm-up of ``figures``, as ``medians_of`` takes them: the
    figure as its position in ``figures`` (from 1; a CASE, cheaper per row than ``list_position``), counts as
    BIGINT (DuckDB's 128-bit sums would reach numpy as Python objects), in the part's own order."""
    position = "CASE figure " + " ".join(f"WHEN '{f}' THEN {i}" for i, f in enumerate(figures, 1)) + " END"
    return (
        f"SELECT rank, CAST({position} AS TINYINT) AS figure, bucket, n::BIGINT AS n, lo, hi"
        f" FROM {source} WHERE NOT warm AND ({position}) IS NOT NULL"
    )


def medians_part(rows) -> dict:
    """The ``medians`` part of one file (numpy arrays, ``MEDIANS_COLUMNS``) from its ``hist`` rows as
    ``figure_rows_sql`` selects them: each (rank, figure)'s median over the file's rows after warm-up.

    Why: a rank lives on one node, so at 10,000 ranks x 1,000 steps each rank's rows are in one node file,
    and a reader whose every (rank, figure) is in one file's part reads these medians -- the very numbers
    ``medians_of`` finds from all the files' histograms, since no other file holds a row of that (rank,
    figure) -- instead of 2.2 M histogram rows (105 MB) and a pass over them. Where two files hold one, the
    reader reads the histograms (``collectors._digest_queries``)."""
    import numpy as np

    found = medians_of(rows)
    keys = sorted(found)
    return {
        "rank": np.array([r for r, _ in keys], np.int32),
        "figure": np.array([f for _, f in keys], np.int8),
        "median": np.array([found[k] for k in keys], np.float64),
    }


def hist_sql(source: str) -> str:
    """SELECT of ``hist`` rows (rank, warm, figure, bucket, n, lo, hi) of the rows in ``source``; ``$warm``."""
    parts = [
        f"SELECT rank, {WARM_SQL} AS warm, '{name}' AS figure, {bucket_sql(value, whole)} AS bucket,"
        f" CAST({value} AS DOUBLE) AS v FROM {source} WHERE ({value}) IS NOT NULL AND {SAMPLED_SQL}"
        for name, (value, whole) in MEDIANS.items()
    ]
    return (
        "SELECT rank, warm, figure, bucket, count(*) AS n, min(v) AS lo, max(v) AS hi FROM ("
        + " UNION ALL ".join(parts)
        + ") GROUP BY rank, warm, figure, bucket ORDER BY rank, warm, figure, bucket"  # read without a sort
    )


def steps_sql(source: str) -> str:
    """SELECT of ``steps`` rows of the step rows in ``source``; parameter ``$warm``."""
    cols = ", ".join(f"CAST({sql} AS {t}) AS {c}" for c, t, sql in STEPS_COLUMNS)
    return f"SELECT step, {WARM_SQL} AS warm, {cols} FROM {source} WHERE {SAMPLED_SQL} GROUP BY step, warm"


_LEAST_ROW = "arg_min({'least_rank': least_rank, 'second': second, 'least_busy': least_busy}, (least, least_rank))"
_CPU_KEY_ROW = (
    "arg_min({'cpu_key_rank': cpu_key_rank, 'least_cpu': least_cpu}, (cpu_key, cpu_key_rank))"
    " FILTER (WHERE cpu_key IS NOT NULL)"
)
"""The file row holding a step's least wait (and the one holding its least wait among CPU-timed ranks), each
chosen once for every column taken from it: DuckDB computes an aggregate written several times once, and
one ``arg_min`` by a (value, rank) key per column was most of the merge's time. Unlike ``arg_min`` of one
column, a struct is taken from its row even where a field is NULL: ``second`` (a file of one rank) then
leaves ``least`` to the second of the files' least waits, which is the answer; a file without CPU-timed
ranks has no ``cpu_key`` and is filtered out."""

MERGED_STEPS: dict[str, str] = {
    "n": "sum(n)",
    "period_sum": "sum(period_sum)",
    "grad_min": "min(grad_min)",
    "blocked_min": "min(blocked_min)",
    "timed": "bool_or(timed)",
    "least": "min(least)",
    # The second-least wait of several files' ranks: the second of their least waits, or the second wait of
    # the file that holds the least, whichever is smaller (any other file's second is at least its least).
    "second": f"least(min(least, 2)[2], {_LEAST_ROW}.second)",
    "least_rank": f"{_LEAST_ROW}.least_rank",
    "cpu_n": "sum(cpu_n)",
    "cpu_sum": "sum(cpu_sum)",
    "cpu_key": "min(cpu_key)",
    "cpu_key_rank": f"{_CPU_KEY_ROW}.cpu_key_rank",
    "least_cpu": f"{_CPU_KEY_ROW}.least_cpu",
    "least_busy": f"{_LEAST_ROW}.least_busy",
    "compute_n": "sum(compute_n)",
    "compute_max": "max(compute_max)",
    "compute_rank": "arg_max(compute_rank, compute_max)",
    "gpu_compute_n": "sum(gpu_compute_n)",
    "gpu_compute_max": "max(gpu_compute_max)",
    "gpu_compute_rank": "arg_max(gpu_compute_rank, gpu_compute_max)",
}
"""How ``steps`` rows of several files merge into one per (step, warm), column by column: what the readers'
per-step comparisons do with the files' rows (``collectors._digest_queries``), so a merged row is read like
one more file's."""


_MERGE_READS: dict[str, frozenset[str]] = {
    c: frozenset(name for name, _, _ in STEPS_COLUMNS if re.search(rf"\b{name}\b", MERGED_STEPS[c]))
    for c, _, _ in STEPS_COLUMNS
}
"""The ``steps`` columns each merged column's SQL reads (``least`` also names the function: read as a column)."""


def merge_steps_sql(source: str, columns=None, absent=frozenset()) -> str:
    """SELECT of one ``steps`` row per (step, warm) standing for all the rows of ``source`` (``MERGED_STEPS``):
    every column, or those named in ``columns``. A column whose SQL reads only columns in ``absent`` (NULL on
    every row of ``source``) is NULL without being merged: a CPU job's digests hold no GPU figure, a GPU job's
    no CPU-timed one, and their six aggregates were a quarter of a merge of 128 files' per-step parts."""
    cols = ", ".join(
        f"CAST({'NULL' if _MERGE_READS[c] <= absent else MERGED_STEPS[c]} AS {t}) AS {c}"
        for c, t, _ in STEPS_COLUMNS
        if columns is None or c in columns
    )
    return f"SELECT step, warm, {cols} FROM {source} GROUP BY step, warm"


_SUMS_NOT_SUMMED = {
    "node": "any_value(node)",
    "world_size": "max(world_size)",
    "step_min": "min(step_min)",
    "step_max": "max(step_max)",
}
MERGED_SUMS: dict[str, str] = {c: _SUMS_NOT_SUMMED.get(c, f"sum({c})") for c, _, _ in SUMS_COLUMNS}
"""How ``sums`` rows of several files merge into one per (rank, warm): every column a sum or count but these."""

MERGED_HIST: tuple[tuple[str, str, str], ...] = (
    ("n", "sum(n)", "BIGINT"),
    ("lo", "min(lo)", "DOUBLE"),
    ("hi", "max(hi)", "DOUBLE"),
)
"""How ``hist`` rows of several files merge into one per (rank, warm, figure, bucket): column, SQL, type."""


def merge_part_sql(part: str, source: str, absent=frozenset()) -> str:
    """SELECT of the rows of verdict part ``part`` in ``source`` merged into one per key, with the part's own
    column types: the rows of many files read like those of one. ``absent``: ``steps`` columns NULL on every
    row of ``source`` (``merge_steps_sql``)."""
    if part == "steps":
        return merge_steps_sql(source, absent=absent)
    if part == "sums":
        cols = ", ".join(f"CAST({MERGED_SUMS[c]} AS {t}) AS {c}" for c, t, _ in SUMS_COLUMNS)
        return f"SELECT rank, warm, {cols} FROM {source} GROUP BY rank, warm"
    if part == "hist":
        cols = ", ".join(f"CAST({sql} AS {t}) AS {c}" for c, sql, t in MERGED_HIST)
        return f"SELECT rank, warm, figure, bucket, {cols} FROM {source} GROUP BY rank, warm, figure, bucket"
    raise ValueError(f"no verdict part {part!r}")


def definition() -> str:
    """Text that changes whenever a part's meaning does (it goes into the digest's key)."""
    medians = f"medians={list(MEDIANS)} {MEDIANS_COLUMNS} after warm-up, medians_of of the file's hist"
    return "\n".join([sums_sql("s"), hist_sql("s"), steps_sql("s"), repr(GAMMA), medians])
