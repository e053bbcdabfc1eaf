"""The per-rank medians of a spool's step files, kept sorted between readings and fed only the files added since.

Why: a median does not merge (``ranksight.format.verdict_digest``), so where a rank's rows are in several files
the verdict reads every step row again for its medians (``_summary._rows_medians``), and a live dashboard's
refresh, which does so each time, grew with the run. A reading opened with ``incremental=True`` (``open_run``)
takes them from here instead: each rank's values of each figure, kept sorted in this process, take in the rows
of the files not read yet, and the median is read off the middle: the same number as DuckDB's ``median`` of the
rows. A file that is gone or changed starts the fold again from every file.

Past ``KEPT_MEDIAN_VALUES`` (1,024 ranks x ~15,600 steps of a CPU job) the fold keeps, of each rank's values of
each figure, a band around its median and the count of values cut on either side (``_Fold``): the median is
still read off the band, exactly, while its place stays in it. Without the bands a verdict past the bound read
its medians from the rows (at 1,024 ranks x 16,000 steps, a dashboard refresh that makes the verdict 5.2 CPU-s
against 0.86 with them, benchmarks/results/cpu_dashboard_live_history.md); a run whose figures drift until a
median leaves its band is read again from every file once (``REBUILT_AFTER_READINGS``).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from ranksight.format.phases import SAMPLED_SQL
from ranksight.format.verdict_digest import MEDIANS

from ._rundir import file_signature
from ._tables import select_list

KEPT_MEDIAN_VALUES = 32_000_000
"""Values kept at most per fold (8 bytes each: 256 MB; 1,024 ranks x ~15,600 steps of the two figures a CPU job
records). Past it each rank's values of each figure are cut to those nearest its median (``_Fold.trim``), the
values cut counted on either side, so that the fold holds half of this again and the run goes on growing."""
BAND_AT_LEAST = 1_024
"""Values a rank's band of one figure keeps at least once cut: a fold whose bound leaves fewer (more than ~15,600
ranks x figures) is dropped, and that run's medians are read from its rows at each reading, as without the fold."""
REBUILT_AFTER_READINGS = 3
"""A fold whose median has left its band is read again from every file (2-3x the CPU of reading the medians from
the rows once: cpu_dashboard_live_history.md) only where its bands held for this many readings since it was
built; else the run's figures move faster than a band follows, and the run's medians are read from its rows
from then on, as for a fold that could not be cut."""
KEPT_FOLDS = 2
"""Folds kept in a process, least recently used dropped first (a dashboard compares two runs at most)."""

_lock = threading.Lock()
_folds: OrderedDict[tuple, _Fold] = OrderedDict()
_too_big: dict[tuple, int] = {}  # key -> the files it had when its fold passed ``KEPT_MEDIAN_VALUES``


class _Fold:
    """The values of the files read so far: per figure, {rank: its values after warm-up, sorted}: all of them, or,
    once cut (``trim``), a band of them around the rank's median, with ``below`` and ``above`` it the count of
    values cut on each side.

    The median stays exact while its place falls in the band: every value cut below the band is no greater than
    the band's least, every one above no less than its greatest (a new value beyond a cut side is counted there,
    one within the band is inserted), so the rank's k-th value is the band's (k - below)-th. Where the rank's
    figures move so far that the median's place leaves the band, ``medians`` says so (None) and the reading starts
    the fold again from every file."""

    def __init__(self, figures: tuple[str, ...]) -> None:
        self.files: dict[str, tuple[int, int, int]] = {}
        self.values: dict[str, dict[int, object]] = {f: {} for f in figures}
        self.below: dict[str, dict[int, int]] = {f: {} for f in figures}
        self.above: dict[str, dict[int, int]] = {f: {} for f in figures}
        self.count = 0  # values kept
        self.readings = 0  # the readings it answered since it was built

    def take_in(self, figure: str, ranks, values) -> None:
        """Add ``values`` of ``figure`` (numpy, one per row, ``ranks`` beside them) to each rank's sorted values."""
        import numpy as np

        keep = ~np.isnan(values)  # NULL (a figure the row does not have) is left out, as ``median`` leaves it
        if not keep.all():
            ranks, values = ranks[keep], values[keep]
        if not len(values):
            return
        # By rank (a stable sort of whole numbers), then each rank's values on their own: a third of the CPU of
        # one ``lexsort`` of both (2.0 s against 6.6 s for 16 M values). Ranks below 65,536 are sorted as 16-bit
        # numbers, which numpy's stable sort orders by radix, in linear time.
        small = 0 <= ranks.min() and ranks.max() < 1 << 16
        order = np.argsort(ranks.astype(np.uint16) if small else ranks, kind="stable")
        ranks, values = ranks[order], values[order]
        starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
        kept, below, above = self.values[figure], self.below[figure], self.above[figure]
        for rank, part in zip(ranks[starts].tolist(), np.split(values, starts[1:])):
            part.sort()  # in place: ``values`` is this call's copy
            held = kept.get(rank)
            if held is None:
                kept[rank] = part
                self.count += len(part)
                continue
            # Beyond a side that was cut, a value is counted there: it falls among the values cut.
            lo = int(np.searchsorted(part, held[0], "left")) if below.get(rank) else 0
            hi = int(np.searchsorted(part, held[-1], "right")) if above.get(rank) else len(part)
            if lo:
                below[rank] += lo
            if hi < len(part):
                above[rank] += len(part) - hi
            inside = part[lo:hi]
            kept[rank] = np.insert(held, np.searchsorted(held, inside), inside)
            self.count += len(inside)

    def medians(self) -> dict[str, dict[int, float]] | None:
        """{figure: {rank: median}}: DuckDB's ``median`` of each rank's values (the mean of the two middle
        ones where their count is even: ``(lo + hi) / 2``, as DuckDB computes it; a test holds them equal). None
        where a median's place has left its rank's band (``trim``)."""
        out: dict[str, dict[int, float]] = {}
        for figure, by_rank in self.values.items():
            found = out[figure] = {}
            below, above = self.below[figure], self.above[figure]
            for rank, held in by_rank.items():
                a, b = _middle(held, below.get(rank, 0), above.get(rank, 0))
                if a < 0 or b >= len(held):
                    return None
                found[rank] = float(held[a]) if a == b else (float(held[a]) + float(held[b])) / 2
        return out

    def trim(self, values: int) -> bool:
        """Cut each rank's values of each figure to a band of the ``values / series`` nearest its median (the
        middle ones, as many on each side), counting those cut below and above it; False (nothing cut) where
        that band would be narrower than ``BAND_AT_LEAST``. Call it where ``medians`` is not None."""
        series = sum(len(by_rank) for by_rank in self.values.values())
        width = values // max(1, series)
        if width < BAND_AT_LEAST:
            return False
        for figure, by_rank in self.values.items():
            below, above = self.below[figure], self.above[figure]
            for rank, held in by_rank.items():
                if len(held) <= width:
                    continue
                a, b = _middle(held, below.get(rank, 0), above.get(rank, 0))
                start = max(0, min(a - (width - (b - a + 1)) // 2, len(held) - width))
                end = start + width
                below[rank] = below.get(rank, 0) + start
                above[rank] = above.get(rank, 0) + len(held) - end
                by_rank[rank] = held[start:end].copy()  # a copy: the rest of the array is freed
                self.count -= len(held) - width
        return True


def _middle(held, below: int, above: int) -> tuple[int, int]:
    """The places in a band of the middle value(s) of its rank's ``below + len(held) + above`` values (one place
    twice where their count is odd)."""
    n = below + len(held) + above
    return (n - 1) // 2 - below, n // 2 - below


def folded_medians(con, files: list[str], figures: tuple[str, ...], warmup_steps: int) -> dict | None:
    """{figure: {rank: median over the rank's rows after warm-up}} of the step rows of ``files`` (the paths a
    reading's ``steps`` view names, as DuckDB opens them), the rows of ``SAMPLED_SQL`` alone, as
    ``_rows_medians`` takes them; reads only the files this process has not folded yet (every file again where a
    median has left its band, ``_Fold``). None where the files' rows do not read here, or a fold past
    ``KEPT_MEDIAN_VALUES`` could not be cut (``BAND_AT_LEAST``) and was dropped: the caller reads the rows then."""
    if not files:
        return None
    key = (os.path.dirname(files[0]), figures, warmup_steps)
    signatures = {p: file_signature(p) for p in files}
    with _lock:
        if len(files) >= _too_big.get(key, len(files) + 1):
            return None  # passed the bound before, and the run only grows: not read again to find that out
        fold = _folds.pop(key, None)
        if fold is None or any(signatures.get(p) != s for p, s in fold.files.items()):
            fold = _Fold(figures)
        found = None
        while found is None:
            fresh = [p for p in files if p not in fold.files]
            if fresh and not _read_into(fold, con, fresh, figures, warmup_steps):
                return None  # a file of another schema: the rows' query reads it as the views do
            fold.files.update((p, signatures[p]) for p in fresh)
            found = fold.medians()
            if found is None:  # a median left its band: every file again (a fold not cut finds every median)
                if fold.readings < REBUILT_AFTER_READINGS:
                    _too_big[key] = len(files)
                    return None
                fold = _Fold(figures)
        fold.readings += 1
        if fold.count > KEPT_MEDIAN_VALUES and not fold.trim(KEPT_MEDIAN_VALUES // 2):
            _too_big[key] = len(files)
            return found  # exact: every value was read; not kept
        _folds[key] = fold
        while len(_folds) > KEPT_FOLDS:
            _folds.popitem(last=False)
        return found


def _read_into(fold: _Fold, con, files: list[str], figures: tuple[str, ...], warmup_steps: int) -> bool:
    """Take the values of ``files``' step rows after warm-up into ``fold``; False where they do not read here."""
    import duckdb
    import numpy as np

    cols = ", ".join(f"CAST({MEDIANS[f][0]} AS DOUBLE)" for f in figures)
    source = "read_parquet($files, union_by_name = true)"
    cur = con.cursor()
    try:
        # Columns an older agent did not write read as NULL, as in the views.
        columns = select_list(cur, source, "steps", {"files": files})
        sql = (
            f"SELECT CAST(rank AS BIGINT), {cols} FROM (SELECT {columns} FROM {source})"
            f" WHERE step >= $warmup AND {SAMPLED_SQL}"
        )
        rows = cur.execute(sql, {"files": files, "warmup": warmup_steps}).fetchnumpy()
    except duckdb.Error:
        return False
    finally:
        cur.close()
    columns = list(rows.values())
    ranks = np.asarray(columns[0], dtype=np.int64)
    for figure, column in zip(figures, columns[1:]):
        fold.take_in(figure, ranks, np.ma.filled(np.ma.asarray(column, dtype=np.float64), np.nan))
    return True
