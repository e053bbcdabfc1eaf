"""Build the optional exporters of a rank (Prometheus endpoint, OTLP) next to the spool.

Each sink has ``write(kind, rows)`` and ``close()``; the agent thread calls them after every flush,
in list order. The first sink folds the rows into one shared :class:`Rollup` that the exporters read,
so Prometheus and OTLP always agree. A sink that cannot start (port in use, package missing) is
skipped with one warning; training is never affected.
"""

from __future__ import annotations

from typing import Callable

from ._config import Config
from ._identity import Identity
from ._report import Reporter
from ._rollup import Rollup


class RollupFeeder:
    """Folds each flush's rows (and the agent's health counters) into the shared rollup."""

    def __init__(self, rollup: Rollup, reporter: Reporter, dropped: Callable[[], int]) -> None:
        self.rollup = rollup
        self._reporter = reporter
        self._dropped = dropped

    def write(self, kind: str, rows: list[dict]) -> None:
        """Update the rollup with one kind's rows."""
        self.rollup.update(kind, rows)
        self.rollup.set_agent_counters(self._reporter.errors_total, self._dropped() or 0)

    def close(self) -> None:
        """Nothing to release."""


def make_sinks(cfg: Config, identity: Identity, reporter: Reporter, dropped: Callable[[], int]) -> list:
    """Return the sinks configured for this rank (none by default: the spool is always on)."""
    if cfg.prometheus_port is None and not cfg.otlp_endpoint:
        return []
    rollup = Rollup()
    sinks: list = []
    if cfg.prometheus_port is not None:
        base = int(cfg.prometheus_port)
        port = 0 if base == 0 else base + identity.local_rank
        try:
            from ._prometheus import PrometheusSink

            sinks.append(PrometheusSink(rollup, identity, cfg.prometheus_host, port, cfg.run_dir))
        except OSError as exc:
            reporter.warn_once(
                "prometheus",
                f"cannot serve Prometheus metrics on {cfg.prometheus_host}:{port} ({exc}); "
                "the endpoint is off for this rank, training goes on",
            )
        except ImportError as exc:
            reporter.warn_once("prometheus", f"prometheus-client is not installed ({exc}); the endpoint is off")
    if cfg.otlp_endpoint:
        try:
            from ._otlp import OtlpSink

            sinks.append(OtlpSink(rollup, identity, cfg.otlp_endpoint, cfg.flush_interval_s))
        except ImportError as exc:
            reporter.warn_once(
                "otlp",
                f"OTLP export needs `pip install ranksight[otlp]` ({exc.name or exc}); metrics are not sent over OTLP",
            )
        except Exception as exc:  # bad URL and such: degrade, never fail the job
            reporter.warn_once("otlp", f"cannot start the OTLP exporter for {cfg.otlp_endpoint!r} ({exc}); OTLP is off")
    if not sinks:
        return []
    return [RollupFeeder(rollup, reporter, dropped), *sinks]
