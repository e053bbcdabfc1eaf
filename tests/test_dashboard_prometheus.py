"""The dashboard's Prometheus source (``ranksight dashboard --prometheus URL``) against a real server.

A real Prometheus on loopback scrapes a real 2-rank gloo job on two simulated nodes (the helpers of
the Prometheus tests); the dashboard's Prometheus page lists the run and one row per rank.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from ranksight.collectors import PrometheusReader
from ranksight.dashboard import APP_PATH

from ._prom_server import PrometheusServer, free_port, held_rank_main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary (Debian package)"),
]


def _app(monkeypatch, root: str, prometheus: str):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RANKSIGHT_DASHBOARD_PATH", root)
    monkeypatch.setenv("RANKSIGHT_DASHBOARD_PROMETHEUS", prometheus)
    at = AppTest.from_file(APP_PATH, default_timeout=60).run()
    return at.switch_page("_pages/prometheus.py").run()


def test_prometheus_page_shows_every_rank_of_a_scraped_job(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    server = PrometheusServer(str(tmp_path / "prom"))
    out_dir = str(tmp_path / "out")
    os.makedirs(out_dir)
    ctx = mp.start_processes(
        held_rank_main,
        args=(server.runs_dir, "dash-prom", out_dir, 20, free_port()),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    try:
        reader = PrometheusReader(server.url)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            snapshot = reader.rank_snapshot("dash-prom")
            trained = all(os.path.exists(os.path.join(out_dir, f"trained-{r}")) for r in (0, 1))
            # a scrape that came before the ranks' first flush holds their series at 0: wait for one after
            if trained and len(snapshot) == 2 and all(r.get("ranksight_step_seconds_count", 0) > 0 for r in snapshot):
                break
            time.sleep(0.5)
        at = _app(monkeypatch, server.runs_dir, server.url)
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert "dash-prom" in [t.value for t in at.text]
        table = at.dataframe[0].value
        assert sorted(table["rank"].tolist()) == [0, 1]
        assert sorted(table["node"].tolist()) == ["node0", "node1"]
        assert (table["ranksight_step_seconds_count"] > 0).all()
    finally:
        open(os.path.join(out_dir, "release"), "w").close()
        try:
            while not ctx.join(60):
                pass
        finally:
            server.stop()


def test_unreachable_prometheus_is_one_line(tmp_path, monkeypatch):
    at = _app(monkeypatch, str(tmp_path), f"http://127.0.0.1:{free_port()}")
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "cannot reach Prometheus" in errors[0] and "\n" not in errors[0]
