"""Run folders whose names hold glob characters are read like any other."""

from __future__ import annotations

import os

import pytest

import ranksight
from ranksight.collectors import open_run, read_rank_meta


@pytest.mark.parametrize("folder", ["run[1]", "a*b?c", "quote'd"])
def test_run_folders_with_glob_characters_are_read(tmp_path, monkeypatch, folder):
    """The agent refuses such run ids, but a user can still rename or copy a run folder: readers escape
    glob characters and quotes in paths."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANKSIGHT_DISABLED", raising=False)
    mon = ranksight.init(run_dir=str(tmp_path), job="paths", run_id="plain", flush_interval_s=0.1)
    for _ in mon.loader(range(7)):
        with mon.step():
            pass
    mon.close()
    os.rename(tmp_path / "plain", tmp_path / folder)
    path = str(tmp_path / folder)
    assert [m.rank for m in read_rank_meta(path)] == [0]
    assert open_run(path).execute("SELECT count(*) FROM steps").fetchone() == (7,)
