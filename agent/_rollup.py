"""Roll a rank's flushed rows up into the exported metrics, once, for every exporter.

The Prometheus endpoint and the OTLP exporter show the same numbers; both read a snapshot of this
state. ``update`` runs on the agent thread after each flush; ``snapshot`` may run on an HTTP server
thread, so the state is copied under a lock (never taken by the training thread).
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

from ranksight.format.phases import PERIOD, PHASE

#: Upper bounds (seconds) of the step-time histogram: ~1 ms CPU toy steps up to minute-long steps.
STEP_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

#: Sample names (``ranksight.format.schema.SAMPLE_NAMES``) exported as gauges, absent until one arrives.
GAUGE_SAMPLES: tuple[str, ...] = (
    "gpu_utilization_ratio",
    "h2d_copy_ratio",
    "memory_fragmentation_ratio",
    "memory_headroom_ratio",
    "memory_inactive_split_bytes",
)


@dataclass(frozen=True)
class MetricDef:
    """One exported series: Prometheus name, type, unit (UCUM, for OTLP) and help text."""

    name: str
    type: str  # counter, gauge or histogram
    unit: str
    help: str


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "ranksight_step_seconds",
        "histogram",
        "s",
        "Time of a training step, data wait included (on a GPU rank the GPU stream's step period).",
    ),
    MetricDef(
        "ranksight_data_wait_ratio",
        "gauge",
        "1",
        "Share of step time blocked on the data loader, on a GPU rank only while the GPU idled (last flush).",
    ),
    MetricDef("ranksight_allreduce_seconds_total", "counter", "s", "Time spent in gradient all-reduce (all buckets)."),
    MetricDef(
        "ranksight_comm_exposed_ratio",
        "gauge",
        "1",
        "Share of step time waiting on all-reduce after compute (on a GPU rank, on the GPU's clock).",
    ),
    MetricDef("ranksight_h2d_copy_ratio", "gauge", "1", "Host-to-device copy time over the sampled window span."),
    MetricDef("ranksight_gpu_utilization_ratio", "gauge", "1", "NVML utilization: share of time a kernel ran."),
    MetricDef("ranksight_memory_fragmentation_ratio", "gauge", "1", "1 - largest free block / total free bytes."),
    # the fragmentation rule's conditions, so that its alert fires where the diagnosis does
    MetricDef("ranksight_memory_headroom_ratio", "gauge", "1", "Free device memory over total device memory."),
    MetricDef("ranksight_memory_inactive_split_bytes", "gauge", "By", "Bytes of split cached blocks no tensor uses."),
    MetricDef("ranksight_graph_breaks_total", "counter", "{break}", "torch.compile graph breaks seen on this rank."),
    MetricDef("ranksight_recompiles_total", "counter", "{recompile}", "torch.compile recompilations on this rank."),
    MetricDef("ranksight_agent_errors_total", "counter", "{error}", "Errors caught inside the ranksight agent."),
    MetricDef("ranksight_records_dropped_total", "counter", "{record}", "Records the agent dropped (buffer full)."),
)

_MAX_KEPT_TIMES = 1_000_000  # bound if no exporter takes them for a long while

LABELS: tuple[str, ...] = ("job", "run", "node", "rank", "local_rank")


@dataclass
class Snapshot:
    """A consistent copy of the metric state: what one scrape or one export shows."""

    step_bucket_counts: list[int]  # per bucket (not cumulative), last one is +Inf
    step_count: int
    step_sum_s: float
    gauges: dict[str, float] = field(default_factory=dict)  # metric name -> value; absent = never seen
    counters: dict[str, float] = field(default_factory=dict)


class Rollup:
    """Cumulative counters, the step histogram and last-window ratios of one rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # agent thread (update) vs exporter threads (snapshot)
        self._bucket_counts = [0] * (len(STEP_BUCKETS_S) + 1)
        self._count = 0
        self._sum = 0.0
        self._gauges: dict[str, float] = {}
        self._counters: dict[str, float] = {
            "ranksight_allreduce_seconds_total": 0.0,
            "ranksight_graph_breaks_total": 0.0,
            "ranksight_recompiles_total": 0.0,
            "ranksight_agent_errors_total": 0.0,
            "ranksight_records_dropped_total": 0.0,
        }
        self._step_times: list[float] = []  # since the last take_step_times(), for OTLP's histogram
        self._keep_step_times = False

    def keep_step_times(self) -> None:
        """Remember individual step times for :meth:`take_step_times` (OTLP records each one)."""
        self._keep_step_times = True

    def update(self, kind: str, rows: list[dict]) -> None:
        """Fold one flush's rows of ``kind`` into the state."""
        if kind == "steps":
            self._update_steps(rows)
        elif kind == "samples":
            latest = {}
            for r in rows:  # rows come in time order: the last one of a name wins
                value = r.get("value")
                if r.get("name") in GAUGE_SAMPLES and _finite(value):
                    latest[f"ranksight_{r['name']}"] = float(value)
            with self._lock:
                self._gauges.update(latest)
        elif kind == "compile":
            breaks = sum(int(r.get("count") or 0) for r in rows if r.get("kind") == "graph_break")
            recompiles = sum(int(r.get("count") or 0) for r in rows if r.get("kind") == "recompile")
            with self._lock:
                self._counters["ranksight_graph_breaks_total"] += breaks
                self._counters["ranksight_recompiles_total"] += recompiles

    def _update_steps(self, rows: list[dict]) -> None:
        counts = [0] * len(self._bucket_counts)
        total = phased = wait = exposed = allreduce = 0.0
        has_wait = has_exposed = False
        times = []
        for r in rows:
            step_s, data_wait, comm = _on_step_clock(r)
            if not _finite(step_s):
                continue
            times.append(step_s)
            counts[bisect.bisect_left(STEP_BUCKETS_S, step_s)] += 1  # le: a value equal to a bound goes in it
            total += step_s
            if r.get("gpu_sampled") is False:
                continue  # a GPU rank's step without events: its step time counts, its host phases do not
            phased += step_s
            if _finite(data_wait):
                wait += data_wait
                has_wait = True
            if _finite(comm):
                exposed += comm
                has_exposed = True
            if _finite(r.get("allreduce_s")):
                allreduce += r["allreduce_s"]
        if not times:
            return
        with self._lock:
            for i, c in enumerate(counts):
                self._bucket_counts[i] += c
            self._count += len(times)
            self._sum += total
            self._counters["ranksight_allreduce_seconds_total"] += allreduce
            if phased > 0:
                # Ratios cover the latest flush window only (its sampled steps on a GPU rank).
                if has_wait:  # no wrapped loader: unknown, so absent rather than zero
                    self._gauges["ranksight_data_wait_ratio"] = wait / phased
                if has_exposed:
                    self._gauges["ranksight_comm_exposed_ratio"] = exposed / phased
            if self._keep_step_times and len(self._step_times) < _MAX_KEPT_TIMES:
                self._step_times.extend(times)

    def set_agent_counters(self, errors_total: int, dropped_total: int) -> None:
        """Refresh the agent's own health counters (read on the agent thread)."""
        with self._lock:
            self._counters["ranksight_agent_errors_total"] = float(errors_total)
            self._counters["ranksight_records_dropped_total"] = float(dropped_total)

    def take_step_times(self) -> list[float]:
        """Return and forget the step times folded in since the last call."""
        with self._lock:
            times, self._step_times = self._step_times, []
        return times

    def snapshot(self) -> Snapshot:
        """Copy the state for one scrape or export."""
        with self._lock:
            return Snapshot(list(self._bucket_counts), self._count, self._sum, dict(self._gauges), dict(self._counters))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_COMM_COLUMNS = ("gpu_comm_exposed_s", "comm_exposed_s", "gpu_comm_blocked_s", "comm_blocked_s")


def _on_step_clock(row: dict) -> tuple:
    """(step period, data wait, exposed comm) of one step row, as the readers compute them
    (``ranksight.format.phases``: ``PERIOD`` and the ``data_wait_s`` and ``comm_exposed_s`` phases).

    A GPU rank's figures come from the GPU stream (CUDA events): the host runs ahead of a GPU-bound
    job, and NCCL completes the host's all-reduce futures at enqueue. A CPU rank's are the host's.
    Exposed comm covers DDP's gradient all-reduce and the time held in every other collective; a
    NULL data wait (input not measured) stays None, and so does the exposed comm of a row that timed none.
    """
    comm = PHASE["comm_exposed_s"].value(row) if any(_finite(row.get(n)) for n in _COMM_COLUMNS) else None
    return PERIOD.value(row), PHASE["data_wait_s"].value(row), comm
