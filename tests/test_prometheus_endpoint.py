"""The per-rank /metrics endpoint: contract names, labels, promtool, file_sd, and degradation."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ranksight.agent import Config, Identity, Monitor
from ranksight.agent._prometheus import TargetsFile
from ranksight.collectors import open_run

CONTRACT = {
    "ranksight_step_seconds",
    "ranksight_data_wait_ratio",
    "ranksight_allreduce_seconds",  # counters are parsed without the _total suffix
    "ranksight_comm_exposed_ratio",
    "ranksight_h2d_copy_ratio",
    "ranksight_gpu_utilization_ratio",
    "ranksight_memory_fragmentation_ratio",
    "ranksight_memory_headroom_ratio",
    "ranksight_memory_inactive_split_bytes",
    "ranksight_graph_breaks",
    "ranksight_recompiles",
    "ranksight_agent_errors",
    "ranksight_records_dropped",
}
GPU_GAUGES = {
    "ranksight_h2d_copy_ratio",
    "ranksight_gpu_utilization_ratio",
    "ranksight_memory_fragmentation_ratio",
    "ranksight_memory_headroom_ratio",
    "ranksight_memory_inactive_split_bytes",
}


@pytest.fixture
def rank_env(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANKSIGHT_NODE", "nodeA")
    for name in ("RANKSIGHT_PROMETHEUS_PORT", "OTEL_EXPORTER_OTLP_ENDPOINT", "RANKSIGHT_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def _run_steps(mon: Monitor, n: int, sleep_s: float = 0.002) -> None:
    for _ in mon.loader(range(n)):
        with mon.step():
            time.sleep(sleep_s)


def _wait(predicate, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _endpoint(run_dir: str) -> str:
    def find():
        files = glob.glob(os.path.join(run_dir, "prometheus", "*.json"))
        return files and json.load(open(files[0]))[0]["targets"][0]

    return _wait(find)


def _scrape(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as r:
        return r.read().decode()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _spooled_steps(run_path: str) -> int:
    return open_run(run_path).execute("SELECT count(*) FROM steps").fetchone()[0]


def test_scrape_has_every_contract_series_with_identity_labels_only(tmp_path, rank_env):
    # Collective timing off: this job measures no communication at all, so its gauge must be absent (with
    # timing on, a job without collectives reads 0 once torch is imported).
    mon = Monitor(
        Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=0,
               time_collectives=False)
    )  # fmt: skip
    samples = iter([0.25, 0.5, 0.75])

    def fake_gpu_sampler():  # a real agent-thread sampler, as the GPU signals register theirs
        v = next(samples, 0.75)
        names = ("gpu_utilization_ratio", "h2d_copy_ratio", "memory_fragmentation_ratio", "memory_headroom_ratio",
                 "memory_inactive_split_bytes", "kernels_per_step")  # fmt: skip
        return [{"time_ns": time.time_ns(), "step": 0, "name": n, "value": v} for n in names]

    mon.add_sampler(fake_gpu_sampler)
    try:
        _run_steps(mon, 40)
        target = _endpoint(str(tmp_path))
        run_path = os.path.join(str(tmp_path), "r1")
        _wait(lambda: _spooled_steps(run_path) == 40)

        def latest_sample_served():  # the sampler runs on the agent thread's clock: a loaded machine is slower
            text = _scrape(target)
            gauge = _families(text).get("ranksight_gpu_utilization_ratio")
            return text if gauge and gauge.samples[0].value == 0.75 else None

        text = _wait(latest_sample_served)  # the third sample (0.25, 0.5, then 0.75 on): the latest wins
    finally:
        mon.close()

    fams = _families(text)
    # No DDP here, so exposed comm was not measured and is absent (the 2-rank test covers it).
    assert set(fams) == CONTRACT - {"ranksight_comm_exposed_ratio"}
    for fam in fams.values():
        for s in fam.samples:
            labels = set(s.labels) - {"le"}
            assert labels == {"job", "run", "node", "rank", "local_rank"}, (s.name, s.labels)
            assert s.labels["node"] == "nodeA" and s.labels["job"] == "unit" and s.labels["run"] == "r1"
    count = next(s.value for s in fams["ranksight_step_seconds"].samples if s.name.endswith("_count"))
    assert count == 40
    spooled_sum = open_run(run_path).execute("SELECT sum(step_s) FROM steps").fetchone()[0]
    step_sum = next(s.value for s in fams["ranksight_step_seconds"].samples if s.name.endswith("_sum"))
    assert step_sum == pytest.approx(spooled_sum, rel=1e-9)
    buckets = [s for s in fams["ranksight_step_seconds"].samples if s.name.endswith("_bucket")]
    assert [float(b.labels["le"]) for b in buckets][:2] == [0.001, 0.0025] and buckets[-1].labels["le"] == "+Inf"
    assert buckets[-1].value == 40
    assert [s.value for s in fams["ranksight_gpu_utilization_ratio"].samples] == [0.75]  # one series, the latest
    wait_ratio = fams["ranksight_data_wait_ratio"].samples[0].value
    assert 0 <= wait_ratio < 0.5  # range() yields instantly: the step body dominates


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian package prometheus)")
def test_promtool_check_metrics_reports_nothing(tmp_path, rank_env):
    mon = Monitor(Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=0))
    mon.add_sampler(lambda: [{"time_ns": time.time_ns(), "step": 0, "name": "gpu_utilization_ratio", "value": 0.5}])
    try:
        _run_steps(mon, 20)
        target = _endpoint(str(tmp_path))
        text = _wait(lambda: (t := _scrape(target)) and "ranksight_gpu_utilization_ratio{" in t and t)
    finally:
        mon.close()
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", (proc.stdout, proc.stderr)


def test_gpu_gauges_are_absent_on_a_cpu_job(tmp_path, rank_env):
    mon = Monitor(
        Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=0,
               time_collectives=False)
    )  # fmt: skip
    try:
        _run_steps(mon, 10)
        target = _endpoint(str(tmp_path))
        fams = _wait(lambda: (f := _families(_scrape(target))) and "ranksight_data_wait_ratio" in f and f)
    finally:
        mon.close()
    assert not GPU_GAUGES & set(fams)
    assert "ranksight_comm_exposed_ratio" not in fams  # no communication measured, so nothing is shown
    assert fams["ranksight_agent_errors"].samples[0].value == 0


def test_port_is_base_plus_local_rank_and_is_withdrawn_at_close(tmp_path, rank_env, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mon = Monitor(
        Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=port - 1)
    )
    try:
        _run_steps(mon, 3)
        assert _endpoint(str(tmp_path)) == f"127.0.0.1:{port}"
        assert "ranksight_step_seconds_count" in _scrape(f"127.0.0.1:{port}")
    finally:
        mon.close()
    # The endpoint is gone, so is its target; the rank's entry file under the run is removed too.
    assert glob.glob(os.path.join(str(tmp_path), "prometheus", "*.json")) == []
    with pytest.raises(OSError):
        _scrape(f"127.0.0.1:{port}")


def test_port_in_use_warns_once_and_training_goes_on(tmp_path, rank_env, caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="ranksight"):
            mon = Monitor(
                Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=port)
            )
            try:
                _run_steps(mon, 15)
            finally:
                mon.close()
    warnings = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(warnings) == 1 and str(port) in warnings[0], warnings
    con = open_run(os.path.join(str(tmp_path), "r1"))
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 15
    events = con.execute("SELECT level, component FROM events").fetchall()
    assert ("warning", "prometheus") in events
    assert mon.errors == {}  # a degradation, not an agent error


def test_local_ranks_of_one_node_share_one_file_sd_file(tmp_path):
    def ident(rank: int) -> Identity:
        return Identity(job="j", run="r", node="n1", rank=rank, local_rank=rank, world_size=2, pid=100 + rank)

    a = TargetsFile(str(tmp_path), ident(0), "127.0.0.1", 9100)
    b = TargetsFile(str(tmp_path), ident(1), "127.0.0.1", 9101)
    a.publish()
    b.publish()
    a.publish()  # a rank rebuilds the node file when another rank changed the set
    with open(a.node_file) as f:
        groups = json.load(f)
    assert [g["targets"] for g in groups] == [["127.0.0.1:9100"], ["127.0.0.1:9101"]]
    assert groups[1]["labels"] == {"job": "j", "run": "r", "node": "n1", "rank": "1", "local_rank": "1"}
    a.withdraw()
    with open(b.node_file) as f:
        assert [g["targets"] for g in json.load(f)] == [["127.0.0.1:9101"]]
    b.withdraw()
    assert not os.path.exists(a.node_file)


def test_a_failing_sampler_is_counted_in_agent_errors(tmp_path, rank_env):
    mon = Monitor(Config(run_dir=str(tmp_path), job="unit", run_id="r1", flush_interval_s=0.2, prometheus_port=0))

    def broken_sampler():
        raise RuntimeError("NVML went away")

    mon.add_sampler(broken_sampler)
    try:
        _run_steps(mon, 5)
        target = _endpoint(str(tmp_path))
        fams = _wait(lambda: (f := _families(_scrape(target))) and f["ranksight_agent_errors"].samples[0].value and f)
    finally:
        mon.close()
    assert fams["ranksight_agent_errors"].samples[0].value == 1
