"""How much slower (or faster) B's steps are than A's, with a confidence interval: a block bootstrap.

Why this estimator:

* **A 20 % trimmed mean of the step period** (the steps ranked by period, the fastest and slowest fifth left
  out, the rest averaged; Wilcox's default robust location). A one-off stall (a checkpoint, a page-cache miss,
  another process taking the core) moves a plain mean; it does not move this. A steady slowdown of every
  step, which is what a regression is, moves it fully.
* **Phases averaged over the same kept steps**, so the phases' means add up to the period's: the change in
  step time splits exactly into the phases' contributions (in points of A's step time).
* **A circular block bootstrap**, each run resampled on its own: neighbouring steps share the machine's
  load, so resampling single steps would pretend they are independent and give too narrow an interval.
  The blocks are as long as the run's own load memory (its autocorrelation time), and when that leaves
  few blocks the interval widens as Student's t does for few draws. The resampling is seeded, so the same
  two runs always give the same interval and the same gate verdict.
"""

from __future__ import annotations

import math

import numpy as np

from ._gate_samples import COLUMNS

TRIM = 0.2
"""Share of steps left out at each end of the period's ranking."""

REPLICATES = 2000
"""Bootstrap replicates: enough for a stable 2.5th/97.5th percentile."""

RESAMPLED_STEPS = 4_000_000
"""Resampled steps per run at most: a long run gets fewer replicates (at least 400), so a 10,000-step run is
judged in seconds; its blocks are many, so its percentiles need fewer draws to settle."""

MIN_STEPS = 40
"""Fewest kept steps per run (after the warm-up) the gate decides on: fewer than about six blocks of seven
steps give an interval that says more about the resampling than about the run."""

SEED = 0
"""The resampling's seed: one comparison, one answer."""


def correlation_steps(period: np.ndarray) -> float:
    """How many steps apart two steps' periods stop sharing the machine's load: the integrated
    autocorrelation time 1 + 2 * sum(rho_k), summed until rho_k first drops to 0 (at most n / 4 lags),
    on the period winsorised at its 10th and 90th percentiles so that a few stalls do not set it."""
    n = len(period)
    if n < 8:
        return 1.0
    lo, hi = np.quantile(period, [0.1, 0.9])
    x = np.clip(period, lo, hi)
    x = x - x.mean()
    var = float(x @ x)
    if var <= 0:
        return 1.0
    tau = 1.0
    for k in range(1, n // 4):
        rho = float(x[:-k] @ x[k:]) / var
        if rho <= 0:
            break
        tau += 2 * rho
    return tau


def block_length(n: int, period: np.ndarray | None = None) -> int:
    """The bootstrap's block length for a series of ``n`` steps: as long as the load's memory
    (``correlation_steps`` of ``period``, where given), at least 5 steps and sqrt(n), at most n / 5 (five
    blocks: fewer would leave the interval to chance)."""
    memory = correlation_steps(period) if period is not None else 1.0
    length = max(5, round(math.sqrt(n)), math.ceil(memory))
    return max(1, min(n, length, max(5, n // 5)))


def _t_over_z(confidence: float, df: int) -> float:
    """Student's t quantile over the normal one at ``confidence`` (two-sided) with ``df`` degrees of freedom
    (Cornish-Fisher expansion; numpy has no t quantile and scipy is no dependency). Each block is one
    independent draw, so a few long blocks earn a wider interval than the percentiles of their resamples."""
    z = _z(confidence)
    df = max(df, 2)
    t = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    return t / z


def _z(confidence: float) -> float:
    """The standard normal quantile at (1 + confidence) / 2, by bisection on math.erf."""
    target, lo, hi = (1 + confidence) / 2, 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target else (lo, mid)
    return (lo + hi) / 2


def _resample(n: int, length: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``replicates`` circular block resamples of a series of ``n`` steps (one row each)."""
    blocks = -(-n // length)
    starts = rng.integers(0, n, size=(replicates, blocks))
    idx = (starts[:, :, None] + np.arange(length)[None, None, :]) % n
    return idx.reshape(replicates, -1)[:, :n]


CHUNK_VALUES = 2_000_000
"""Resampled steps handled at once: a long run's 2,000 resamples of 10,000 steps are sorted in chunks, so
memory stays at tens of megabytes."""


def _trimmed_means(series: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of ``idx`` (a resample of the series' steps): each column's mean over the steps whose period
    lies in the middle of that row's ranking (``TRIM`` left out at each end)."""
    rows = max(1, CHUNK_VALUES // max(1, idx.shape[1]))
    if idx.shape[0] > rows:
        parts = [_trimmed_means(series, idx[i : i + rows]) for i in range(0, idx.shape[0], rows)]
        return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    period = series["period_s"][idx]
    n = idx.shape[1]
    cut = int(math.floor(TRIM * n))
    # The middle of each row's ranking by value (np.partition: linear, where a sort is n log n); a tie at a
    # cut keeps every step of that period.
    bounds = np.partition(period, [cut, n - cut - 1], axis=1)
    keep = (period >= bounds[:, cut : cut + 1]) & (period <= bounds[:, n - cut - 1 : n - cut])
    count = keep.sum(axis=1)
    out = {}
    for c in COLUMNS:
        values = series[c]
        if np.all(np.isnan(values)):
            continue  # never measured here (H2D on a CPU rank): absent, not 0
        kept = np.nan_to_num(values, nan=0.0)[idx]  # an unmeasured step's phase counts as 0
        out[c] = (kept * keep).sum(axis=1) / count
    return out


def _interval(point: float, replicates: np.ndarray, confidence: float, widen: float) -> dict:
    """The percentile interval of the replicates around ``point``, each side stretched by ``widen``."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    low, high = point - widen * max(point - low, 0.0), point + widen * max(high - point, 0.0)
    return {"point": float(point), "low": float(low), "high": float(high)}


def compare_series(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], confidence: float, *, replicates: int = REPLICATES
) -> dict:
    """B's step time against A's (both a series: ``step`` and ``COLUMNS`` arrays), with intervals at
    ``confidence`` (two-sided).

    ``step``: A's and B's trimmed-mean period (``a_s``, ``b_s``) and ``change`` = B / A - 1 (0.08: 8 % slower).
    ``phases[p]``: ``contribution``, the phase's part of that change in A's step time ((B_p - A_p) / A; they
    add up to the change), and ``share_a``, ``share_b``, ``share_change`` (B's share - A's, in points).
    """
    na, nb = len(a["period_s"]), len(b["period_s"])
    replicates = max(400, min(replicates, RESAMPLED_STEPS // max(na, nb, 1)))
    rng = np.random.default_rng(SEED)
    point_a = _trimmed_means(a, np.arange(na)[None, :])
    point_b = _trimmed_means(b, np.arange(nb)[None, :])
    la, lb = block_length(na, a["period_s"]), block_length(nb, b["period_s"])
    boot_a = _trimmed_means(a, _resample(na, la, replicates, rng))
    boot_b = _trimmed_means(b, _resample(nb, lb, replicates, rng))
    widen = _t_over_z(confidence, min(na // la, nb // lb) - 1)
    ta, tb = point_a["period_s"][0], point_b["period_s"][0]
    out = {
        "steps_a": na,
        "steps_b": nb,
        "block_steps": [la, lb],
        "step": {"a_s": float(ta), "b_s": float(tb),
                 "change": _interval(tb / ta - 1, boot_b["period_s"] / boot_a["period_s"] - 1, confidence, widen)},
        "phases": {},
    }  # fmt: skip
    for p in COLUMNS[1:]:
        if p not in point_a and p not in point_b:
            continue
        pa = point_a.get(p, np.zeros(1))[0]
        pb = point_b.get(p, np.zeros(1))[0]
        ra = boot_a.get(p, np.zeros(replicates))
        rb = boot_b.get(p, np.zeros(replicates))
        out["phases"][p] = {
            "a_s": float(pa),
            "b_s": float(pb),
            "share_a": float(pa / ta),
            "share_b": float(pb / tb),
            "contribution": _interval((pb - pa) / ta, (rb - ra) / boot_a["period_s"], confidence, widen),
            "share_change": _interval(
                pb / tb - pa / ta, rb / boot_b["period_s"] - ra / boot_a["period_s"], confidence, widen
            ),
        }
    return out
