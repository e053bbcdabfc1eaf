"""One bad file in a run never costs the other rows or a traceback: every reader (summary, diagnose,
ingest, open_run) leaves it out with one warning line naming it, and ingest moves it to quarantine."""

from __future__ import annotations

import json
import os

import duckdb
import pytest

from ranksight.collectors import SkippedFile, ingest, list_runs, open_run, prune, read_rank_meta, segment_files

from ._damage import (
    DAMAGES,
    STEPS,
    WARMUP,
    cli,
    corrupt_pages,
    first_segment,
    lines_naming,
    write_run,
    zero_bytes,
)


@pytest.fixture
def one_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANKSIGHT_DISABLED", raising=False)


def _count(con, kind: str) -> int:
    return con.execute(f"SELECT count(*) FROM {kind}").fetchone()[0]


def _steps(con) -> int:
    return _count(con, "steps")


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_open_run_leaves_a_damaged_segment_out_and_names_it(tmp_path, one_rank, damage):
    run = write_run(str(tmp_path))
    bad = DAMAGES[damage](run)
    con = open_run(run)
    assert _steps(con) == STEPS  # every real row, none of the bad file's
    assert con.execute("SELECT count(*) FROM steps WHERE rank IS NULL OR step IS NULL").fetchone()[0] == 0
    skipped = con.skipped
    assert [s.path for s in skipped] == [bad] and skipped[0].reason
    assert bad not in segment_files(run, "steps")  # the dashboard's rollup reads this list


@pytest.mark.parametrize("damage", ["zero bytes", "truncated", "other columns"])
def test_the_cli_reads_around_a_damaged_segment_with_one_warning(tmp_path, one_rank, damage):
    run = write_run(str(tmp_path))
    bad = DAMAGES[damage](run)
    kept = STEPS - WARMUP

    summary = cli("summary", run)
    assert summary.returncode == 0, summary.stderr
    assert "Traceback" not in summary.stderr and len(lines_naming(summary.stderr, bad)) == 1
    assert f"{kept} steps after {WARMUP} warm-up" in summary.stdout

    diagnose = cli("diagnose", run, "--json")
    assert diagnose.returncode == 0, diagnose.stderr
    assert "Traceback" not in diagnose.stderr and len(lines_naming(diagnose.stderr, bad)) == 1
    assert [r["steps"] for r in json.loads(diagnose.stdout)["breakdown"]["ranks"]] == [kept]

    ingested = cli("ingest", run)
    assert ingested.returncode == 0, ingested.stderr
    assert "Traceback" not in ingested.stderr and len(lines_naming(ingested.stderr, bad)) == 1
    assert "quarantine" in lines_naming(ingested.stderr, bad)[0]
    assert not os.path.exists(bad) and os.path.exists(os.path.join(run, "quarantine", "steps", os.path.basename(bad)))
    with duckdb.connect(os.path.join(run, "store.duckdb"), read_only=True) as store:
        assert store.execute("SELECT count(*), count(rank) FROM steps").fetchone() == (STEPS, STEPS)

    again = cli("summary", run)  # moved aside: nothing left to warn about
    assert again.returncode == 0 and lines_naming(again.stderr, bad) == []


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_ingest_never_stores_a_row_without_its_identity_and_keeps_the_file(tmp_path, one_rank, damage):
    run = write_run(str(tmp_path))
    bad = DAMAGES[damage](run)
    with open(bad, "rb") as f:
        content = f.read()
    result = ingest(run)
    moved = os.path.join(run, "quarantine", "steps", os.path.basename(bad))
    assert result.quarantined == (SkippedFile(bad, result.quarantined[0].reason, moved),)
    assert result.rows_by_kind["steps"] == STEPS
    with open(moved, "rb") as f:
        assert f.read() == content  # moved, never rewritten or deleted
    identity = "job, run, node, rank, local_rank, world_size, pid"
    nulls = " OR ".join(f"{c.strip()} IS NULL" for c in identity.split(","))
    con = open_run(run)
    assert _steps(con) == STEPS and con.execute(f"SELECT count(*) FROM steps WHERE {nulls}").fetchone()[0] == 0
    assert con.skipped == []
    assert ingest(run).quarantined == ()  # nothing left to move


def test_ingest_quarantines_a_segment_whose_pages_do_not_decode(tmp_path, one_rank):
    """The footer reads, so readers cannot tell without reading every page; ingest does read them."""
    run = write_run(str(tmp_path))
    bad = corrupt_pages(run)
    result = ingest(run)
    assert [(q.path, "does not decode" in q.reason) for q in result.quarantined] == [(bad, True)]
    assert result.rows_by_kind["steps"] == STEPS
    assert _steps(open_run(run)) == STEPS


def test_a_segment_replaced_under_the_same_name_is_judged_again(tmp_path, one_rank):
    """Verdicts are cached by (name, size, mtime): a file that changed is read again, not remembered."""
    run = write_run(str(tmp_path))
    bad = zero_bytes(run)
    assert [s.path for s in open_run(run).skipped] == [bad]
    other = write_run(str(tmp_path), "other", steps=7)
    with open(os.path.join(other, "steps", os.listdir(os.path.join(other, "steps"))[0]), "rb") as f:
        whole = f.read()
    with open(bad, "wb") as f:
        f.write(whole)
    con = open_run(run)
    assert con.skipped == [] and _steps(con) > STEPS


def test_a_segment_damaged_after_it_was_ingested_costs_nothing(tmp_path, one_rank):
    """Its rows are in the store: readers leave the file unread, and a live run still reads new segments."""
    run = write_run(str(tmp_path))
    ingest(run)
    _set_heartbeat(run, "running", 0.0)  # live: the views keep the spool
    with open(first_segment(run), "r+b") as f:
        f.truncate(10)
    con = open_run(run)
    assert _steps(con) == STEPS and con.skipped == []
    assert ingest(run).quarantined == ()  # the store holds it: nothing to move


def test_a_store_without_a_kind_table_reads_that_kind_from_the_spool(tmp_path, one_rank):
    """A store from an older version may lack a newer record kind's table: that kind reads from the spool,
    and the next ingest adds the table and its rows."""
    run = write_run(str(tmp_path))
    ingest(run)
    samples = _count(open_run(run), "samples")
    with duckdb.connect(os.path.join(run, "store.duckdb")) as store:
        store.execute("DROP TABLE collectives")
        store.execute("DROP TABLE samples")
    con = open_run(run)
    assert (_steps(con), _count(con, "samples"), _count(con, "collectives")) == (STEPS, samples, 0)
    assert ingest(run).rows_by_kind == {"samples": samples}
    assert prune(run, 0).files > 0
    assert _count(open_run(run), "samples") == samples


# --- rank files --------------------------------------------------------------------------------------

RANK_FILE_DAMAGES = {
    "not json": b'{"rank": 0, "stat',
    "not an object": b"[0, 1]",
    "not utf-8": b'{"rank": 0, "status": "running\xff"}',
    "flush interval a string": {"flush_interval_s": "x", "status": "running"},
    "start a string": {"started_ns": "yesterday", "status": "running"},
    "heartbeat infinite": {"heartbeat_ns": float("inf"), "status": "running"},
    "steps a list": {"steps": [1, 2]},
    "counter a string": {"counters": {"agent_errors_total": "many"}},
    "counter beyond a float": {"counters": {"agent_errors_total": 10**400}},
    "steps beyond a float": {"steps": 10**400},
}


def _damage_rank_file(run: str, damage) -> str:
    path = os.path.join(run, "ranks", "rank-00000.json")
    if isinstance(damage, bytes):
        with open(path, "wb") as f:
            f.write(damage)
        return path
    with open(path) as f:
        data = json.load(f)
    data.update(damage)
    with open(path, "w") as f:
        f.write(json.dumps(data).replace("Infinity", "1e400"))  # what a non-Python writer would emit
    return path


def _second_rank(run: str) -> None:
    """A healthy rank 1 beside the damaged rank 0: it must still read as it was written."""
    meta = {"rank": 1, "status": "finished", "heartbeat_ns": 1, "steps": 3, "job": "reliability"}
    with open(os.path.join(run, "ranks", "rank-00001.json"), "w") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("damage", list(RANK_FILE_DAMAGES))
def test_a_damaged_rank_file_reads_as_status_unknown(tmp_path, one_rank, damage):
    run = write_run(str(tmp_path))
    path = _damage_rank_file(run, RANK_FILE_DAMAGES[damage])
    _second_rank(run)
    metas = {m.rank: m for m in read_rank_meta(run)}
    assert metas[0].status == "unknown" and metas[0].problem and metas[0].path == path
    assert (metas[1].status, metas[1].steps, metas[1].problem) == ("finished", 3, None)
    (listed,) = list_runs(str(tmp_path))
    assert listed["ranks"] == 2 and listed["rank_statuses"]["unknown"] == 1
    assert isinstance(listed["duration_s"], float) and isinstance(listed["world_size"], int)
    assert _steps(open_run(run)) == STEPS  # the spool does not depend on the rank file


@pytest.mark.parametrize("damage", ["not json", "flush interval a string", "start a string", "heartbeat infinite"])
def test_ranksight_runs_lists_a_run_with_a_damaged_rank_file(tmp_path, one_rank, damage):
    run = write_run(str(tmp_path))
    path = _damage_rank_file(run, RANK_FILE_DAMAGES[damage])
    out = cli("runs", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and len(lines_naming(out.stderr, path)) == 1
    assert "run" in out.stdout.split()  # the run is listed
    summary = cli("summary", run)
    assert summary.returncode == 0 and "unknown" in summary.stdout, summary.stderr


def _set_heartbeat(run: str, status: str, age_s: float) -> None:
    path = os.path.join(run, "ranks", "rank-00000.json")
    with open(path) as f:
        data = json.load(f)
    import time

    data.update(status=status, heartbeat_ns=time.time_ns() - int(age_s * 1e9), flush_interval_s=2.0)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize(
    "written, age_s, shown, run_status",
    [
        ("running", 1.0, "running", "live"),
        ("running", 61.0, "lost", "stopped"),  # 30 flushes of 2 s without a heartbeat
        ("crashed", 1.0, "crashed", "stopped"),  # final: not live, however fresh its heartbeat
        ("terminated", 1.0, "terminated", "stopped"),
        ("finished", 61.0, "finished", "finished"),
    ],
)
def test_rank_status_lost_and_the_final_statuses(tmp_path, one_rank, written, age_s, shown, run_status):
    run = write_run(str(tmp_path))
    _set_heartbeat(run, written, age_s)
    assert [m.status for m in read_rank_meta(run)] == [shown]
    (listed,) = list_runs(str(tmp_path))
    assert listed["status"] == run_status and listed["rank_statuses"] == {shown: 1}


def test_a_compacted_run_whose_ranks_all_ended_reads_the_store_alone(tmp_path, one_rank):
    """crashed and terminated are final like finished: no segment can come, the spool is not scanned."""
    run = write_run(str(tmp_path))
    ingest(run)
    _set_heartbeat(run, "crashed", 0.0)
    con = open_run(run)
    sql = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'steps'").fetchone()[0]
    assert "read_parquet" not in sql and _steps(con) == STEPS


# --- a store.duckdb that is not ours ----------------------------------------------------------------


def _foreign_duckdb(path: str) -> None:
    with duckdb.connect(path) as con:
        con.execute("CREATE TABLE notes AS SELECT 'mine' AS text")


def _not_duckdb(path: str) -> None:
    with open(path, "w") as f:
        f.write("not a database\n")


@pytest.mark.parametrize("plant", [_foreign_duckdb, _not_duckdb], ids=["duckdb without _segments", "not duckdb"])
def test_a_store_that_is_not_ours_is_a_one_line_error_and_stays_untouched(tmp_path, one_rank, plant):
    run = write_run(str(tmp_path))
    store = os.path.join(run, "store.duckdb")
    plant(store)
    with open(store, "rb") as f:
        before = f.read()
    for args in (("summary", run), ("diagnose", run, "--json"), ("ingest", run), ("ingest", run, "--prune")):
        out = cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1 and "store.duckdb" in out.stderr
    with open(store, "rb") as f:
        assert f.read() == before  # never rebuilt over: it may hold rows whose segments were pruned
    with pytest.raises(ValueError, match="store.duckdb"):
        prune(run, 0)
    assert len(os.listdir(os.path.join(run, "steps"))) > 0  # prune deleted nothing


# --- run folders DuckDB reads as something else --------------------------------------------------------


@pytest.mark.parametrize("folder", ["back\\slash", "query?mark", "bracket[1]", "star*"])
def test_run_folders_with_path_and_glob_characters_read_ingest_and_prune(tmp_path, one_rank, folder):
    """DuckDB reads '\\' as a separator and '?' as the start of URL parameters, and globs '[' and '*':
    every reader and the store go through paths it cannot misread."""
    write_run(str(tmp_path), "plain")
    run = str(tmp_path / folder)
    os.rename(tmp_path / "plain", run)
    assert _steps(open_run(run)) == STEPS
    assert ingest(run).rows_by_kind["steps"] == STEPS
    assert _steps(open_run(run)) == STEPS
    assert prune(run, 0).files > 0
    con = open_run(run)
    assert _steps(con) == STEPS and not os.listdir(os.path.join(run, "steps"))
    assert ingest(run).segments == 0  # the store was renamed into place, not beside it
    assert [r["run"] for r in list_runs(str(tmp_path))] == [folder]
    summary = cli("summary", run)
    assert summary.returncode == 0 and f"{STEPS - WARMUP} steps" in summary.stdout, summary.stderr
