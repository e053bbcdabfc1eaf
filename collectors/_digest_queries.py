"""The verdict's per-rank and per-step figures from the digests' verdict parts instead of the step rows.

Why: the same figures as ``_queries``' row queries (``rank_step_stats``, the breakdown's medians,
``wait_asymmetry``'s per-step rows, the slowest-compute share), read from a few rows per rank and step that
the node spool's publisher folded (``ranksight.format.verdict_digest``), so a live 1,024-rank spool is diagnosed
without reading its 10 M rows four times. Sums, counts, minima and medians are exact (a median from the rows
where a rank's rows are in several files); a tie for the longest compute credits one of the tied ranks, not
each. Each function returns None where the digests cannot answer exactly as the rows
would (a rank with no more rows than the warm-up, other ranks asked for): the caller reads the rows then.
"""

from __future__ import annotations

from ranksight.format.phases import SAMPLED_SQL
from ranksight.format.verdict_digest import MEDIANS, merge_steps_sql
from ranksight.format.warmup import WARMUP_STEPS, is_short, kept_sql, short_sql

from ._digest_source import incremental_step_files, keep_medians, noted_medians, rank_summary
from ._median_fold import folded_medians
from ._tables import fetch_rows, steps_source


def _no_short_rank(con, parts: dict, warmup_steps: int) -> list[int] | None:
    """The digests' ranks, sorted, when the warm-up is the digests' own (their ``warm`` flag) and each rank
    has more rows than it (so warm rows are left out everywhere, as the rows' ``kept`` does); else None."""
    if warmup_steps != WARMUP_STEPS:
        return None
    ranks, fewest = rank_summary(con, parts["sums"])
    if not ranks or is_short(fewest, warmup_steps):
        return None
    return ranks


def medians(con, parts: dict, warmup_steps: int) -> dict[str, dict[int, float]] | None:
    """Per figure of ``MEDIANS``, {rank: its median over the rank's steps after warm-up}: the files' own where
    each rank's rows are in one file (``_digest_source``), else the rows' (one query for every figure); None
    (read the rows) when a rank has no more rows than the warm-up. Callers read what they need with ``.get``
    and change nothing: the dicts are those kept for the connection."""
    if _no_short_rank(con, parts, warmup_steps) is None:
        return None
    kept, done = noted_medians(con)
    missing = tuple(f for f in MEDIANS if f not in done)
    if missing:
        kept = keep_medians(con, _rows_medians(con, warmup_steps, missing), missing)
    return kept


def _rows_medians(con, warmup_steps: int, figures: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """{figure: {rank: median}} of ``figures`` over the rows after warm-up, as the row queries take them (no
    rank is short of the warm-up here: ``_no_short_rank``). A reading refreshed again and again takes them from
    the medians this process keeps of its files (``_median_fold``), which reads only the files added since."""
    files = incremental_step_files(con)
    if files is not None:
        found = folded_medians(con, files, figures, warmup_steps)
        if found is not None:
            return found
    cols = ", ".join(f"median(CAST({MEDIANS[f][0]} AS DOUBLE))" for f in figures)
    sql = f"SELECT rank, {cols} FROM {steps_source(con)} WHERE step >= ? AND {SAMPLED_SQL} GROUP BY rank"
    out: dict[str, dict[int, float]] = {f: {} for f in figures}
    for row in fetch_rows(con.execute(sql, [warmup_steps])):
        for f, value in zip(figures, row[1:]):
            if value is not None:
                out[f][row[0]] = value
    return out


def rank_stats(con, parts: dict, warmup_steps: int) -> dict[int, dict] | None:
    """``rank_step_stats``' figures from the ``sums`` part and the medians; None to read the rows instead."""
    if _no_short_rank(con, parts, warmup_steps) is None:
        return None
    sql = f"""
        SELECT rank, any_value(node) AS node, sum(period_sum) AS run_time_s,
               sum(exposed_sum) AS exposed_sum, sum(allreduce_sum) AS allreduce_sum, sum(bytes_sum) AS bytes_sum,
               CAST(sum(gpu_rows) AS BIGINT) AS gpu_rows, max(world_size) AS world_size,
               sum(grad_comm_sum) / nullif(sum(period_sum), 0) AS grad_comm_share,
               sum(blocked_sum) / nullif(sum(period_sum), 0) AS blocked_share,
               CAST(sum(data_share_n) AS BIGINT) AS data_n, sum(data_share_sum) AS data_sum,
               sum(data_share_sq) AS data_sq
        FROM {parts["sums"]} WHERE NOT warm GROUP BY rank
    """
    cur = con.execute(sql)
    names = [d[0] for d in cur.description][:-3]  # the data share's count, sum and squares make its noise
    rows = fetch_rows(cur)  # before the next query on ``con`` replaces this result; counts as BIGINT for it
    found = medians(con, parts, warmup_steps) or {}
    nothing: dict = {}
    taken = [(key, found.get(figure, nothing)) for key, figure in _RANK_MEDIANS]
    out = {}
    for row in rows:
        r = dict(zip(names, row))
        n, total, squares = row[-3] or 0, row[-2], row[-1]
        # stddev_samp over sqrt(count), as the rows' query gives it: from the count, sum and sum of squares
        r["data_noise"] = (max(0.0, (squares - total * total / n) / (n - 1)) / n) ** 0.5 if n >= 3 else None
        rank = r["rank"]
        for key, by_rank in taken:
            r[key] = by_rank.get(rank)
        out[rank] = r
    return out


_RANK_MEDIANS = (
    ("buckets_per_step", "buckets"),
    ("grad_bytes_per_step", "bucket_bytes"),
    ("gpu_compute_median_s", "gpu_compute"),
    ("collectives_per_step", "collectives"),
    ("collective_bytes_per_step", "collective_bytes"),
)
"""The medians ``rank_stats`` gives (its key, the ``MEDIANS`` figure), in the rows' query's order."""


_WAIT_COLUMNS = (
    "n",
    "period_sum",
    "grad_min",
    "blocked_min",
    "timed",
    "least",
    "second",
    "least_rank",
    "cpu_n",
    "cpu_sum",
    "least_cpu",
    "least_busy",
)
"""The merged ``steps`` columns ``wait_rows`` reads."""


def wait_rows(con, parts: dict, warmup_steps: int, ranks: list[int]) -> list[tuple] | None:
    """``wait_asymmetry``'s per-step rows (same columns, same order) from the ``steps`` part, for steps every
    one of ``ranks`` recorded; None (read the rows) unless ``ranks`` are exactly the digests' ranks."""
    if _no_short_rank(con, parts, warmup_steps) != sorted(ranks):
        return None
    # The files' rows merged per step as ingest merges a batch's (``merge_steps_sql``: one copy of the rules).
    merged = merge_steps_sql(f"(SELECT * FROM {parts['steps']} WHERE NOT warm)", _WAIT_COLUMNS)
    sql = f"""
        WITH per AS ({merged})
        SELECT step, period_sum / n, grad_min, blocked_min, timed, least, second, least_rank,
               CASE WHEN cpu_n = n AND n >= 2 THEN least_cpu - (cpu_sum - least_cpu) / (n - 1) END,
               least_cpu, least_busy
        FROM per WHERE n = ? ORDER BY step
    """
    return con.execute(sql, [len(ranks)]).fetchall()


def slowest_shares(con, parts: dict, warmup_steps: int, ranks: list[int], use_gpu: bool) -> dict[int, float] | None:
    """Per rank, the share of steps (recorded by every one of ``ranks``) in which its compute was the longest,
    from the ``steps`` part; None (read the rows) unless ``ranks`` are exactly the digests' ranks."""
    if warmup_steps != WARMUP_STEPS:
        return None
    if rank_summary(con, parts["sums"])[0] != sorted(ranks):
        return None
    col = "gpu_compute" if use_gpu else "compute"
    # the run is the group here: its warm steps stay when no step came after them (as the rows' query does)
    run_steps = f"(SELECT max(step_max) FROM {parts['sums']}) + 1"
    kept = f"(SELECT * FROM {parts['steps']} WHERE {kept_sql('warm', short_sql(run_steps))})"
    merged = merge_steps_sql(kept, (f"{col}_n", f"{col}_rank", f"{col}_max"))
    sql = f"""
        WITH per AS (SELECT {col}_rank AS top_rank FROM ({merged}) WHERE {col}_n = ?)
        SELECT top_rank, count(*), (SELECT count(*) FROM per) FROM per GROUP BY top_rank
    """
    rows = con.execute(sql, [warmup_steps, len(ranks)]).fetchall()
    if not rows:
        return {}
    complete = rows[0][2]
    wins = {rank: n for rank, n, _ in rows}
    return {rank: wins.get(rank, 0) / complete for rank in ranks}
