"""The verdict's part of a step digest: what ``diagnose()`` reads of a file's rows, folded where they are written.

Why: at 1,024 ranks x 10,000 steps the verdict's feature queries read every step row four times (per-rank
medians and sums, and two per-step comparisons across ranks): 4-5 s on a live spool on 2 cores, against a
1 s target (docs/scale.md). The node spool's publisher holds each file's rows when it writes it, so it also
folds them into three small tables, written in the file's digest (``ranksight.format.digest``):

- ``sums``: per (rank, warm-up or not), the sums, counts and sums of squares the per-rank figures need;
- ``medians``: per (rank, figure) the exact median of the file's rows after warm-up of the figures whose
  per-rank median the rules read (DuckDB's ``median``, as the readers' row queries take it). A median does
  not merge: a reader takes it where a rank's rows are in one file alone, and reads the rows' medians
  otherwise, so a median means the same whatever the layout;
- ``steps``: per (step, warm-up or not), what each comparison across ranks keeps of the file's ranks: the
  least and second-least wait at collectives and who waited least, the longest compute and whose it was.

Like the readers' queries over rows, every part leaves out a GPU rank's steps without CUDA events
(``ranksight.format.phases.SAMPLED_SQL``). Every column of ``sums`` and ``steps`` is a sum, count, minimum or
maximum (or the value of the row holding one), so a rank's or a step's rows spread over several files merge
exactly. Text only (no imports of
the readers): the publisher is part of the agent."""

from __future__ import annotations

import re

from .phases import BLOCKED_SQL, GRAD_COMM_SQL, PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL
from .warmup import WARM_SQL

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
"""Figure -> (SQL of one row's value, whether it is a whole number) of ``medians``, in the order of its
``figure`` column (from 1)."""

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


MEDIANS_COLUMNS: tuple[tuple[str, str], ...] = (("rank", "INTEGER"), ("figure", "TINYINT"), ("median", "DOUBLE"))
"""Per (rank, figure) of ``medians``: the figure as its position in ``MEDIANS`` (from 1), the exact median of
the file's rows after warm-up."""


def medians_sql(source: str) -> str:
    """SELECT of ``medians`` rows of the step rows in ``source`` after warm-up; parameter ``$warm``."""
    parts = [
        f"SELECT rank, {i} AS figure, CAST({value} AS DOUBLE) AS v FROM {source}"
        f" WHERE NOT ({WARM_SQL}) AND ({value}) IS NOT NULL AND {SAMPLED_SQL}"
        for i, (value, _) in enumerate(MEDIANS.values(), 1)
    ]
    return (
        "SELECT rank, CAST(figure AS TINYINT) AS figure, median(v) AS median FROM ("
        + " UNION ALL ".join(parts)
        + ") GROUP BY rank, figure ORDER BY rank, figure"
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
per-step comparisons do with the files' rows (``collectors._summary``), so a merged row is read like
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


def merge_part_sql(part: str, source: str, absent=frozenset()) -> str:
    """SELECT of the rows of verdict part ``part`` in ``source`` merged into one per key, with the part's own
    column types: the rows of many files read like those of one. ``absent``: ``steps`` columns NULL on every
    row of ``source`` (``merge_steps_sql``)."""
    if part == "steps":
        return merge_steps_sql(source, absent=absent)
    if part == "sums":
        cols = ", ".join(f"CAST({MERGED_SUMS[c]} AS {t}) AS {c}" for c, t, _ in SUMS_COLUMNS)
        return f"SELECT rank, warm, {cols} FROM {source} GROUP BY rank, warm"
    raise ValueError(f"no verdict part {part!r}")


def definition() -> str:
    """Text that changes whenever a part's meaning does (it goes into the digest's key)."""
    return "\n".join([sums_sql("s"), medians_sql("s"), steps_sql("s")])
