"""The read side gives the verdicts, features and context it gave before it became one summary relation
(``tests/_golden.py`` says which runs and how the figures were recorded), live and once ingested alike."""

from __future__ import annotations

import shutil

import pytest

from ranksight.collectors import ingest

from . import _golden


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    return _golden.golden_runs(str(tmp_path_factory.mktemp("golden")))


@pytest.fixture(scope="module")
def golden() -> dict:
    return _golden.load()


def test_every_golden_run_is_read(runs, golden):
    assert sorted(runs) == sorted(golden)


@pytest.mark.parametrize("stage", ["live", "finished"])
def test_figures_match_the_golden_ones(runs, golden, stage, tmp_path):
    """Live: the spool as the agent left it. Finished: the same steps after ``ingest`` (the store alone), whose
    verdict must be the live one's, to the same 1e-6."""
    failures = {}
    for name, path in runs.items():
        if stage == "finished":
            path = shutil.copytree(path, tmp_path / name)
            ingest(str(path))
        found = _golden.differences(golden[name], _golden.read_figures(str(path)))
        if found:
            failures[name] = found[:10]
    assert not failures, failures


def test_a_spool_with_step_digests_reads_the_same_live_and_finished(tmp_path):
    """The live verdict reads the summary relation from the node spool's step digests, the finished one from the
    store's copy that ``ingest`` keeps of its rows: the same numbers."""
    run = _golden.synthetic_spool(str(tmp_path / "run"), ranks=64, steps=40, digests=True)
    live = _golden.read_figures(run)
    from ranksight.collectors import open_run

    assert open_run(run, follow_spool=False).summary().read_from == ("digests",)
    ingest(run)
    assert open_run(run, follow_spool=False).summary().read_from == ("store",)
    assert not _golden.differences(live, _golden.read_figures(run), tol=1e-9)
