"""The per-rank medians of a spool's step files, kept sorted between readings and fed only the files added since.

Why: a median does not merge (``ranksight.format.verdict_digest``), so where a rank's rows are in several files
the verdict reads every step row again for its medians (``_summary._rows_medians``), and a live dashboard's
refresh, which does so each time, grew with the run. A reading opened with ``incremental=True`` (``open_run``)
takes them from here instead: each rank's values of each figure, kept sorted in this process, take in the rows
of the files not read yet, and the median is read off the middle: the same number as DuckDB's ``median`` of the
rows. A file that is gone or changed starts the fold again from every file.
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
"""Values kept at most per fold (8 bytes each: 256 MB; 1,024 ranks x ~15,000 steps of the two figures a CPU job
records); a bigger run's medians are read from its rows at each reading, as without the fold."""
KEPT_FOLDS = 2
"""Folds kept in a process, least recently used dropped first (a dashboard compares two runs at most)."""

_lock = threading.Lock()
_folds: OrderedDict[tuple, _Fold] = OrderedDict()
_too_big: dict[tuple, int] = {}  # key -> the files it had when its fold passed ``KEPT_MEDIAN_VALUES``


class _Fold:
    """The values of the files read so far: per figure, {rank: its values after warm-up, sorted}."""

    def __init__(self, figures: tuple[str, ...]) -> None:
        self.files: dict[str, tuple[int, int, int]] = {}
        self.values: dict[str, dict[int, object]] = {f: {} for f in figures}
        self.count = 0

    def take_in(self, figure: str, ranks, values) -> None:
        """Add ``values`` of ``figure`` (numpy, one per row, ``ranks`` beside them) to each rank's sorted values."""
        import numpy as np

        keep = ~np.isnan(values)  # NULL (a figure the row does not have) is left out, as ``median`` leaves it
        ranks, values = ranks[keep], values[keep]
        if not len(values):
            return
        order = np.lexsort((values, ranks))
        ranks, values = ranks[order], values[order]
        starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
        kept = self.values[figure]
        for rank, part in zip(ranks[starts].tolist(), np.split(values, starts[1:])):
            held = kept.get(rank)
            kept[rank] = part if held is None else np.insert(held, np.searchsorted(held, part), part)
        self.count += len(values)

    def medians(self) -> dict[str, dict[int, float]]:
        """{figure: {rank: median}}: DuckDB's ``median`` of each rank's values (the mean of the two middle
        ones where their count is even: ``(lo + hi) / 2``, as DuckDB computes it; a test holds them equal)."""
        out: dict[str, dict[int, float]] = {}
        for figure, by_rank in self.values.items():
            found = out[figure] = {}
            for rank, held in by_rank.items():
                n = len(held)
                middle = n // 2
                found[rank] = float(held[middle]) if n % 2 else (float(held[middle - 1]) + float(held[middle])) / 2
        return out


def folded_medians(con, files: list[str], figures: tuple[str, ...], warmup_steps: int) -> dict | None:
    """{figure: {rank: median over the rank's rows after warm-up}} of the step rows of ``files`` (the paths a
    reading's ``steps`` view names, as DuckDB opens them), the rows of ``SAMPLED_SQL`` alone, as
    ``_rows_medians`` takes them; reads only the files this process has not folded yet. None where the files'
    rows do not read here or the fold would exceed ``KEPT_MEDIAN_VALUES``: the caller reads the rows then."""
    import duckdb
    import numpy as np

    key = (os.path.dirname(files[0]), figures, warmup_steps)
    signatures = {p: file_signature(p) for p in files}
    with _lock:
        if len(files) >= _too_big.get(key, len(files) + 1):
            return None  # passed the bound before, and the run only grows: not read again to find that out
        fold = _folds.pop(key, None)
        if fold is None or any(signatures.get(p) != s for p, s in fold.files.items()):
            fold = _Fold(figures)
        fresh = [p for p in files if p not in fold.files]
        if fresh:
            cols = ", ".join(f"CAST({MEDIANS[f][0]} AS DOUBLE)" for f in figures)
            source = "read_parquet($files, union_by_name = true)"
            cur = con.cursor()
            try:
                # Columns an older agent did not write read as NULL, as in the views.
                columns = select_list(cur, source, "steps", {"files": fresh})
                sql = (
                    f"SELECT CAST(rank AS BIGINT), {cols} FROM (SELECT {columns} FROM {source})"
                    f" WHERE step >= $warmup AND {SAMPLED_SQL}"
                )
                rows = cur.execute(sql, {"files": fresh, "warmup": warmup_steps}).fetchnumpy()
            except duckdb.Error:
                return None  # a file of another schema: the rows' query reads it as the views do
            finally:
                cur.close()
            columns = list(rows.values())
            ranks = np.asarray(columns[0], dtype=np.int64)
            for figure, column in zip(figures, columns[1:]):
                fold.take_in(figure, ranks, np.ma.filled(np.ma.asarray(column, dtype=np.float64), np.nan))
            if fold.count > KEPT_MEDIAN_VALUES:
                _too_big[key] = len(files)
                return None  # dropped: too big to keep
            fold.files.update((p, signatures[p]) for p in fresh)
        _folds[key] = fold
        while len(_folds) > KEPT_FOLDS:
            _folds.popitem(last=False)
        return fold.medians()
