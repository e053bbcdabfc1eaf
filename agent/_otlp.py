"""Send one rank's metrics over OTLP/HTTP (the OpenTelemetry SDK), when the user points at a collector.

Same series as the Prometheus endpoint, same names (so PromQL and dashboards work unchanged behind a
collector's Prometheus exporter), with units in UCUM (``s``, ``1``). The rank's identity goes in the
resource attributes (``job``, ``run``, ``node``, ``rank``, ``local_rank``), as OpenTelemetry intends.
The SDK's periodic reader exports on its own daemon thread and swallows export errors, so a collector
that is down costs nothing but a log line; ``close`` exports once more against a deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._rollup import METRICS, STEP_BUCKETS_S, Rollup

if TYPE_CHECKING:
    from ._identity import Identity

METRICS_PATH = "/v1/metrics"


def metrics_url(endpoint: str) -> str:
    """Turn an OTLP base endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` style) into the metrics URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(METRICS_PATH) else endpoint + METRICS_PATH


class OtlpSink:
    """A MeterProvider whose instruments read the shared rollup; exports every ``interval_s``."""

    def __init__(self, rollup: Rollup, identity: Identity, endpoint: str, interval_s: float) -> None:
        # ImportError here (no [otlp] extra) is turned into one warning by make_sinks.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource

        self.rollup = rollup
        rollup.keep_step_times()
        labels = identity.labels()
        resource = Resource.create(
            {
                "service.name": "ranksight",
                "service.instance.id": f"{identity.node}/{identity.rank}",
                **{k: labels[k] for k in ("job", "run", "node", "rank", "local_rank", "world_size")},
            }
        )
        self.url = metrics_url(endpoint)
        exporter = OTLPMetricExporter(endpoint=self.url, timeout=5)
        self._reader = PeriodicExportingMetricReader(exporter, export_interval_millis=max(interval_s, 0.2) * 1000)
        step_view = View(
            instrument_name="ranksight_step_seconds",
            aggregation=ExplicitBucketHistogramAggregation(boundaries=STEP_BUCKETS_S),
        )
        # A private provider, never the global one: the user's own OpenTelemetry setup stays theirs.
        self._provider = MeterProvider(metric_readers=[self._reader], resource=resource, views=[step_view])
        meter = self._provider.get_meter("ranksight")

        def gauge_callback(name: str):
            def callback(_options):
                value = rollup.snapshot().gauges.get(name)
                return [] if value is None else [Observation(value)]  # absent until observed

            return callback

        def counter_callback(name: str):
            def callback(_options):
                return [Observation(rollup.snapshot().counters.get(name, 0.0))]

            return callback

        self._histogram = None
        for m in METRICS:
            if m.type == "histogram":
                self._histogram = meter.create_histogram(m.name, unit=m.unit, description=m.help)
            elif m.type == "counter":
                meter.create_observable_counter(m.name, [counter_callback(m.name)], unit=m.unit, description=m.help)
            else:
                meter.create_observable_gauge(m.name, [gauge_callback(m.name)], unit=m.unit, description=m.help)

    def write(self, kind: str, rows: list[dict]) -> None:
        """Record the step times folded into the rollup since the last flush."""
        if kind == "steps" and self._histogram is not None:
            for value in self.rollup.take_step_times():
                self._histogram.record(value)

    def close(self) -> None:
        """Export what is left and stop the exporter thread (bounded by the SDK's timeouts)."""
        self._provider.shutdown(timeout_millis=10_000)
