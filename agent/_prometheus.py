"""Serve one rank's metrics on ``http://HOST:BASE+local_rank/metrics`` and advertise it to Prometheus.

prometheus-client directly rather than the OpenTelemetry SDK's Prometheus reader: its custom
collector renders the shared :class:`Rollup` snapshot as-is (a gauge with no sample yet is simply not
emitted), it has no ``_created`` or ``target_info`` series to explain, and it is already a core
dependency. The registry is private, so nothing of the user's process leaks in and tests stay isolated.

The endpoint is advertised in a Prometheus ``file_sd`` file per node and run,
``<run_dir>/prometheus/<run>_<node>.json`` -- one flat folder for all runs, because Prometheus globs
only the last path element, so ``ranksight-runs/prometheus/*.json`` finds every rank of every run.
It is built from one small entry file per rank (``<run_dir>/<run>/prometheus/<node>/rank-NNNNN.json``,
which also records the port chosen) so ranks of one node never overwrite each other's targets; any
rank rebuilds the node file when it differs, and the last rank to close removes it.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from typing import TYPE_CHECKING

from ranksight.format.files import atomic_write_bytes

from ._rollup import LABELS, METRICS, STEP_BUCKETS_S, Rollup

if TYPE_CHECKING:
    from ._identity import Identity

TARGETS_DIR = "prometheus"


def _le(bound: float) -> str:
    return repr(float(bound))


class RollupCollector:
    """A prometheus-client collector that renders a :class:`Rollup` snapshot with the rank's labels."""

    def __init__(self, rollup: Rollup, identity: Identity) -> None:
        self._rollup = rollup
        labels = identity.labels()
        self._names = list(LABELS)
        self._values = [str(labels[k]) for k in LABELS]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snap = self._rollup.snapshot()
        for m in METRICS:
            if m.type == "histogram":
                fam = HistogramMetricFamily(m.name, m.help, labels=self._names, unit="")
                cumulative, buckets = 0, []
                for bound, count in zip((*STEP_BUCKETS_S, float("inf")), snap.step_bucket_counts):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else _le(bound), cumulative))
                fam.add_metric(self._values, buckets, snap.step_sum_s)
                yield fam
            elif m.type == "counter":
                fam = CounterMetricFamily(m.name, m.help, labels=self._names)
                fam.add_metric(self._values, snap.counters.get(m.name, 0.0))
                yield fam
            elif m.name in snap.gauges:  # a gauge never observed is absent, not zero
                fam = GaugeMetricFamily(m.name, m.help, labels=self._names)
                fam.add_metric(self._values, snap.gauges[m.name])
                yield fam


class PrometheusSink:
    """The rank's ``/metrics`` endpoint, fed by the agent thread after each flush."""

    def __init__(self, rollup: Rollup, identity: Identity, host: str, port: int, run_dir: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.rollup = rollup
        self.identity = identity
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RollupCollector(rollup, identity))
        # Raises OSError when the port is taken; make_sinks turns that into one warning.
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._targets = TargetsFile(run_dir, identity, host, self.port)
        try:
            self._targets.publish()
        except OSError:
            pass  # read-only run directory: the endpoint still serves; the spool warns about the folder

    @property
    def url(self) -> str:
        """Where the endpoint answers."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def write(self, kind: str, rows: list[dict]) -> None:
        """Fold rows into the metrics (the rollup is shared; the first sink to see rows updates it)."""
        # make_sinks registers one RollupFeeder ahead of the exporters, so nothing to do per kind here;
        # only keep the node's targets file right (another local rank may have rewritten it).
        if kind == "steps":
            self._targets.publish()

    def close(self) -> None:
        """Stop serving and withdraw this rank from the node's targets file."""
        try:
            self._targets.withdraw()
        finally:
            self._server.shutdown()
            self._server.server_close()


class TargetsFile:
    """This rank's entry in the node's Prometheus ``file_sd`` targets file."""

    def __init__(self, run_dir: str, identity: Identity, host: str, port: int) -> None:
        node = _safe(identity.node)
        self.node_file = os.path.join(run_dir, TARGETS_DIR, f"{_safe(identity.run)}_{node}.json")
        self.entry_dir = os.path.join(run_dir, identity.run, TARGETS_DIR, node)
        self.entry_file = os.path.join(self.entry_dir, f"rank-{identity.rank:05d}.json")
        # Bound to every interface: advertise the hostname, so a Prometheus on another node can reach it.
        scrape_host = socket.gethostname() if host in ("0.0.0.0", "", "::") else host
        if ":" in scrape_host:
            scrape_host = f"[{scrape_host}]"  # an IPv6 literal
        labels = {k: str(v) for k, v in identity.labels().items() if k in LABELS}
        self.entry = {"targets": [f"{scrape_host}:{port}"], "labels": labels}
        self._last_written: bytes | None = None

    def publish(self) -> None:
        """Write this rank's entry, then rebuild the node file if its content is out of date."""
        os.makedirs(self.entry_dir, exist_ok=True)
        os.makedirs(os.path.dirname(self.node_file), exist_ok=True)
        data = json.dumps(self.entry, sort_keys=True).encode()
        if not os.path.exists(self.entry_file):
            atomic_write_bytes(self.entry_file, data)
        self._rebuild()

    def withdraw(self) -> None:
        """Remove this rank's entry (its endpoint is gone) and rebuild the node file."""
        try:
            os.remove(self.entry_file)
        except FileNotFoundError:
            pass
        self._last_written = None
        self._rebuild()

    def _rebuild(self) -> None:
        groups = []
        for path in sorted(glob.glob(os.path.join(self.entry_dir, "rank-*.json"))):
            try:
                with open(path) as f:
                    groups.append(json.load(f))
            except (OSError, ValueError):
                continue  # mid-rename or removed: the next flush rebuilds again
        if not groups:  # every rank of this node closed: no targets left to advertise
            try:
                os.remove(self.node_file)
            except FileNotFoundError:
                pass
            return
        data = json.dumps(groups, indent=1, sort_keys=True).encode()
        if data == self._last_written:
            try:
                with open(self.node_file, "rb") as f:
                    if f.read() == data:
                        return
            except OSError:
                pass
        atomic_write_bytes(self.node_file, data)
        self._last_written = data


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name) or "node"
