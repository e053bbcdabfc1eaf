"""compose/: the docker-compose file is valid and wires Prometheus, Grafana, the dashboard and the collector."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSE = os.path.join(ROOT, "compose")

pytestmark = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="needs docker-compose (Debian package, no engine required)"
)


def _config(tmp_path, env: dict | None = None) -> dict:
    proc = subprocess.run(
        ["docker-compose", "-f", os.path.join(COMPOSE, "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def test_compose_file_validates_and_mounts_the_tested_prometheus_config(tmp_path):
    runs = tmp_path / "my-runs"
    runs.mkdir()
    cfg = _config(tmp_path, {"RANKSIGHT_RUN_DIR": str(runs)})
    services = cfg["services"]
    assert set(services) == {"prometheus", "grafana", "dashboard", "otel-collector"}
    prom = services["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"] if ":" in v}
    # The very file the real-Prometheus test loads, and the run root where its file_sd glob points.
    assert mounts["/etc/prometheus/prometheus.yml"] == os.path.join(COMPOSE, "prometheus.yml")
    assert mounts["/etc/prometheus/ranksight-runs"] == str(runs)
    assert "--web.listen-address=127.0.0.1:9090" in prom["command"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    # Everything on loopback of the host, where the agents bind.
    assert all(s.get("network_mode") == "host" for s in services.values())
    assert "--host 127.0.0.1" in " ".join(services["dashboard"]["command"])
    collector_mounts = services["otel-collector"]["volumes"]
    assert any(v.startswith(os.path.join(COMPOSE, "otel-collector.yaml") + ":") for v in collector_mounts)


def test_prometheus_config_discovers_runs_through_file_sd():
    with open(os.path.join(COMPOSE, "prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "ranksight")
    assert job["honor_labels"] is True  # the agent's job/run/node/rank labels win
    files = job["file_sd_configs"][0]["files"]
    assert files == ["ranksight-runs/prometheus/*.json"]  # relative to the config file; glob in the last element only


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
def test_promtool_accepts_the_prometheus_config(tmp_path):
    shutil.copy(os.path.join(COMPOSE, "prometheus.yml"), tmp_path / "prometheus.yml")
    shutil.copy(os.path.join(COMPOSE, "ranksight-alerts.yml"), tmp_path / "ranksight-alerts.yml")  # its rule_files
    proc = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_collector_config_receives_otlp_http_and_exports_to_prometheus():
    with open(os.path.join(COMPOSE, "otel-collector.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "127.0.0.1:4318"
    pipeline = cfg["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and "prometheus" in pipeline["exporters"]
    assert cfg["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"] is True
    with open(os.path.join(COMPOSE, "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    scraped = [t for j in prom["scrape_configs"] for sc in j.get("static_configs", []) for t in sc["targets"]]
    assert cfg["exporters"]["prometheus"]["endpoint"] in scraped
