"""compose/ with Grafana: every PromQL expression of the Grafana dashboard returns data from a real
Prometheus -- loaded with compose/prometheus.yml and its rule file -- scraping a real 2-rank job.

Grafana itself does not run here (it is an image pulled by docker-compose); what it would send is:
each panel's ``expr`` with the dashboard variables filled in, against the same Prometheus config.
GPU panels (NVML utilization, H2D copies, fragmentation) have no series on a CPU job -- absent, not
zero, as docs/prometheus.md says -- so on a CPU machine they must be valid and empty; on a machine with
CUDA the job trains on the GPU and they must return data like every other panel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from ._prom_server import PrometheusServer, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSE = os.path.join(ROOT, "compose")
DASHBOARD_JSON = os.path.join(COMPOSE, "grafana", "dashboards", "ranksight.json")
ALERTS = os.path.join(COMPOSE, "ranksight-alerts.yml")
GPU_METRICS = ("ranksight_gpu_utilization_ratio", "ranksight_h2d_copy_ratio", "ranksight_memory_fragmentation_ratio")
JOB, RUN = "grafana-test", "grafana-e2e"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target in the Grafana dashboard."""
    with open(DASHBOARD_JSON) as f:
        dash = json.load(f)
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def fill_variables(expr: str, job: str, run: str) -> str:
    """What Grafana sends for a panel: its variables replaced (a 1 s scrape, so a 10 s rate window)."""
    for name, value in (("$__rate_interval", "10s"), ("$__interval", "1s"), ("$job", job), ("$run", run)):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not fill: {expr}"
    return expr


def _exported_metric_names() -> set[str]:
    from ranksight.agent._rollup import METRICS

    names = {m.name for m in METRICS}
    return names | {f"{m.name}_{s}" for m in METRICS if m.type == "histogram" for s in ("sum", "count", "bucket")}


# ---------------------------------------------------------------- static checks


def test_dashboard_uses_only_metrics_the_agent_exports_and_the_provisioned_data_source():
    exported = _exported_metric_names()
    with open(os.path.join(COMPOSE, "grafana", "provisioning", "datasources", "prometheus.yml")) as f:
        source = yaml.safe_load(f)["datasources"][0]
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    with open(DASHBOARD_JSON) as f:
        dash = json.load(f)
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]
    used = set()
    for title, expr in dashboard_queries():
        names = set(re.findall(r"\branksight_[a-z0-9_]+\b", expr))
        assert names or "ALERTS" in expr, title
        assert names <= exported, f"{title}: {names - exported} is not a metric the agent exports"
        used |= names
    # The panels the dashboard promises: step time, phase shares, GPU utilization, all-reduce, fragmentation.
    for needed in ("ranksight_step_seconds_sum", "ranksight_data_wait_ratio", "ranksight_comm_exposed_ratio",
                   "ranksight_allreduce_seconds_total", *GPU_METRICS):  # fmt: skip
        assert needed in used, needed
    assert any("ALERTS" in expr and "Ranksight" in expr for _, expr in dashboard_queries())  # findings firing
    with open(os.path.join(COMPOSE, "grafana", "provisioning", "dashboards", "ranksight.yml")) as f:
        provider = yaml.safe_load(f)["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == "/etc/grafana/dashboards/ranksight"


def test_alert_rules_file_is_the_current_export_and_promtool_accepts_config_and_rules():
    fresh = subprocess.run(
        [sys.executable, "-m", "ranksight", "rules", "export", "--prometheus"], capture_output=True, text=True
    )
    assert fresh.returncode == 0, fresh.stderr
    with open(ALERTS) as f:
        assert f.read() == fresh.stdout, "stale: ranksight rules export --prometheus -o compose/ranksight-alerts.yml"
    with open(os.path.join(COMPOSE, "prometheus.yml")) as f:
        assert yaml.safe_load(f)["rule_files"] == ["ranksight-alerts.yml"]
    rules = subprocess.run(["promtool", "check", "rules", ALERTS], capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
    config = subprocess.run(
        ["promtool", "check", "config", os.path.join(COMPOSE, "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
    assert "1 rule files found" in config.stdout


def test_compose_runs_grafana_on_loopback_with_the_provisioning(tmp_path):
    proc = subprocess.run(
        ["docker-compose", "-f", os.path.join(COMPOSE, "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
        env={**os.environ, "RANKSIGHT_RUN_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    grafana = services["grafana"]
    assert grafana["network_mode"] == "host" and grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("/")}
    assert mounts["/etc/grafana/provisioning"] == os.path.join(COMPOSE, "grafana", "provisioning")
    assert mounts["/etc/grafana/dashboards/ranksight"] == os.path.join(COMPOSE, "grafana", "dashboards")
    prom_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if ":" in v}
    assert prom_mounts["/etc/prometheus/ranksight-alerts.yml"] == ALERTS  # next to prometheus.yml, as it names it


# ---------------------------------------------------------------- a real Prometheus, a real job


def input_bound_rank_main(rank: int, run_dir: str, out_dir: str, master_port: int) -> None:
    """One rank of a 2-rank DDP job whose loader sleeps (input-bound: an alert fires), serving /metrics,
    training until the test writes ``release``. On a machine with CUDA it trains on the GPU."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        RANKSIGHT_RUN_ID=RUN,
        RANKSIGHT_PROMETHEUS_PORT="0",
    )
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight
    from ranksight.commands.demo_job import GPU_SAMPLING

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda and torch.cuda.device_count() >= 2 else "gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    mon = ranksight.init(run_dir=run_dir, job=JOB, flush_interval_s=0.5, gpu=dict(GPU_SAMPLING) if cuda else None)
    model = DDP(nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 1)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon.watch(model, optimizer=opt)
    release = os.path.join(out_dir, "release")

    def slow_batches():
        deadline = time.monotonic() + 300
        while True:
            time.sleep(0.03)  # decoding in the main process: most of each step is the wait for the batch
            # Both ranks stop at the same step: one that stopped alone would leave the other in an
            # all-reduce with no partner until gloo's 30-minute timeout.
            stop = torch.tensor([float(os.path.exists(release) or time.monotonic() > deadline)], device=device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                return
            yield torch.randn(64, 16), torch.randn(64, 1)

    for x, y in mon.loader(slow_batches()):
        with mon.step():
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
        assert r.status == 200


@pytest.fixture
def prometheus_with_rules_and_job(tmp_path):
    """compose/prometheus.yml with its rule file (evaluated every second here), then the job."""
    import torch.multiprocessing as mp

    workdir = tmp_path / "prom"
    workdir.mkdir()
    shutil.copy(ALERTS, workdir / "ranksight-alerts.yml")  # where the config's rule_files points
    server = PrometheusServer(str(workdir))
    with open(server.config_path) as f:
        config = yaml.safe_load(f)
    assert config["rule_files"] == ["ranksight-alerts.yml"]
    config["global"]["evaluation_interval"] = "1s"
    with open(server.config_path, "w") as f:
        yaml.safe_dump(config, f)
    _post(f"{server.url}/-/reload")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ctx = mp.start_processes(
        input_bound_rank_main,
        args=(server.runs_dir, str(out_dir), free_port()),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    try:
        yield server
    finally:
        (out_dir / "release").touch()
        try:
            while not ctx.join(60):
                pass
        finally:
            server.stop()


@pytest.mark.slow
def test_every_grafana_query_returns_data_from_a_real_job(prometheus_with_rules_and_job):
    import torch

    from ranksight.collectors import PrometheusReader

    server = prometheus_with_rules_and_job
    reader = PrometheusReader(server.url)
    with urllib.request.urlopen(f"{server.url}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    assert sum(len(g["rules"]) for g in groups) == 10  # every exported rule loaded from rule_files

    on_gpu = torch.cuda.is_available()
    queries = [(title, fill_variables(expr, JOB, RUN)) for title, expr in dashboard_queries()]
    expect_data = [(t, q) for t, q in queries if on_gpu or not any(m in q for m in GPU_METRICS)]
    both_ranks = f'ranksight_step_seconds_count{{job="{JOB}", run="{RUN}"}}'
    deadline, missing = time.monotonic() + 180, expect_data
    while (missing or len(reader.query(both_ranks)) < 2) and time.monotonic() < deadline:
        time.sleep(1)
        missing = [(t, q) for t, q in expect_data if not reader.query(q)]
    assert not missing, f"panels without data after 180 s: {missing}\n{server.log()}"
    mean_step = dict(queries)["Mean step time per rank"]
    while len(reader.query(mean_step)) < 2 and time.monotonic() < deadline + 60:
        time.sleep(1)  # a rank found later needs two scrapes inside the rate window
    firing = dict(queries)["Findings firing (ranksight alert rules)"]

    def input_bound_ranks() -> float:
        return next((r["value"] for r in reader.query(firing) if r["rule"] == "input-bound"), 0)

    while input_bound_ranks() < 2 and time.monotonic() < deadline + 90:
        time.sleep(1)  # the rule holds for a rank once its rate window has the share's samples (1 s evaluations)

    by_title = {t: reader.query(q) for t, q in queries}
    # Per-rank panels have one series per rank, with the agent's labels.
    assert sorted(r["rank"] for r in by_title["Mean step time per rank"]) == ["0", "1"]
    assert all(0 < r["value"] < 10 for r in by_title["Mean step time per rank"])
    assert all(0.1 <= r["value"] <= 1 for r in by_title["Data-loader wait share per rank"])  # input-bound
    # The findings panel shows the exported input-bound rule holding for both ranks (pending: `for: 5m`).
    findings = {(r["rule"], r["severity"]): r for r in by_title["Findings firing (ranksight alert rules)"]}
    assert findings[("input-bound", "warning")]["value"] == 2, findings
    if not on_gpu:  # absent, not zero: a CPU job has no GPU series, and the panels say so
        for title, query in queries:
            if any(m in query for m in GPU_METRICS):
                assert reader.query(query) == [], title
