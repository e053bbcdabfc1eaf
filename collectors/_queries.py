"""Plain query functions over a run's tables (spool views or the compacted store).

They take a DuckDB connection and return lists of dicts, so the CLI, the rules and the dashboard
share one definition of each figure and tests can call them without any UI.
"""

from __future__ import annotations

from ranksight.format.phases import PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL
from ranksight.format.verdict_digest import merge_steps_sql
from ranksight.format.warmup import WARMUP_STEPS, kept_sql, short_sql, warm_sql

from ._summary import Summary, summarize
from ._tables import has_table, query, steps_source


def kept_steps_sql(source: str) -> str:
    """CTEs ``short`` and ``kept``: the rows of ``source`` with their period, minus each rank's warm-up and
    a GPU rank's steps that recorded no CUDA events (``SAMPLED_SQL``: the figures rest on the sampled steps).

    Takes two parameters: the warm-up steps, twice (a rank with no more rows than that keeps them all:
    ``ranksight.format.warmup``). The short ranks are found by a GROUP BY, not a count over a window, which
    sorts every row by rank first (cpu_scale_history.md).
    """
    return f"""
        short AS (SELECT rank FROM {source} WHERE {SAMPLED_SQL} GROUP BY rank HAVING {short_sql("count(*)")}),
        kept AS (SELECT *, {PERIOD_SQL} AS period_s FROM {source}
                 WHERE {kept_sql(warm_sql(), "rank IN (SELECT rank FROM short)")} AND {SAMPLED_SQL})"""


def summary_of(con, warmup_steps: int, since_ns: int | None, ranks: list[int] | None = None) -> Summary:
    """The summary relation (``_summary``) of ``con``'s step rows: the one a ``Run`` keeps for the warm-up and
    window, or, for a bare connection or other ``ranks`` than the relation's, one made from the rows."""
    kept = getattr(con, "summary_for", None)
    if kept is not None:
        found = kept(warmup_steps, since_ns)
        if ranks is None or found.ranks == sorted(ranks):
            return found
    return summarize(con, None, warmup_steps, since_ns, ranks=ranks)


def _kept_sums(s: Summary) -> str:
    """The relation's ``sums`` rows each rank keeps: not warm, or all of a rank with no more than the warm-up
    (``ranksight.format.warmup``); one parameter, the warm-up."""
    return f"""(SELECT d.* FROM {s.sums} d JOIN (SELECT rank, sum(n) AS total FROM {s.sums} GROUP BY rank) USING (rank)
               WHERE {kept_sql("warm", short_sql("total"))})"""


def step_breakdown(con, warmup_steps: int = WARMUP_STEPS, since_ns: int | None = None) -> list[dict]:
    """Per rank: steps, median and mean step period, and each phase's share of the total period.

    The first ``warmup_steps`` steps of each rank (compilation, allocator and bucket warm-up) are left
    out unless the rank has no more than that. On a CPU rank the period is the step's wall time. A
    rank whose rows never measured the data wait has a NULL ``data_wait_share`` (not 0), and one whose rows
    never timed its all-reduces (no per-bucket hook, NCCL) a NULL ``allreduce_share``.
    """
    s = summary_of(con, warmup_steps, since_ns)
    shares = ",\n".join(f"sum({p[:-2]}_sum) / nullif(sum(period_sum), 0) AS {p[:-2]}_share" for p in PHASES)
    sql = f"""
        SELECT rank, any_value(node) AS node, CAST(sum(n) AS BIGINT) AS steps, CAST(NULL AS DOUBLE) AS step_median_s,
               sum(period_sum) / sum(n) AS step_mean_s, CAST(NULL AS DOUBLE) AS compute_median_s,
               sum(allreduce_sum) / nullif(sum(period_sum), 0) AS allreduce_share,
               sum(data_wait_host_sum) / nullif(sum(period_sum), 0) AS data_wait_host_share,
               {shares}
        FROM {_kept_sums(s)} GROUP BY rank ORDER BY rank
    """
    rows = [dict(zip(BREAKDOWN_COLUMNS, row)) for row in query(con, sql, [warmup_steps])[1]]
    period, compute = s.medians["period"], s.medians["compute"]
    for r in rows:
        r["step_median_s"], r["compute_median_s"] = period.get(r["rank"]), compute.get(r["rank"])
    return rows


BREAKDOWN_COLUMNS = (
    "rank",
    "node",
    "steps",
    "step_median_s",
    "step_mean_s",
    "compute_median_s",
    "allreduce_share",
    "data_wait_host_share",
    *(f"{p[:-2]}_share" for p in PHASES),
)
"""A breakdown row's keys, in order."""


def mean_error(values: list[float], n: int = 0) -> float | None:
    """Standard error of the mean of per-step values (padded with zeros to ``n`` values, without building the
    list: zeros add nothing to the sums); None for fewer than 3 (no spread to judge by).

    A cost share is a ratio of sums, a mean over steps, so its uncertainty is the mean's standard
    error. A share is only judged past a threshold when it clears it by that much, so step-to-step
    noise (a loaded host, a few slow steps) cannot tip a verdict."""
    xs = [v for v in values if v is not None]
    return _mean_error_of(max(n, len(xs)), sum(xs), sum(x * x for x in xs))


def _mean_error_of(n: int, total: float, squares: float) -> float | None:
    """``mean_error`` from the values' count, sum and sum of squares."""
    if n < 3:
        return None
    return (max(0.0, (squares - total * total / n) / (n - 1)) / n) ** 0.5


def rank_step_stats(con, warmup_steps: int = WARMUP_STEPS, since_ns: int | None = None) -> dict[int, dict]:
    """Per rank, figures over its kept step rows that the breakdown does not show: DDP bucket figures,
    blocked collectives, the spread of the per-step data wait share, GPU compute median."""
    s = summary_of(con, warmup_steps, since_ns)
    sql = f"""
        SELECT rank, any_value(node) AS node, sum(period_sum) AS run_time_s,
               sum(exposed_sum) AS exposed_sum, sum(allreduce_sum) AS allreduce_sum, sum(bytes_sum) AS bytes_sum,
               CAST(sum(gpu_rows) AS BIGINT) AS gpu_rows, max(world_size) AS world_size,
               sum(grad_comm_sum) / nullif(sum(period_sum), 0) AS grad_comm_share,
               sum(blocked_sum) / nullif(sum(period_sum), 0) AS blocked_share,
               CAST(sum(data_share_n) AS BIGINT) AS data_n, sum(data_share_sum) AS data_sum,
               sum(data_share_sq) AS data_sq
        FROM {_kept_sums(s)} GROUP BY rank
    """
    names, rows = query(con, sql, [warmup_steps])
    names = names[:-3]  # the data share's count, sum and squares make its noise
    taken = [(key, s.medians[figure]) for key, figure in _RANK_MEDIANS]
    out = {}
    for row in rows:
        r = dict(zip(names, row))
        r["data_noise"] = _mean_error_of(row[-3] or 0, row[-2], row[-1])
        for key, by_rank in taken:
            r[key] = by_rank.get(r["rank"])
        out[r["rank"]] = r
    return out


_RANK_MEDIANS = (
    ("buckets_per_step", "buckets"),
    ("grad_bytes_per_step", "bucket_bytes"),
    ("gpu_compute_median_s", "gpu_compute"),
    ("collectives_per_step", "collectives"),
    ("collective_bytes_per_step", "collective_bytes"),
)
"""The medians ``rank_step_stats`` gives: (its key, the ``MEDIANS`` figure)."""


def wait_asymmetry(con, warmup_steps: int, since_ns: int | None, ranks: list[int]) -> dict | None:
    """Who waits for whom at collectives, from the steps every rank in ``ranks`` recorded.

    A collective ends on every rank at about the same time, so per step the rank that waited least
    (exposed gradient all-reduce plus blocked collectives, on the GPU's clock where measured) arrived
    last: the others waited for it. Its own wait is what the collectives cost by themselves (the
    *floor*: DDP's share is the least exposed all-reduce, the blocking collectives' share the rest of
    that least total wait); how much longer the next-least-waiting rank waited is what that last arrival cost the
    step (fixing it gives that back, not more: the next rank is then the last). Returns (the job's features:
    the floors' shares of the period sum with their per-step spread, the imbalance share; per rank that arrived
    last at some step, absent for one that never did, its ``least_wait_step_share``, ``straggler_cost_share``
    (+ noise) and ``straggler_work_explained``), or None when no step has every rank.
    """
    s = summary_of(con, warmup_steps, since_ns, ranks)
    # A rank's warm steps are kept only where it has no more rows than the warm-up: at a warm step some rank
    # then lacks its row, unless every rank keeps its warm steps.
    kept = f"(SELECT * REPLACE (false AS warm) FROM {s.steps})"
    if not s.all_short:
        kept = f"(SELECT * FROM {s.steps} WHERE NOT warm)"
    sql = f"""
        WITH per AS ({merge_steps_sql(kept, _WAIT_COLUMNS)})
        SELECT step, period_sum / n, grad_min, blocked_min, timed, least, second, least_rank,
               CASE WHEN cpu_n = n AND n >= 2 THEN least_cpu - (cpu_sum - least_cpu) / (n - 1) END,
               least_cpu, least_busy
        FROM per WHERE n = ? ORDER BY step
    """
    return _wait_figures_of(query(con, sql, [len(ranks)])[1], ranks)


_WAIT_COLUMNS = ("n", "period_sum", "grad_min", "blocked_min", "timed", "least", "second", "least_rank")
_WAIT_COLUMNS += ("cpu_n", "cpu_sum", "least_cpu", "least_busy")
"""The per-step columns ``wait_asymmetry`` reads."""


def slowest_shares(con, warmup_steps: int, since_ns, ranks: list[int], use_gpu: bool) -> dict[int, float]:
    """Per rank, the share of steps (recorded by every one of ``ranks``) in which its compute was the longest
    (evidence beside the wait asymmetry); a tie credits one of the tied ranks."""
    s = summary_of(con, warmup_steps, since_ns, ranks)
    col = "gpu_compute" if use_gpu else "compute"
    # the run is the group here: its warm steps stay when no step came after them
    run_short = short_sql(f"(SELECT max(step_max) FROM {s.sums}) + 1")
    kept = f"(SELECT * FROM {s.steps} WHERE {kept_sql('warm', run_short)})"
    merged = merge_steps_sql(kept, (f"{col}_n", f"{col}_rank", f"{col}_max"))
    sql = f"""
        WITH per AS (SELECT {col}_rank AS top_rank FROM ({merged}) WHERE {col}_n = ?)
        SELECT top_rank, count(*), (SELECT count(*) FROM per) FROM per GROUP BY top_rank
    """
    rows = query(con, sql, [warmup_steps, len(ranks)])[1]
    if not rows:
        return {}
    wins = {rank: n for rank, n, _ in rows}
    return {rank: wins.get(rank, 0) / rows[0][2] for rank in ranks}


def _wait_figures_of(rows: list[tuple], ranks: list[int]) -> tuple[dict, dict[int, dict]] | None:
    rows = [r for r in rows if r[1] and r[1] > 0]
    if not rows:
        return None
    periods = [r[1] for r in rows]
    total = sum(periods)
    gaps = [(r[6] - r[5]) if r[6] is not None else 0.0 for r in rows]
    late_steps: dict[int, list[int]] = {}  # rank -> indexes of the steps where it arrived last
    for i, r in enumerate(rows):
        late_steps.setdefault(r[7], []).append(i)
    per_rank = {}  # only the ranks that arrived last at some step: most ranks of a large job never did
    for rank in ranks:  # one pass per rank over its own late steps, not over every step
        mine = late_steps.get(rank)
        if mine is None:
            continue
        late = [rows[i] for i in mine]
        waited = sum(gaps[i] for i in mine)
        extra_cpu = [r[8] for r in late]
        # The CPU share the host gave this rank while it worked: extra work of c CPU-seconds costs c / share
        # of wall time, so the wait it explains is its extra CPU time over that share.
        cpu_share = _ratio(sum(r[9] or 0.0 for r in late), sum(max(0.0, r[10] or 0.0) for r in late))
        per_rank[rank] = {
            "least_wait_step_share": len(mine) / len(rows),
            "straggler_cost_share": waited / total,
            # the per-step series: its gap share where it arrived last, 0 elsewhere
            "straggler_cost_share_noise": mean_error([gaps[i] / rows[i][1] for i in mine], len(rows)),
            # CPU ranks: the extra thread CPU time behind those late arrivals, over the wait they caused
            "straggler_work_explained": (
                max(0.0, sum(extra_cpu)) / min(1.0, cpu_share) / waited
                if waited > 0 and cpu_share and all(c is not None for c in extra_cpu)
                else None
            ),
        }
    grad = [r[2] for r in rows]
    shared = dict(zip(("comm_floor_share", "comm_floor_share_noise"), share_and_noise(grad, periods)))
    shared["comm_floor_s"] = sum(grad) / len(rows)
    # What every rank waited beyond DDP's own floor: the blocking collectives' own time, and, when the ranks
    # take turns at being late, the jitter each extra sync point makes every rank pay (one rank waits in a
    # barrier, the other later in DDP's all-reduce). At least the blocked floor by itself.
    blocked = share_and_noise([r[5] - r[2] for r in rows], periods) if any(r[4] for r in rows) else (None, None)
    shared["comm_blocked_floor_share"], shared["comm_blocked_floor_share_noise"] = blocked
    shared["imbalance_cost_share"] = sum(gaps) / total if len(ranks) >= 2 else None
    return shared, per_rank


def share_and_noise(values: list[float], periods: list[float]) -> tuple[float, float | None]:
    """(the per-step values' sum over the periods' sum, the standard error of the per-step shares)."""
    return sum(values) / sum(periods), mean_error([v / p for v, p in zip(values, periods)])


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def recompile_excess(con, warmup_steps: int, since_ns: int | None) -> dict[int, float]:
    """Per rank, what the steps around each recompile after warm-up took beyond the rank's median step,
    over its period sum. The compile record's step is the latest one when the event was noticed, so the
    step before and after it count too (each step once)."""
    since = f"AND time_ns > {int(since_ns)}" if since_ns is not None else ""
    found = f"SELECT count(*) FROM compile WHERE kind = 'recompile' AND step >= ? {since}"
    if not query(con, found, [warmup_steps])[1][0][0]:
        return {}  # nothing to measure: skip the scan of every step row
    sql = f"""
        WITH {kept_steps_sql(steps_source(since_ns))},
             med AS (SELECT rank, median(period_s) AS m, sum(period_s) AS total FROM kept GROUP BY rank),
             rc AS (SELECT DISTINCT rank, step FROM compile WHERE kind = 'recompile' AND step >= ? {since}),
             hit AS (SELECT DISTINCT k.rank, k.step, k.period_s FROM kept k JOIN rc
                     ON k.rank = rc.rank AND k.step BETWEEN rc.step - 1 AND rc.step + 1)
        SELECT med.rank, sum(greatest(hit.period_s - med.m, 0)) / nullif(any_value(med.total), 0)
        FROM hit JOIN med USING (rank) GROUP BY med.rank
    """
    _, rows = query(con, sql, [warmup_steps, warmup_steps, warmup_steps])
    return {rank: share for rank, share in rows if share is not None}


def collective_ops(con, warmup_steps: int, since_ns: int | None, limit: int = 3) -> dict[int, str]:
    """Per rank, the blocking collectives (not DDP's buckets) that held the step longest, as text:
    ``all_reduce x2.0/step (user), barrier x1.0/step (user)``. Empty for a reading without the table."""
    if not has_table(con, "collectives"):
        return {}
    since = ""
    if since_ns is not None:  # the table has no clock of its own: keep the steps of the window
        since = f"""AND EXISTS (SELECT 1 FROM steps s WHERE s.rank = c.rank AND s.step = c.step
                                AND s.time_ns > {int(since_ns)})"""
    sql = f"""
        WITH mine AS (SELECT * FROM collectives c WHERE origin <> 'ddp' AND step >= ? {since}),
             steps_per_rank AS (SELECT rank, count(DISTINCT step) AS n FROM mine GROUP BY rank),
             ops AS (SELECT rank, op, origin, sum(count) AS calls, sum(coalesce(gpu_s, blocked_s, 0)) AS held
                     FROM mine GROUP BY rank, op, origin)
        SELECT o.rank, o.op, o.origin, o.calls / s.n AS per_step, o.held
        FROM ops o JOIN steps_per_rank s USING (rank) ORDER BY o.rank, o.held DESC, o.op
    """
    out: dict[int, list[str]] = {}
    for rank, op, origin, per_step, _ in query(con, sql, [warmup_steps])[1]:
        parts = out.setdefault(rank, [])
        if len(parts) < limit:
            parts.append(f"{op} x{per_step:.1f}/step ({origin})")
    return {rank: ", ".join(parts) for rank, parts in out.items()}


def step_series(con, warmup_steps: int = WARMUP_STEPS) -> list[tuple[int, float]]:
    """(end time ns, mean period across ranks) per step after warm-up, in time order (the onset of a change)."""
    sql = f"""
        WITH {kept_steps_sql(steps_source())}
        SELECT max(time_ns) AS t, avg(period_s) AS p FROM kept GROUP BY step ORDER BY t
    """
    return [(int(t), float(p)) for t, p in con.execute(sql, [warmup_steps, warmup_steps]).fetchall() if p]


def steps_recorded(con) -> dict[int, int]:
    """Per rank, how many step rows it recorded, warm-up included."""
    return {int(rank): int(n) for rank, n in con.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall()}


GPU_UTILIZATION_SAMPLE = "gpu_utilization_ratio"


def stretch_figures(con, width: int, warmup_steps: int = 0) -> list[dict]:
    """Per stretch of ``width`` steps and rank: ``stretch`` (step // width), ``rank``, ``last_step`` (of the
    stretch on that rank), ``step_time_s`` (median period), each ``<phase>_share`` (the phase's time over the
    stretch's period, as the breakdown sums it) and ``gpu_utilization`` (NVML's mean; None where not sampled)."""
    width = max(1, int(width))
    shares = ",\n".join(f"sum({PHASE_SQL[p]}) / nullif(sum(period_s), 0) AS {p[:-2]}_share" for p in PHASES)
    names, rows = query(
        con,
        f"""WITH {kept_steps_sql(steps_source())}
            SELECT step // {width} AS stretch, rank, max(step) AS last_step, median(period_s) AS step_time_s, {shares}
            FROM kept GROUP BY ALL ORDER BY stretch, rank""",
        [warmup_steps, warmup_steps],
    )
    gpu_sql = f"""SELECT step // {width}, rank, avg(value) FROM samples
                  WHERE name = ? AND step IS NOT NULL AND value IS NOT NULL GROUP BY ALL"""
    gpu = {(b, rank): value for b, rank, value in query(con, gpu_sql, [GPU_UTILIZATION_SAMPLE])[1]}
    return [{**dict(zip(names, row)), "gpu_utilization": gpu.get((row[0], row[1]))} for row in rows]
