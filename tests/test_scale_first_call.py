"""A fresh process's first verdict, made cheaper in Python over many ranks (cpu_scale_history.md "Scale v4"): the rank
files read in one opening each, each rank's features started from a copied blank, the wait figures of a rank
that never arrived last set at once. The same features and verdicts as before those changes: commit 0ec3d5f's
(its reading of the rows, which the digests' exact medians give as well),
kept in ``tests/data/scale_v4_features_0ec3d5f.json.gz`` for synthetic runs (CPU and GPU rows, four ranks of
varied rank files, read from the digests and from the rows), made again with::

    git archive 0ec3d5f | tar -x -C OLD_SRC && pip install --no-deps --no-build-isolation --target OLD OLD_SRC
    PYTHONPATH=OLD:. python -c "from tests.test_scale_first_call import write_snapshot; write_snapshot()"

(the checkout's ``tests`` package, the older ``ranksight``: an editable install must not shadow OLD).
"""

from __future__ import annotations

import gzip
import json
import math
import os

import pytest

from ranksight.collectors._queries import _wait_figures_of
from ranksight.collectors._rank_files import read_rank_files
from ranksight.rules import diagnose

from ._golden import run_features
from .test_digests import RANKS, _published_run
from .test_verdict_digests import _from_rows

SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "scale_v4_features_0ec3d5f.json.gz")

_RANK_FILES = {
    0: {"ddp": {"backend": "gloo", "bucket_cap_bytes": 26214400, "find_unused_parameters": True, "static_graph": None},
        "loader": {"num_workers": 2, "pin_memory": False, "batch_size": 32, "prefetch_factor": 2},
        "host": {"cpu_count": 8, "cpus_allowed": 4, "torch_threads": 4, "load_avg_1m": 6.5},
        "counters": {"records_dropped_total": 0, "agent_errors_total": 1},
        "model": {"parameter_bytes": 4_000_000, "devices": ["cpu"], "class": "OptimizedModule"},
        "optimizer": {"states_per_param": 2}, "ddp_logging": {"iteration": 10, "unused_parameter_size": 128}},
    1: {"ddp": {"backend": "nccl", "gradient_as_bucket_view": True},
        "host": {"cpu_count": 16, "local_world_size": 2},
        "model": {"parameter_bytes": 8_000_000, "devices": ["cuda:1"]},
        "gpu_device": {"total_memory_bytes": 80_000_000_000}, "optimizer": {"states_per_param": 1},
        "framework": "lightning", "data_source": "loader"},
    2: {},
    3: {"loader": {"num_workers": 0, "persistent_workers": False}, "host": {"cpus_allowed": 2, "torch_threads": 8},
        "parallelism": "fsdp2", "host_other_top": {"top": [{"where": "collate", "share": 0.4}], "other_samples": 9}},
}  # fmt: skip
"""What each rank's entry in the node's rank file says beyond its identity: DDP on gloo and on NCCL, a loader,
host facts, nothing."""


def _run(tmp_path, gpu: bool) -> str:
    run = _published_run(tmp_path, gpu=gpu)
    path = os.path.join(run, "ranks", "node-nodeA.json")  # the node spool's one rank file for its ranks
    with open(path) as f:
        node = json.load(f)
    node["ranks"] = [{**meta, **_RANK_FILES[meta["rank"]]} for meta in node["ranks"]]
    assert sorted(meta["rank"] for meta in node["ranks"]) == list(RANKS)
    with open(path, "w") as f:
        json.dump(node, f)
    return run


def _verdicts(run: str) -> dict:
    """The features and the findings of ``run``, from its digests and from its rows, as JSON holds them."""

    def read(path: str) -> dict:
        verdict = diagnose(path)
        return {
            "features": {str(r): f for r, f in run_features(path).items()},
            "findings": [[f["rule"], f["ranks"], f["severity"], f["confidence"]] for f in verdict["findings"]],
            "checklist": verdict["checklist"],
        }

    return {"digests": read(run), "rows": _from_rows(read, run)}


def write_snapshot(path: str = SNAPSHOT) -> None:
    """Write the snapshot of the installed ``ranksight`` (the module docstring's command)."""
    import tempfile
    from pathlib import Path

    out = {}
    for gpu in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            out["gpu" if gpu else "cpu"] = _verdicts(_run(Path(tmp), gpu))
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(out, sort_keys=True, default=str).encode())


def _same(a, b, where: str) -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300) or (math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), where  # the same features, in the same order
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_the_features_and_verdicts_are_those_of_the_code_before(tmp_path, kind):
    with gzip.open(SNAPSHOT) as f:
        before = json.loads(f.read())[kind]
    now = json.loads(json.dumps(_verdicts(_run(tmp_path, kind == "gpu")), sort_keys=True, default=str))
    for source, kept in now.items():  # features added since (new samples): absent on these runs, not compared
        for rank, feats in kept["features"].items():
            for name in [n for n in feats if n not in before[source]["features"].get(rank, feats)]:
                assert feats.pop(name) is None, name
    assert before["digests"]["findings"] or before["rows"]["findings"]  # the snapshot judges something
    # The digests' medians are exact now (the files' own, or the rows'): read from the digests, the run is what
    # the code before read from the rows, histogram medians and all they decided included.
    _same(now, {"digests": before["rows"], "rows": before["rows"]}, kind)


def test_a_rank_file_is_read_whole_in_one_opening_with_its_own_time(tmp_path):
    from ranksight.collectors._rank_files import _read_whole  # here: the snapshot's writer imports this module

    folder = tmp_path / "ranks"
    folder.mkdir()
    big = {"rank": 0, "status": "running", "heartbeat_ns": 5, "host": {"pad": "x" * 200_000}}  # several reads
    small = {"rank": 1, "status": "finished", "heartbeat_ns": 7, "steps": 3}
    (folder / "rank-00000.json").write_text(json.dumps(big))
    (folder / "rank-00001.json").write_text(json.dumps(small))
    (folder / "rank-00002.json").mkdir()  # not a file: read as a rank of status unknown, as before
    (folder / "rank-00003.json").write_text("")  # empty: not valid JSON
    for name in ("rank-00000.json", "rank-00001.json"):
        path = str(folder / name)
        data, mtime_ns = _read_whole(path)
        assert data == (folder / name).read_bytes() and mtime_ns == os.stat(path).st_mtime_ns
    assert _read_whole(str(folder / "rank-00003.json"))[0] == b""
    metas = {m.rank: m for m in read_rank_files(str(tmp_path))}
    assert metas[0].data["host"]["pad"] == "x" * 200_000 and metas[0].status == "running"
    assert metas[1].steps == 3 and metas[1].problem is None
    assert metas[2].status == metas[3].status == "unknown"
    assert "cannot be read" in metas[2].problem and "not valid JSON" in metas[3].problem
    with pytest.raises(FileNotFoundError):
        _read_whole(str(folder / "rank-00009.json"))


def test_a_rank_never_last_at_a_collective_gets_the_figures_of_no_late_step(monkeypatch):
    from ranksight.collectors import _features
    from ranksight.collectors._features import FEATURES, _wait_figures

    # (step, period, grad floor, _, timed, least, second, least rank, extra cpu, cpu, busy) as wait_rows gives them
    rows = [(s, 0.1, 0.01, None, True, 0.002, 0.004 + 0.001 * s, s % 2, 0.001, 0.01, 0.02) for s in range(6)]
    _, per_rank = _wait_figures_of(rows, [0, 1, 2, 3])
    assert list(per_rank) == [0, 1]  # only the ranks the others waited for: ranks 2 and 3 never were
    for rank in (0, 1):  # half the steps each
        per = per_rank[rank]
        assert per["least_wait_step_share"] == 0.5 and per["straggler_cost_share"] > 0
        assert per["straggler_cost_share_noise"] > 0
    monkeypatch.setattr(_features, "wait_asymmetry", lambda con, w, s, ranks: _wait_figures_of(rows, ranks))
    feats = {r: {**dict.fromkeys(FEATURES), "rank": r, "compute_share": 0.5} for r in range(5)}
    _wait_figures(None, 5, None, feats, [0, 1, 2, 3])  # rank 4 reports nothing
    for rank in (2, 3):  # never the least waiting: nothing is theirs, and nothing explains a lateness
        f = feats[rank]
        assert (f["least_wait_step_share"], f["straggler_cost_share"], f["straggler_cost_share_noise"]) == (0, 0, 0)
        assert f["straggler_work_explained"] is None
    assert feats[0]["least_wait_step_share"] == 0.5 and feats[0]["straggler_cost_share"] > 0
    assert feats[4]["least_wait_step_share"] is None  # not a reporting rank: unknown, not 0
