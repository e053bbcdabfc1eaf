"""Run folders whose names hold glob characters are read like any other."""

from __future__ import annotations

import os

import pytest

from ranksight.collectors import open_run, read_rank_meta

from .reliability._damage import write_run


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """Identity the agent needs before it writes (``write_run``)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANKSIGHT_DISABLED", raising=False)


@pytest.mark.parametrize("folder", ["run[1]", "a*b?c", "quote'd"])
def test_run_folders_with_glob_characters_are_read(tmp_path, folder):
    """The agent refuses such run ids, but a user can still rename or copy a run folder: readers escape
    glob characters and quotes in paths."""
    os.rename(write_run(str(tmp_path), "plain", steps=7), tmp_path / folder)
    path = str(tmp_path / folder)
    assert [m.rank for m in read_rank_meta(path)] == [0]
    assert open_run(path).execute("SELECT count(*) FROM steps").fetchone() == (7,)


_SETTINGS_OF_OUR_CONNECTIONS = r"""
import json, sys
from ranksight.collectors import _store, _tables, ingest, open_run
run = sys.argv[1]
setting = "SELECT current_setting('enable_progress_bar')"
con = open_run(run)
ingest(run)
print(json.dumps({
    "plain": __import__("duckdb").connect().execute(setting).fetchone()[0],
    "open_run": con.execute(setting).fetchone()[0],
    "cursor": con.cursor().execute(setting).fetchone()[0],
    "store": _store._connect(_store.store_path(run), run).execute(setting).fetchone()[0],
    "footers": _tables.quiet_connection().execute(setting).fetchone()[0],
}))
"""


def test_readers_and_ingest_draw_no_progress_bar(tmp_path):
    """In a process DuckDB takes for interactive (``python -c`` here, a REPL, a notebook) it draws a
    progress bar on stdout for a query past 2 s, also into a pipe, inside what a script reads from us. The
    connections ranksight makes (``open_run``'s and its cursors, the store's while ``ingest`` writes it,
    the footer check's) have it off; a plain DuckDB connection in the same process has it on."""
    import json
    import subprocess
    import sys

    run = write_run(str(tmp_path), "quiet", steps=7)
    out = subprocess.run(
        [sys.executable, "-c", _SETTINGS_OF_OUR_CONNECTIONS, run], capture_output=True, text=True, check=True
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found.pop("plain") is True  # what DuckDB does there unless told otherwise
    assert found == {"open_run": False, "cursor": False, "store": False, "footers": False}
