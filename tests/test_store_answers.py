"""The verdict's answers over a finished store, computed by its first reader and kept beside it: read back
only where they are the same answers.

Every time below is a multiple of 1/1024 s, so sums are exact whatever order DuckDB adds them in, and a
query run twice over the same rows gives the same floats: equality here is exact, not approximate.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import time

import duckdb

from ranksight.agent import Identity
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import ingest, keep_answers, open_run
from ranksight.collectors._answer_file import GENERATION_KEY, answers_path, generation_of, load_answers
from ranksight.collectors._answers import ANSWERS_TABLE
from ranksight.collectors._queries import step_breakdown
from ranksight.collectors._run_state import state_of
from ranksight.collectors._tables import STORE_ALIAS
from ranksight.format.warmup import WARMUP_STEPS
from ranksight.rules import diagnose

RANKS = 4


def _writer(run_path: str, rank: int) -> SpoolWriter:
    ident = Identity(job="j", run="r", node=f"n{rank // 2}", rank=rank, local_rank=rank % 2, world_size=RANKS, pid=7)
    return SpoolWriter(run_path, ident)


def _steps(rank: int, first: int, n: int) -> list[dict]:
    out = []
    for s in range(first, first + n):
        compute = (40 + (s * 7 + rank * 3) % 11 + (12 if rank == RANKS - 1 else 0)) / 1024
        wait = ((s * 5 + rank) % 4) / 1024
        late = rank == RANKS - 1  # the slow rank arrives last: the others wait for it at the all-reduce
        exposed = ((s % 2) if late else 12 + (s + rank) % 3) / 1024
        blocked = ((s * 3 + rank) % 3 if not late else 0) / 1024
        out.append(
            {
                "step": s,
                "time_ns": 1_700_000_000_000_000_000 + s * 100_000_000,
                "step_s": compute + wait + exposed + blocked + 2 / 1024,
                "data_wait_s": wait,
                "compute_s": compute,
                "comm_exposed_s": exposed,
                "comm_blocked_s": blocked,
                "allreduce_s": exposed * 2,
                "optimizer_s": 1 / 1024,
                "other_s": 1 / 1024,
                "cpu_s": compute + 1 / 1024,
                "collectives": 2,
                "collective_bytes": 4096,
            }
        )
    return out


def _meta(run_path: str, rank: int, status: str) -> None:
    meta = {"rank": rank, "status": status, "heartbeat_ns": time.time_ns(), "flush_interval_s": 2.0}
    meta.update({"world_size": RANKS, "node": f"n{rank // 2}", "host": {"cpu_count": 2, "cpus_allowed": 2}})
    with open(os.path.join(run_path, "ranks", f"rank-{rank:05d}.json"), "w") as f:
        json.dump(meta, f)


def _run(tmp_path, status: str = "finished", steps: int = 60) -> tuple[str, list[SpoolWriter]]:
    run = str(tmp_path / "run")
    writers = [_writer(run, r) for r in range(RANKS)]
    for rank, w in enumerate(writers):
        w.write("steps", _steps(rank, 0, steps // 2))
        w.write("steps", _steps(rank, steps // 2, steps - steps // 2))
        w.write("samples", [{"step": s, "time_ns": 1, "name": "host_load_ratio", "value": 0.5} for s in range(8)])
        _meta(run, rank, status)
    return run, writers


def _spool_only_copy(run: str, tmp_path) -> str:
    """The same rows read from the spool alone (no store, so no answers)."""
    copy = str(tmp_path / "copy" / "run")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("store.duckdb", ".*"))
    return copy


def _kept_files(run: str) -> list[str]:
    return sorted(n for n in os.listdir(run) if n.startswith(".answers-"))


def _generation(run: str) -> str | None:
    return generation_of(open_run(run, follow_spool=False), STORE_ALIAS)


def test_a_complete_store_answers_the_verdict_exactly_as_its_rows_do(tmp_path):
    run, _ = _run(tmp_path)
    ingest(run)
    assert _kept_files(run) == []  # ingest copies rows only
    con = open_run(run, follow_spool=False)
    assert con.path_for() == "answers"  # the store alone, the run ended: answered exactly, computed first
    assert inspect.signature(diagnose).parameters["warmup_steps"].default == WARMUP_STEPS
    copy = _spool_only_copy(run, tmp_path)
    assert step_breakdown(con) == step_breakdown(open_run(copy, follow_spool=False))
    assert _kept_files(run) == [os.path.basename(answers_path(run, _generation(run)))]
    assert len(load_answers(run, _generation(run))) > 5
    assert keep_answers(run) is None  # kept already
    assert isinstance(state_of(open_run(run, follow_spool=False)).answers_from, dict)
    answered, computed = diagnose(run), diagnose(copy)
    assert answered["findings"] and answered == computed
    # Another warm-up or a recent window asks other questions: computed, and still the rows' answers.
    assert diagnose(run, warmup_steps=3) == diagnose(copy, warmup_steps=3)
    assert diagnose(run, since_s=2.0) == diagnose(copy, since_s=2.0)


def test_the_first_reader_answers_as_the_kept_answers_do(tmp_path):
    run, _ = _run(tmp_path)
    ingest(run)
    first = diagnose(run)  # computes them, and answers from them
    assert _kept_files(run) and diagnose(run) == first == diagnose(_spool_only_copy(run, tmp_path))
    assert keep_answers(run) is None


def test_answers_that_cannot_be_kept_or_read_are_computed_again(tmp_path):
    run, _ = _run(tmp_path)
    ingest(run)
    expected = diagnose(_spool_only_copy(run, tmp_path))
    path = answers_path(run, _generation(run))
    with open(path, "w") as f:
        f.write('{"a crash midway": ')  # not a file a rename leaves, but read as none all the same
    assert diagnose(run) == expected and load_answers(run, _generation(run)) is not None
    os.remove(path)
    os.mkdir(path)  # in the way of the rename, for root too: each reader computes them and keeps none
    try:
        assert keep_answers(run) is not None and load_answers(run, _generation(run)) is None
        assert diagnose(run) == expected and keep_answers(run) is not None
    finally:
        os.rmdir(path)
    assert not [n for n in os.listdir(run) if n.startswith(".tmp-")]


def test_a_store_written_before_generations_answers_from_its_own_table(tmp_path):
    run, _ = _run(tmp_path)
    ingest(run)
    keep_answers(run)
    generation = _generation(run)
    kept = load_answers(run, generation)
    os.remove(answers_path(run, generation))
    con = duckdb.connect(os.path.join(run, "store.duckdb"))  # as an older ingest left it
    con.execute("DELETE FROM _store_meta WHERE key = ?", [GENERATION_KEY])
    con.execute(f"CREATE TABLE {ANSWERS_TABLE} (key VARCHAR PRIMARY KEY, answer VARCHAR)")
    con.executemany(f"INSERT INTO {ANSWERS_TABLE} VALUES (?, ?)", list(kept.items()))
    con.close()
    reader = open_run(run, follow_spool=False)
    assert state_of(reader).answers_from == STORE_ALIAS
    assert diagnose(run) == diagnose(_spool_only_copy(run, tmp_path)) and _kept_files(run) == []


def test_rows_the_answers_did_not_see_are_never_answered_for(tmp_path):
    run, writers = _run(tmp_path)
    ingest(run)
    assert keep_answers(run) > 0
    before = _generation(run)
    for rank, w in enumerate(writers):  # the ranks resume: 20 more steps each, then finish again
        _meta(run, rank, "running")
        w.write("steps", _steps(rank, 60, 20))
    con = open_run(run, follow_spool=False)
    assert con.path_for() != "answers"  # the store plus pending segments: no answers
    assert {r["steps"] for r in step_breakdown(con)} == {75}
    copy = _spool_only_copy(run, tmp_path)
    assert diagnose(run) == diagnose(copy)
    # An ingest while a rank may still write: new rows, a new generation, the old answers gone, none due.
    ingest(run)
    assert _generation(run) != before and _kept_files(run) == []
    assert open_run(run, follow_spool=False).path_for() != "answers" and keep_answers(run) is None
    assert diagnose(run) == diagnose(copy) and _kept_files(run) == []
    for rank in range(RANKS):
        _meta(run, rank, "finished")
    again = ingest(run)  # nothing new to copy: the same generation, whose answers are due now the run ended
    assert again.rows == 0 and _generation(run) is not None
    con = open_run(run, follow_spool=False)
    assert con.path_for() == "answers" and {r["steps"] for r in step_breakdown(con)} == {75}
    assert diagnose(run) == diagnose(copy) and len(_kept_files(run)) == 1


def test_a_store_that_absorbed_its_node_stores_answers_for_all_their_rows(tmp_path):
    run, _ = _run(tmp_path / "node-a")  # this node's ranks wrote here, on its own disk
    ingest(run)
    head = str(tmp_path / "head" / "run")
    os.makedirs(os.path.join(head, "nodes"))
    shutil.copytree(os.path.join(run, "ranks"), os.path.join(head, "ranks"))
    shutil.copyfile(os.path.join(run, "store.duckdb"), os.path.join(head, "nodes", "node-a.duckdb"))
    ingest(head)
    assert keep_answers(head) is None  # the node store stays beside it: not the store alone
    ingest(head, absorb_node_stores=True)
    assert keep_answers(head) > 0 and not os.path.exists(os.path.join(head, "nodes", "node-a.duckdb"))
    con = open_run(head, follow_spool=False)
    assert con.path_for() == "answers"
    assert diagnose(head) == diagnose(_spool_only_copy(run, tmp_path))


H200_RUNS = os.path.join(os.path.dirname(__file__), "data", "gpu", "h200_corpus_runs.tgz")


def test_real_gpu_runs_read_from_their_store_as_from_their_spool(tmp_path):
    """Three runs recorded on one H200 (kernel windows, samples, collectives): the store's first reader,
    which computes the answers, and a later one, which reads them, give the same verdict, and the spool's."""
    import math
    import tarfile

    with tarfile.open(H200_RUNS) as tar:
        tar.extractall(tmp_path / "spool", filter="data")
    for spool in sorted((tmp_path / "spool" / "runs").iterdir()):
        run = str(tmp_path / "store" / spool.name)
        shutil.copytree(spool, run)
        ingest(run)
        first = diagnose(run)
        assert _kept_files(run) and diagnose(run) == first  # read back: the same values, exactly
        reader = open_run(run, follow_spool=False)
        assert reader.path_for() == "answers"
        from_spool = diagnose(str(spool))
        assert [(f["rule"], f["ranks"]) for f in first["findings"]] == [
            (f["rule"], f["ranks"]) for f in from_spool["findings"]
        ]
        stored, spooled = reader.features(), open_run(str(spool), follow_spool=False).features()
        assert stored.keys() == spooled.keys()
        for rank, values in stored.items():
            for name, value in values.items():
                other = spooled[rank][name]
                same = (
                    math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12)
                    if isinstance(value, float)
                    else value == other
                )
                assert same, (spool.name, rank, name, value, other)
