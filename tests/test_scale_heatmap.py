"""A heatmap of 10,000 ranks still names the bad ones: the worst keep a row each, the healthy mass is grouped.

Real DuckDB over a real spool of 10,000 ranks (a few steps each), read through the dashboard's rollup.
"""

from __future__ import annotations

import pytest

from ranksight.dashboard import _queries as q
from ranksight.dashboard._rollup import Rollup

from .test_dashboard import write_run


def test_a_10000_rank_heatmap_names_the_worst_ranks_one_per_row(tmp_path):
    path = write_run(str(tmp_path / "huge"), 10_000, 8, straggler=7321)
    con = Rollup(path).cursor()
    order = q.rank_order(con, "mean compute (most first)")
    assert order[0] == 7321 and len(order) == 10_000
    hm = q.heatmap(con, "compute_s", order, bins=4, max_rows=128, solo=16)
    assert len(hm["rows"]) <= 128
    assert [r["ranks"] for r in hm["rows"][:16]] == [[r] for r in order[:16]]  # one rank per row, worst first
    assert hm["rows"][0]["label"] == "r7321"
    assert sum(len(r["ranks"]) for r in hm["rows"]) == 10_000  # every rank in exactly one row
    assert sorted(r for row in hm["rows"] for r in row["ranks"]) == list(range(10_000))
    top = [c["value"] for c in hm["cells"] if c["row"] == 0]
    rest = [c["value"] for c in hm["cells"] if c["row"] != 0]
    assert min(top) == pytest.approx(0.2) and max(rest) == pytest.approx(0.1)
    # Below the row limit nothing is grouped, whatever ``solo`` says.
    small = q.heatmap(con, "compute_s", order[:50], bins=4, max_rows=128, solo=16)
    assert small["group"] == 1 and len(small["rows"]) == 50
