"""A real Prometheus server scrapes a real 2-rank gloo job on two simulated nodes, found through file_sd."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from ranksight.collectors import PrometheusError, PrometheusReader, open_run

from ._prom_server import PrometheusServer, free_port, held_rank_main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary (Debian package)"),
]

STEPS = 30


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


@pytest.fixture
def scraped_job(tmp_path):
    """Prometheus up first, then a 2-rank job whose endpoints stay up until the test releases them."""
    import torch.multiprocessing as mp

    server = PrometheusServer(str(tmp_path / "prom"))
    out_dir = str(tmp_path / "out")
    os.makedirs(out_dir)
    run_id = "prom-e2e"
    ctx = mp.start_processes(
        held_rank_main,
        args=(server.runs_dir, run_id, out_dir, STEPS, free_port()),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    try:
        yield server, os.path.join(server.runs_dir, run_id), out_dir
    finally:
        open(os.path.join(out_dir, "release"), "w").close()
        try:
            while not ctx.join(60):
                pass
        finally:
            server.stop()


def _spool_counts(run_path: str) -> dict:
    con = open_run(run_path)
    rows = con.execute(
        "SELECT rank, any_value(node), count(*), sum(step_s), sum(coalesce(allreduce_s, 0)) FROM steps GROUP BY rank"
    ).fetchall()
    return {r[0]: {"node": r[1], "steps": r[2], "step_sum_s": r[3], "allreduce_s": r[4]} for r in rows}


def test_prometheus_scrapes_every_rank_and_matches_the_spool(scraped_job):
    server, run_path, out_dir = scraped_job
    _wait(lambda: all(os.path.exists(os.path.join(out_dir, f"trained-{r}")) for r in (0, 1)), 120, "training")

    # One file_sd file per node (and run) in the run root's prometheus/ folder, listing that node's rank.
    sd_dir = os.path.join(server.runs_dir, "prometheus")
    sd_files = _wait(lambda: sorted(f for f in os.listdir(sd_dir) if f.endswith(".json")), 10, "file_sd files")
    assert sd_files == ["prom-e2e_node0.json", "prom-e2e_node1.json"]
    for rank, name in enumerate(sd_files):
        with open(os.path.join(sd_dir, name)) as f:
            groups = json.load(f)
        assert len(groups) == 1 and groups[0]["labels"]["node"] == f"node{rank}"
        assert groups[0]["labels"]["rank"] == str(rank) and groups[0]["targets"][0].startswith("127.0.0.1:")

    spool = _wait(
        lambda: (c := _spool_counts(run_path)) and all(c.get(r, {}).get("steps") == STEPS for r in (0, 1)) and c,
        20,
        "every step in the spool",
    )

    reader = PrometheusReader(server.url)

    def scraped_all():
        rows = reader.query('ranksight_step_seconds_count{job="promtest",run="prom-e2e"}')
        return rows if len(rows) == 2 and all(r["value"] == STEPS for r in rows) else None

    rows = _wait(scraped_all, 60, f"Prometheus to scrape {STEPS} steps of both ranks:\n{server.log()}")
    assert {(r["rank"], r["node"], r["local_rank"]) for r in rows} == {("0", "node0", "0"), ("1", "node1", "0")}
    # The agent's labels win over the target's (honor_labels): no exported_job, the job is ours.
    assert all("exported_job" not in r and r["job"] == "promtest" for r in rows)
    targets = [t for t in server.targets() if t["labels"].get("run") == "prom-e2e"]
    assert len(targets) == 2 and all(t["health"] == "up" for t in targets), targets

    # PromQL per rank equals what the same rank spooled.
    step_sum = {r["rank"]: r["value"] for r in reader.query('ranksight_step_seconds_sum{run="prom-e2e"}')}
    allreduce = {r["rank"]: r["value"] for r in reader.query('ranksight_allreduce_seconds_total{run="prom-e2e"}')}
    for rank in (0, 1):
        assert step_sum[str(rank)] == pytest.approx(spool[rank]["step_sum_s"], rel=1e-9)
        assert allreduce[str(rank)] == pytest.approx(spool[rank]["allreduce_s"], rel=1e-9)
        assert allreduce[str(rank)] > 0  # gloo all-reduce was timed on both ranks

    # A histogram query works across nodes: both ranks' median step time is a positive, finite number.
    medians = reader.query('histogram_quantile(0.5, sum by (rank, le) (ranksight_step_seconds_bucket{run="prom-e2e"}))')
    assert len(medians) == 2 and all(0 < r["value"] < 60 for r in medians)

    # The collectors reader gives one row per rank; CPU-only gauges are absent, not zero.
    snap = reader.rank_snapshot("prom-e2e", job="promtest")
    assert [s["rank"] for s in snap] == [0, 1] and [s["node"] for s in snap] == ["node0", "node1"]
    for s in snap:
        assert s["ranksight_step_seconds_count"] == STEPS
        assert 0 <= s["ranksight_data_wait_ratio"] <= 1
        assert 0 <= s["ranksight_comm_exposed_ratio"] <= 1
        assert "ranksight_gpu_utilization_ratio" not in s
        assert s["ranksight_agent_errors_total"] == 0
    assert reader.runs(job="promtest") == ["prom-e2e"]
    assert reader.rank_snapshot('prom-e2e"} or up{x="') == []  # label values are escaped, not pasted

    # Errors are one line, never a traceback from urllib.
    with pytest.raises(PrometheusError, match="bad_data"):
        reader.query("ranksight_step_seconds_count{")
    with pytest.raises(PrometheusError, match="cannot reach Prometheus"):
        PrometheusReader(f"http://127.0.0.1:{free_port()}", timeout_s=2).query("up")
