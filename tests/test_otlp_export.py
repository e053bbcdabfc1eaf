"""OTLP/HTTP export, checked by a receiver that decodes requests with the official opentelemetry-proto messages."""

from __future__ import annotations

import gzip
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("opentelemetry.sdk", reason="OTLP export needs the [otlp] extra")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ranksight.agent import Config, Monitor  # noqa: E402
from ranksight.agent._rollup import STEP_BUCKETS_S  # noqa: E402
from ranksight.collectors import open_run  # noqa: E402


class OtlpReceiver:
    """A minimal OTLP/HTTP metrics endpoint on 127.0.0.1 that keeps every decoded request."""

    def __init__(self) -> None:
        self.requests: list = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                receiver.paths.append(self.path)
                receiver.requests.append(req)
                out = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def metrics(self) -> list[tuple[dict, object]]:
        """Every (resource attributes, metric) pair received, in arrival order."""
        out = []
        for req in self.requests:
            for rm in req.resource_metrics:
                attrs = {a.key: _any_value(a.value) for a in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        out.append((attrs, metric))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _any_value(v):
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture
def rank_env(monkeypatch):
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "RANKSIGHT_NODE": "nodeB"}.items():
        monkeypatch.setenv(name, value)
    for name in ("RANKSIGHT_PROMETHEUS_PORT", "OTEL_EXPORTER_OTLP_ENDPOINT", "RANKSIGHT_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def _steps(mon: Monitor, n: int) -> None:
    for _ in mon.loader(range(n)):
        with mon.step():
            time.sleep(0.002)


def test_metrics_arrive_with_names_units_and_rank_attributes(tmp_path, receiver, rank_env):
    mon = Monitor(
        Config(
            run_dir=str(tmp_path),
            job="otlp",
            run_id="r1",
            flush_interval_s=0.2,
            otlp_endpoint=receiver.url,
            time_collectives=False,
        )  # nothing measures communication: its gauge stays absent
    )
    mon.add_sampler(lambda: [{"time_ns": time.time_ns(), "step": 0, "name": "gpu_utilization_ratio", "value": 0.625}])
    _steps(mon, 30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(receiver.requests) < 2:
        time.sleep(0.1)
    assert len(receiver.requests) >= 2  # exported periodically while training, not only at close
    mon.close()

    assert set(receiver.paths) == {"/v1/metrics"}
    received = receiver.metrics()
    attrs = received[-1][0]
    assert {k: attrs[k] for k in ("job", "run", "node", "rank", "local_rank")} == {
        "job": "otlp",
        "run": "r1",
        "node": "nodeB",
        "rank": 3,
        "local_rank": 1,
    }
    assert attrs["service.name"] == "ranksight"
    last = {m.name: m for _, m in received}  # the latest export of each metric (cumulative)
    units = {name: m.unit for name, m in last.items()}
    assert units == {
        "ranksight_step_seconds": "s",
        "ranksight_data_wait_ratio": "1",
        "ranksight_allreduce_seconds_total": "s",
        "ranksight_gpu_utilization_ratio": "1",
        "ranksight_graph_breaks_total": "{break}",
        "ranksight_recompiles_total": "{recompile}",
        "ranksight_agent_errors_total": "{error}",
        "ranksight_records_dropped_total": "{record}",
    }  # comm-exposed, h2d and fragmentation were never measured here: absent, not zero

    hist = last["ranksight_step_seconds"].histogram.data_points[0]
    spooled = open_run(os.path.join(str(tmp_path), "r1")).execute("SELECT count(*), sum(step_s) FROM steps").fetchone()
    assert hist.count == spooled[0] == 30
    assert hist.sum == pytest.approx(spooled[1], rel=1e-9)
    assert list(hist.explicit_bounds) == list(STEP_BUCKETS_S)
    assert sum(hist.bucket_counts) == 30
    assert last["ranksight_gpu_utilization_ratio"].gauge.data_points[0].as_double == 0.625
    errors = last["ranksight_agent_errors_total"].sum
    assert errors.is_monotonic and errors.data_points[0].as_double == 0


def test_endpoint_from_the_standard_environment_variable(tmp_path, receiver, rank_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url + "/")
    mon = Monitor(Config.from_env(run_dir=str(tmp_path), job="otlp", run_id="r2", flush_interval_s=0.2))
    _steps(mon, 5)
    mon.close()
    assert receiver.paths and set(receiver.paths) == {"/v1/metrics"}
    assert any(m.name == "ranksight_step_seconds" for _, m in receiver.metrics())


def test_collector_down_costs_the_job_nothing(tmp_path, rank_env):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed right after: nothing listens there
    mon = Monitor(Config(run_dir=str(tmp_path), job="otlp", run_id="r3", flush_interval_s=0.2, otlp_endpoint=dead))
    _steps(mon, 20)
    t0 = time.monotonic()
    mon.close()
    assert time.monotonic() - t0 < 30  # close is bounded by the exporter's deadline
    assert open_run(os.path.join(str(tmp_path), "r3")).execute("SELECT count(*) FROM steps").fetchone()[0] == 20
    assert mon.errors == {}


def test_missing_otel_packages_warn_once(tmp_path, rank_env, monkeypatch, caplog):
    # What an install without the [otlp] extra looks like to the import system.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.metric_exporter", None)
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        mon = Monitor(
            Config(run_dir=str(tmp_path), job="otlp", run_id="r4", flush_interval_s=0.2, otlp_endpoint="http://x")
        )
        _steps(mon, 10)
        mon.close()
    warnings = [r.getMessage() for r in caplog.records if "OTLP" in r.getMessage()]
    assert len(warnings) == 1 and "ranksight[otlp]" in warnings[0]
    assert open_run(os.path.join(str(tmp_path), "r4")).execute("SELECT count(*) FROM steps").fetchone()[0] == 10
