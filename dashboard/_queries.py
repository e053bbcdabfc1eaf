"""Data loaders for the dashboard: plain functions over a cursor of a ``Rollup`` (see ``_rollup``).

Step figures come from the ``rollup`` table (per rank and chunk of steps); compile events and samples
from the spool views that ``ranksight.collectors.open_run`` defines on the same database. Each
returns plain Python (dicts and lists) so it can be unit-tested without Streamlit and cached by
``st.cache_data``. Column and sample names that end up inside SQL text come from the allow-lists
below, never from the user; every value (steps, bins, names) is a bound parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from ranksight.collectors import PHASES, Rollup
from ranksight.format.digest import column_steps
from ranksight.format.phases import breakdown_total
from ranksight.format.schema import SAMPLE_NAMES
from ranksight.format.warmup import WARMUP_STEPS, kept_sql, short_sql

PHASE_LABELS = {
    "data_wait_s": "data wait",
    "h2d_s": "H2D copy",
    "compute_s": "compute",
    "comm_exposed_s": "exposed comm",
    "optimizer_s": "optimizer",
    "other_s": "other",
}


@dataclass(frozen=True)
class Metric:
    """A heatmap metric: where it lives, how to label it, and which direction is bad."""

    key: str
    label: str
    source: str  # "steps" (a column) or "samples" (a sample name)
    unit: str  # "s", "ratio" or "bytes"
    worse: str = "high"  # "high": larger values are worse (groups show their max), "low": the min


HEATMAP_METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("step_s", "step time", "steps", "s"),
        Metric("data_wait_s", "data wait", "steps", "s"),
        Metric("comm_exposed_s", "exposed comm", "steps", "s"),
        Metric("compute_s", "compute", "steps", "s"),
        Metric("gpu_utilization_ratio", "GPU utilization (NVML)", "samples", "ratio", worse="low"),
        Metric("memory_reserved_bytes", "memory reserved", "samples", "bytes"),
        Metric("gpu_memory_used_bytes", "GPU memory used (NVML)", "samples", "bytes"),
    )
}

#: Rank orders offered for heatmaps: the slowest or least-computing ranks come first.
RANK_ORDERS = {
    "mean step time (slowest first)": ("sum(step_sum) / sum(n)", "DESC"),
    "mean compute (most first)": ("sum(compute_eff_sum) / sum(n)", "DESC"),
    "mean data wait (most first)": ("sum(data_wait_sum) / sum(n)", "DESC"),
    "rank id": ("rank", "ASC"),
}

FRAGMENTATION_SIGNALS = ("memory_fragmentation_ratio", "memory_alloc_retries_total", "memory_inactive_split_bytes")
UTILIZATION_SIGNALS = ("gpu_utilization_ratio", "kernel_busy_ratio")


def _rows(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _check_metric(key: str) -> Metric:
    if key not in HEATMAP_METRICS:
        raise ValueError(f"unknown metric {key!r}; choose one of: {', '.join(HEATMAP_METRICS)}")
    return HEATMAP_METRICS[key]


RANKS_TABLE = Rollup.ranks_table
"""The rollup's totals per (rank, warm), which the per-rank figures read: the same sums, 2 rows a rank."""
# The CTE ``kept``: the totals kept for averages: past warm-up, unless a rank has no more steps than that (as
# step_breakdown does: ranksight.format.warmup; the rollup's ``warm`` flag is folded at WARMUP_STEPS).
_SHORT_RANKS = f"SELECT rank FROM {RANKS_TABLE} GROUP BY rank HAVING {short_sql('sum(n)', str(WARMUP_STEPS))}"
_KEPT = f"kept AS (SELECT * FROM {RANKS_TABLE} WHERE {kept_sql('warm', f'rank IN ({_SHORT_RANKS})')})"
_SHARES = ", ".join(f"sum({p[:-2]}_sum) / nullif(sum(step_sum), 0) AS {p[:-2]}_share" for p in PHASES)


def run_overview(con) -> dict:
    """Ranks, steps, time span, mean step time and throughput (steps/s) of the whole job."""
    cur = con.execute(
        f"""
        WITH {_KEPT}
        SELECT (SELECT count(DISTINCT rank) FROM {RANKS_TABLE}) AS ranks,
               (SELECT max(step_max) + 1 FROM {RANKS_TABLE}) AS steps,
               (SELECT min(t_min) FROM {RANKS_TABLE}) AS first_ns, (SELECT max(t_max) FROM {RANKS_TABLE}) AS last_ns,
               sum(step_sum) / nullif(sum(n), 0) AS step_mean_s
        FROM kept
        """
    )
    row = _rows(cur)[0]
    row["ranks"] = row["ranks"] or 0
    mean = row["step_mean_s"]
    # Ranks step in lock-step under DDP, so the job's step rate is one over the mean step time.
    row["throughput_steps_s"] = 1.0 / mean if mean else None
    return row


def breakdown_per_rank(con) -> list[dict]:
    """Per rank: steps, mean and worst step time, and each phase's share of step time.

    Same definition as ``Run.breakdown`` (tests hold the two equal), computed from the rollup's totals per
    rank (``RANKS_TABLE``), so its cost does not grow with the run.
    """
    cur = con.execute(
        f"""
        WITH {_KEPT}
        SELECT rank, any_value(node) AS node, sum(n) AS steps, sum(step_sum) / sum(n) AS step_mean_s,
               max(step_max_s) AS step_max_s, sum(allreduce_sum) / nullif(sum(step_sum), 0) AS allreduce_share,
               {_SHARES}, sum(h2d_n) > 0 AS h2d_measured
        FROM kept GROUP BY rank ORDER BY rank
        """
    )
    return _rows(cur)


def rollup_total(con) -> dict:
    """Each phase's share of step time over all ranks, with the mean and worst step time: the rollup's
    per-rank rows totalled as ``ranksight.format.phases.breakdown_total`` totals the diagnosis's."""
    return breakdown_total(breakdown_per_rank(con))


BARS_AT_MOST = 64
"""Ranks a per-rank chart draws a bar each for; above it, the ranks that stand out and one bar for the rest."""
STANDOUT_BARS = 40
"""Bars for the ranks that stand out, when there are more than ``BARS_AT_MOST``."""


def standout_ranks(rows: list[dict], named=(), bars: int = STANDOUT_BARS) -> tuple[list[dict], dict | None]:
    """(the rows to draw a bar each for, sorted by rank; one row of the others' mean shares, or None).

    Up to ``BARS_AT_MOST`` ranks, every row and no summary. Above it, the ``bars`` ranks whose mix of phases
    is furthest from the median rank's (the sum of each phase share's distance from that phase's median),
    the ranks in ``named`` (a finding's) first. Why: 1,024 bars are under a pixel each in the page's column;
    the ranks worth a look are the ones unlike the rest, and the rest are summed up in one bar.
    """
    if len(rows) <= BARS_AT_MOST:
        return rows, None
    import statistics

    keys = [f"{p[:-2]}_share" for p in PHASES]
    medians = {
        k: statistics.median(vals) if (vals := [r[k] for r in rows if r.get(k) is not None]) else 0.0 for k in keys
    }

    def distance(r: dict) -> float:
        return sum(abs((r.get(k) or 0.0) - medians[k]) for k in keys if r.get(k) is not None)

    named = set(named)
    order = sorted(rows, key=lambda r: (r["rank"] not in named, -distance(r), r["rank"]))
    kept, others = order[:bars], order[bars:]
    summary: dict = {"rank": None, "ranks": len(others)}
    for k in keys:
        vals = [r[k] for r in others if r.get(k) is not None]
        summary[k] = sum(vals) / len(vals) if vals else None
    return sorted(kept, key=lambda r: r["rank"]), summary


def rank_bars(rows: list[dict], named=()) -> tuple[list[tuple[str, dict]], str]:
    """The bars of a per-rank chart, in order, as (label, row with the ``<phase>_share`` figures), and the
    axis title (``standout_ranks``: above ``BARS_AT_MOST`` ranks the last bar is the others' mean)."""
    kept, rest = standout_ranks(rows, named)
    bars = [(str(r["rank"]), r) for r in kept]
    if rest is None:
        return bars, "rank"
    bars.append((f"rest ({rest['ranks']})", rest))
    return bars, f"rank: the {len(kept)} of {len(rows)} least like the median rank; the rest, mean"


def fix_gain_text(finding: dict) -> str:
    """'fixing this could make steps up to 1.46× faster' from a finding's ``speedup`` ('' when the rule gives none)."""
    speedup = finding.get("speedup")
    if not isinstance(speedup, (int, float)) or speedup <= 1.0:
        return ""
    text = f"fixing this could make steps up to {speedup:.2f}× faster"
    return text + (" (estimate)" if finding.get("cost_basis") == "estimate" else "")


def breakdown_over_time(con, bins: int = 60) -> list[dict]:
    """Per time bin (seconds since the first step), each phase's share of step time over all ranks."""
    cur = con.execute(
        f"""
        WITH span AS (SELECT min(t_min) AS t0, greatest(max(t_max) - min(t_min), 1) AS w FROM rollup),
             binned AS (
               SELECT least(CAST(floor((t_min - t0) * $bins / w) AS BIGINT), $bins - 1) AS bin, t0, *
               FROM rollup, span)
        SELECT bin, min(t_min - t0) / 1e9 AS t_s, sum(n) AS rows, sum(step_sum) / sum(n) AS step_mean_s, {_SHARES}
        FROM binned GROUP BY bin ORDER BY bin
        """,
        {"bins": int(bins)},
    )
    return _rows(cur)


def rank_order(con, order: str = "mean step time (slowest first)") -> list[int]:
    """Every rank, sorted by one of ``RANK_ORDERS`` (worst first), for the heatmaps' rows."""
    if order not in RANK_ORDERS:
        raise ValueError(f"unknown rank order {order!r}; choose one of: {', '.join(RANK_ORDERS)}")
    expr, direction = RANK_ORDERS[order]
    sql = f"WITH {_KEPT} SELECT rank FROM kept GROUP BY rank ORDER BY {expr} {direction} NULLS LAST, rank"
    return [r[0] for r in con.execute(sql).fetchall()]


def heatmap(
    con, metric: str, ranks: list[int], bins: int = 60, max_rows: int = 128, solo: int = 0, chunk_steps: int = 1
) -> dict:
    """Rank x step-column cells of one metric, rows in the order of ``ranks`` (see ``rank_order``).

    The time axis is in steps: columns of ``column_steps`` steps each, from step 0, so a column's place and
    width stay put while the run grows. Above ``max_rows`` ranks, neighbours in that order share a row that
    shows the worst value of its members (max, or min for utilization), so one bad rank still stands out at
    1,024 ranks. The first ``solo`` ranks (the worst, in that order) keep a row each, so at 10,000 ranks the
    ones to look at are named one by one and the healthy mass below is summarised in groups. The colour
    scale is ``colour_scale``'s, fixed for the run. Returns ``{"cells": [{"row", "bin", "step", "value",
    "label"}], "rows": [{"row", "label", "ranks"}], "group": k, "col_steps", "bins", "step_s", "scale"}``.
    """
    m = _check_metric(metric)
    if m.source == "steps":
        return step_heatmaps(con, ranks, bins, max_rows, solo, chunk_steps, (metric,))[metric]
    layout = _Layout(ranks, max_rows, solo)
    last, step_s = _last_and_mean(con)
    col = column_steps(last or 0, bins, chunk_steps)
    worst = "max" if m.worse == "high" else "min"
    sql = f"""
        WITH vals AS (SELECT rank, step, value AS s, 1 AS n FROM samples WHERE name = $name),
             per_rank AS (SELECT rank, step // $col AS bin, sum(s) / nullif(sum(n), 0) AS v FROM vals GROUP BY ALL),
             {_ORDER}
        SELECT {_ROW} AS row, bin, bin * $col AS step, {worst}(v) AS value
        FROM per_rank JOIN ord USING (rank) WHERE v IS NOT NULL GROUP BY ALL ORDER BY row, bin
    """
    found = con.execute(sql, {"name": m.key, "col": col, **layout.params}).fetchall()
    cells = layout.cells(found, 0)
    scale = colour_scale(con, metric, chunk_steps, last)
    return layout.heatmap(m, cells, col, bins, step_s, scale)


STEP_METRICS = tuple(k for k, m in HEATMAP_METRICS.items() if m.source == "steps")
"""The heatmap metrics the rollup holds (every one worse when higher, on the step time's colour scale)."""


def step_heatmaps(
    con, ranks: list[int], bins: int = 60, max_rows: int = 128, solo: int = 0, chunk_steps: int = 1,
    metrics: tuple[str, ...] = STEP_METRICS,
) -> dict[str, dict]:  # fmt: skip
    """{metric: its ``heatmap``} for each of ``metrics`` (``STEP_METRICS``), from one scan of the rollup.

    Why one: the Heatmaps page draws every step metric at each refresh, and each heatmap of its own scanned
    every row of the rollup again; the cells and the colour scale are the same as one metric's alone."""
    for metric in metrics:
        if _check_metric(metric).source != "steps":
            raise ValueError(f"{metric!r} is not a step metric; choose from: {', '.join(STEP_METRICS)}")
    layout = _Layout(ranks, max_rows, solo)
    last, step_s = _last_and_mean(con)
    col = column_steps(last or 0, bins, chunk_steps)
    means = ", ".join(f"sum({k[:-2]}_sum) / nullif(sum(n), 0) AS v{i}" for i, k in enumerate(metrics))
    worst = ", ".join(f"max(v{i}) AS value{i}" for i in range(len(metrics)))
    sql = f"""
        WITH per_rank AS (SELECT rank, step_min // $col AS bin, {means} FROM rollup GROUP BY ALL), {_ORDER}
        SELECT {_ROW} AS row, bin, bin * $col AS step, {worst}
        FROM per_rank JOIN ord USING (rank) GROUP BY ALL ORDER BY row, bin
    """
    found = con.execute(sql, {"col": col, **layout.params}).fetchall()
    scale = colour_scale(con, metrics[0], chunk_steps, last) if metrics else None  # one scale for the times
    return {
        key: layout.heatmap(HEATMAP_METRICS[key], layout.cells(found, i), col, bins, step_s, scale)
        for i, key in enumerate(metrics)
    }


_ORDER = "ord AS (SELECT unnest($order) AS rank, generate_subscripts($order, 1) - 1 AS pos)"
_ROW = "CASE WHEN ord.pos < $solo THEN ord.pos ELSE $solo + (ord.pos - $solo) // $group END"
"""A rank's heatmap row from its place in the order (``_Layout``): the first ``solo`` alone, then ``group`` a row."""


def _last_and_mean(con) -> tuple:
    """(the run's last step, its mean step time) from the rollup's totals."""
    return con.execute(f"SELECT max(step_max), sum(step_sum) / nullif(sum(n), 0) FROM {RANKS_TABLE}").fetchone()


class _Layout:
    """A heatmap's rows: the first ``solo`` ranks of the order one a row, the rest ``group`` a row."""

    def __init__(self, ranks: list[int], max_rows: int, solo: int) -> None:
        self.solo = max(0, min(int(solo), len(ranks), int(max_rows) - 1)) if len(ranks) > max_rows else 0
        self.group = max(1, -(-(len(ranks) - self.solo) // max(1, int(max_rows) - self.solo)))
        members = [ranks[i : i + 1] for i in range(self.solo)]
        members += [ranks[i : i + self.group] for i in range(self.solo, len(ranks), self.group)]
        self.members = members
        self.labels = [_row_label(m) for m in members]
        self.params = {"group": self.group, "solo": self.solo, "order": [int(r) for r in ranks]}

    def cells(self, found: list[tuple], i: int) -> list[dict]:
        """The cells of the ``i``-th value of each (row, bin, step, values...) row found, those with a value."""
        labels = self.labels
        return [
            {"row": r[0], "bin": r[1], "step": r[2], "value": r[3 + i], "label": labels[r[0]]}
            for r in found
            if r[3 + i] is not None
        ]

    def heatmap(self, m: Metric, cells: list[dict], col: int, bins: int, step_s, scale: dict | None) -> dict:
        """The ``heatmap`` dict of one metric's ``cells``."""
        rows = [{"row": i, "label": label, "ranks": r} for i, (label, r) in enumerate(zip(self.labels, self.members))]
        out = {"cells": cells, "rows": rows, "group": self.group, "metric": m.key, "label": m.label, "unit": m.unit}
        out.update(col_steps=col, bins=max(1, int(bins)), step_s=step_s, scale=scale)
        return out


SCALE_STEPS = 50
"""Steps after warm-up whose values fix a heatmap's colour scale (at least 4 rollup chunks)."""
SCALE_QUANTILE = 0.95
SCALE_HEADROOM = 1.25


def colour_scale(con, metric: str, chunk_steps: int = 1, last_step: int | None = None) -> dict:
    """The colour scale of a heatmap, fixed for the run: 0 to ``SCALE_HEADROOM`` x the ``SCALE_QUANTILE``
    quantile of the per-rank values over the first ``SCALE_STEPS`` steps after warm-up (time metrics: of the
    step time, so every time heatmap of a run reads on one scale; utilization: 0-100 %).

    Why: a scale from each refresh's min and max changed colours at every refresh, let warm-up steps set it,
    and made a flat 82-87 ms look dark red. From 0, a flat run looks flat; from a quantile, one outlier does
    not wash the rest out; from a fixed window, the colours mean the same as the run goes on (values above
    the top are drawn in the top colour). Until the run has passed the window, the steps so far (``fixed``
    False). ``last_step``: the run's highest step, where the caller has it.
    Returns ``{"low", "high", "first_step", "last_step", "fixed", "basis"}``.
    """
    m = _check_metric(metric)
    if m.unit == "ratio":
        return {"low": 0.0, "high": 1.0, "first_step": None, "last_step": None, "fixed": True, "basis": "0-100 %"}
    span = max(SCALE_STEPS, 4 * max(1, int(chunk_steps)))
    first, last = WARMUP_STEPS, WARMUP_STEPS + span - 1
    if m.source == "steps":
        sql = """SELECT quantile_cont(step_sum / n, $q), min(step_min), max(step_max) FROM rollup
                 WHERE step_min >= $first AND step_max <= $last AND n > 0"""
        params: dict = {}
        basis = "step time"
    else:
        sql = """SELECT quantile_cont(value, $q), min(step), max(step) FROM samples
                 WHERE name = $name AND step BETWEEN $first AND $last"""
        params = {"name": m.key}
        basis = m.label
    q, lo, hi = con.execute(sql, {**params, "q": SCALE_QUANTILE, "first": first, "last": last}).fetchone()
    if q is None:  # no step after warm-up yet: the steps so far
        q, lo, hi = con.execute(sql, {**params, "q": SCALE_QUANTILE, "first": 0, "last": last}).fetchone()
    high = float(q) * SCALE_HEADROOM if q else None
    if last_step is None:
        last_step = con.execute(f"SELECT max(step_max) FROM {RANKS_TABLE}").fetchone()[0]
    fixed = last_step is not None and last_step >= last
    return {"low": 0.0, "high": high, "first_step": lo, "last_step": hi, "fixed": fixed, "basis": basis}


def _row_label(ranks: list[int]) -> str:
    """A heatmap row's name: its worst rank, and how many more share the row."""
    return f"r{ranks[0]}" if len(ranks) == 1 else f"r{ranks[0]} +{len(ranks) - 1}"


def rank_outliers(con, top: int = 10) -> list[dict]:
    """Ranks with the least compute relative to the best (stragglers first).

    Compute score = the fastest rank's compute time over this rank's (1.0 = as fast as the best); wall
    step time is not used because all-reduce makes every rank wait for the slowest.
    """
    cur = con.execute(
        f"""
        WITH {_KEPT},
             per_rank AS (
               SELECT rank, any_value(node) AS node, sum(step_sum) / sum(n) AS step_mean_s,
                      sum(compute_eff_sum) / sum(n) AS compute_mean_s, sum(data_wait_sum) / sum(n) AS data_wait_mean_s,
                      sum(comm_exposed_sum) / sum(n) AS comm_exposed_mean_s
               FROM kept GROUP BY rank)
        SELECT *, min(compute_mean_s) OVER () / nullif(compute_mean_s, 0) AS compute_score
        FROM per_rank ORDER BY compute_score ASC NULLS LAST, rank LIMIT ?
        """,
        [int(top)],
    )
    return _rows(cur)


def compile_events(con) -> list[dict]:
    """Graph breaks and recompiles grouped by reason: count, ranks, first and last step."""
    cur = con.execute(
        """
        SELECT kind, coalesce(reason, '?') AS reason, sum(count) AS count, count(DISTINCT rank) AS ranks,
               min(step) AS first_step, max(step) AS last_step, any_value(detail) AS detail
        FROM compile GROUP BY ALL ORDER BY count DESC, kind, reason
        """
    )
    return _rows(cur)


def sample_series(con, names: tuple[str, ...], bins: int = 60) -> list[dict]:
    """Per time bin and sample name: mean, min and max over ranks (absent names give no rows)."""
    unknown = [n for n in names if n not in SAMPLE_NAMES]
    if unknown:
        raise ValueError(f"unknown sample names: {', '.join(unknown)}")
    cur = con.execute(
        """
        WITH vals AS (SELECT * FROM samples WHERE list_contains($names, name)),
             span AS (SELECT min(time_ns) AS t0, greatest(max(time_ns) - min(time_ns), 1) AS w FROM vals)
        SELECT name, least(CAST(floor((time_ns - t0) * $bins / w) AS BIGINT), $bins - 1) AS bin,
               min(time_ns - t0) / 1e9 AS t_s, avg(value) AS mean, min(value) AS min, max(value) AS max
        FROM vals, span GROUP BY ALL ORDER BY name, bin
        """,
        {"names": list(names), "bins": int(bins)},
    )
    return _rows(cur)


def sample_per_rank(con, names: tuple[str, ...]) -> list[dict]:
    """Per rank and sample name: the mean value (to set NVML utilization beside kernel-busy share)."""
    cur = con.execute(
        "SELECT rank, name, avg(value) AS mean FROM samples WHERE list_contains($names, name) "
        "GROUP BY ALL ORDER BY rank, name",
        {"names": list(names)},
    )
    return _rows(cur)


def sample_names_present(con) -> list[str]:
    """Sample names the run recorded (GPU signals are absent on a CPU job)."""
    return [r[0] for r in con.execute("SELECT DISTINCT name FROM samples ORDER BY name").fetchall()]
