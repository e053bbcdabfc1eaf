"""Run folders whose names hold glob characters are read like any other."""

from __future__ import annotations

import pytest

import ranksight
from ranksight.collectors import open_run, read_rank_meta


@pytest.mark.parametrize("run_id", ["run[1]", "a*b?c", "quote'd"])
def test_run_names_with_glob_characters(tmp_path, monkeypatch, run_id):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANKSIGHT_DISABLED", raising=False)
    mon = ranksight.init(run_dir=str(tmp_path), job="paths", run_id=run_id, flush_interval_s=0.1)
    for _ in mon.loader(range(7)):
        with mon.step():
            pass
    mon.close()
    path = str(tmp_path / run_id)
    assert [m.rank for m in read_rank_meta(path)] == [0]
    assert open_run(path).execute("SELECT count(*) FROM steps").fetchone() == (7,)
