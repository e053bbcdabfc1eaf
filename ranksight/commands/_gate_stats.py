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
* **The part the phases explain** (``explained``): a busier host stretches every phase of a rank's own work
  alike (each is the thread's CPU work, or waits on it), so it moves the step but not the phases' shares of
  it; a code change moves the phase it slows. The host's stretch is read from the phases both runs share
  (``host_stretch``), and what each phase did beyond it is the code's. Between two reruns of one healthy
  job on a 2-core machine with a busy loop the step moved -7 % to +28 % while the data wait's share moved
  at most 0.3 pp: the interval above is within-run, and cannot see what differs between two runs' hosts.
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

OWN_WORK = tuple(p for p in COLUMNS[1:] if p != "comm_exposed_s")
"""The phases of a rank's own work, which a busier host stretches alike. Not the exposed wait at collectives:
it holds the wait for the slowest peer, and which rank the load slows moves time between a rank's own work
and its peers' waits (between two healthy reruns on a 2-core machine compute's and the exposed wait's
shares traded up to 6 pp while their sum held)."""


def _weighted_median(ratio: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per row, the ratio at which the weights (sorted by ratio) reach half their sum; NaN where they are 0."""
    order = np.argsort(ratio, axis=1)
    ratio, weight = np.take_along_axis(ratio, order, 1), np.take_along_axis(weight, order, 1)
    cum = np.cumsum(weight, axis=1)
    k = np.argmax(cum >= 0.5 * cum[:, -1:], axis=1)
    return np.where(cum[:, -1] > 0, ratio[np.arange(len(ratio)), k], np.nan)


def host_stretch(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> np.ndarray:
    """Per replicate, how much longer B's own work took than A's where the code did not change it: the
    median of the own-work phases' ratios B_p / A_p weighted by their seconds. ``a`` and ``b`` map each
    phase to a replicate array.

    Why the median: a code change slows one phase or a few, the host all of them; the median is the ratio
    most of the work agrees on. Weighted by A's seconds or by B's: where a phase the code changed is most
    of one run's own work (a data wait that was 90 % of A's step and is gone in B) the two readings differ,
    one of them saying the host did what the code did (a host 30x quieter); the one closer to 1 is taken,
    as it asks less of the host. Where no phase is in both runs, the step's own ratio."""
    phases = [p for p in OWN_WORK if p in a or p in b]
    n = len(a["period_s"])
    if not phases:
        return b["period_s"] / a["period_s"]
    pa = np.stack([a.get(p, np.zeros(n)) for p in phases], axis=1)
    pb = np.stack([b.get(p, np.zeros(n)) for p in phases], axis=1)
    both = (pa > 0) & (pb > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(both, pb / np.where(both, pa, 1.0), np.inf)
    by_a = _weighted_median(ratio, np.where(both, pa, 0.0))
    by_b = _weighted_median(ratio, np.where(both, pb, 0.0))
    out = np.where(np.abs(np.log(by_a)) <= np.abs(np.log(by_b)), by_a, by_b)
    return np.where(np.isfinite(out), out, b["period_s"] / a["period_s"])


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

    ``step``: A's and B's trimmed-mean period (``a_s``, ``b_s``) and ``change`` = B / A - 1 (0.08: 8 % slower);
    ``host_stretch`` (``host_stretch``: B's own work over A's where the code left it alone) and ``explained``,
    the change the own-work phases make beyond that stretch, in A's step time (the sum of their ``excess``).
    ``phases[p]``: ``contribution``, the phase's part of that change in A's step time ((B_p - A_p) / A; they
    add up to the change), ``share_a``, ``share_b``, ``share_change`` (B's share - A's, in points) and, for
    the own-work phases, ``excess``: (B_p / stretch - A_p) / A, its part beyond the host's stretch.
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
    stretch_point = host_stretch(point_a, point_b)[0]
    stretch = host_stretch(boot_a, boot_b)
    out["step"]["host_stretch"] = _interval(stretch_point, stretch, confidence, widen)
    explained_point, explained = 0.0, np.zeros(replicates)
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
        if p in OWN_WORK:
            point = (pb / stretch_point - pa) / ta
            reps = (rb / stretch - ra) / boot_a["period_s"]
            out["phases"][p]["excess"] = _interval(point, reps, confidence, widen)
            explained_point, explained = explained_point + point, explained + reps
    out["step"]["explained"] = _interval(explained_point, explained, confidence, widen)
    return out
