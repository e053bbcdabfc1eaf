"""Faults the agent meets on real machines: each costs no row and no traceback in the training process."""

from __future__ import annotations

import json
import os

import ranksight
from ranksight.collectors import open_run, read_rank_meta


def _steps(mon, n: int) -> None:
    for _ in range(n):
        with mon.step():
            pass


def test_a_second_init_with_the_same_run_id_keeps_both_monitors_rows(tmp_path):
    first = ranksight.init(run_dir=str(tmp_path), job="t", run_id="same", flush_interval_s=0.2)
    _steps(first, 150)
    first.close()
    second = ranksight.init(run_dir=str(tmp_path), job="t", run_id="same", flush_interval_s=0.2)
    _steps(second, 150)
    second.close()
    con = open_run(str(tmp_path / "same"))
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 300  # none overwritten


def test_a_run_dir_that_becomes_writable_later_loses_nothing_kept_in_memory(tmp_path):
    # A file where the run folder should be: the spool cannot open (as a read-only or missing mount would
    # behave for any user, root included). Then the path is fixed while the job runs.
    root = tmp_path / "runs"
    root.write_text("not a folder")
    mon = ranksight.init(run_dir=str(root), job="t", run_id="late", flush_interval_s=0.1)
    _steps(mon, 50)
    mon._worker._safe_flush(final=False)  # a flush that cannot write: rows stay in memory
    assert mon.errors == {}  # a degradation, warned once, not an agent error
    root.unlink()
    root.mkdir()
    _steps(mon, 50)
    mon.close()
    assert open_run(str(root / "late")).execute("SELECT count(*) FROM steps").fetchone()[0] == 100


def test_a_symlink_planted_at_the_rank_file_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    ranks = tmp_path / "runs" / "sym" / "ranks"
    ranks.mkdir(parents=True)
    os.symlink(victim, ranks / "rank-00000.json")
    mon = ranksight.init(run_dir=str(tmp_path / "runs"), job="t", run_id="sym", flush_interval_s=0.1)
    _steps(mon, 5)
    mon.close()
    assert victim.read_text() == "keep me"
    assert not os.path.islink(ranks / "rank-00000.json")
    assert json.loads((ranks / "rank-00000.json").read_text())["steps"] == 5
    assert [f for f in os.listdir(ranks) if f.startswith(".tmp-")] == []  # no temporary left behind
    assert [m.status for m in read_rank_meta(str(tmp_path / "runs" / "sym"))] == ["finished"]
