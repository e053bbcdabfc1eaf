"""Read ranksight's series back from a Prometheus server (HTTP API), for jobs spread over many nodes.

Prometheus is what carries a job across nodes: every rank's endpoint is scraped there, so the
dashboard can show all ranks without a shared filesystem. Only the standard library is used
(``urllib``); label values from the caller are escaped into PromQL string literals, never pasted raw.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

#: Per-rank gauges and counters the agent exports (see docs/prometheus.md).
RANK_SERIES: tuple[str, ...] = (
    "ranksight_data_wait_ratio",
    "ranksight_comm_exposed_ratio",
    "ranksight_h2d_copy_ratio",
    "ranksight_gpu_utilization_ratio",
    "ranksight_memory_fragmentation_ratio",
    "ranksight_memory_headroom_ratio",
    "ranksight_memory_inactive_split_bytes",
    "ranksight_allreduce_seconds_total",
    "ranksight_graph_breaks_total",
    "ranksight_recompiles_total",
    "ranksight_agent_errors_total",
    "ranksight_records_dropped_total",
    "ranksight_step_seconds_count",
    "ranksight_step_seconds_sum",
)


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused the query (one-line message)."""


def promql_string(value: str) -> str:
    """Quote a value as a PromQL string literal."""
    return json.dumps(str(value))  # PromQL strings accept Go/JSON escapes


def selector(metric: str, **labels: Optional[str]) -> str:
    """Build ``metric{k="v", ...}`` from label equalities, skipping labels given as None."""
    inner = ",".join(f"{k}={promql_string(v)}" for k, v in sorted(labels.items()) if v is not None)
    return f"{metric}{{{inner}}}" if inner else metric


class PrometheusReader:
    """A small client of ``/api/v1/query`` and ``/api/v1/query_range``."""

    def __init__(self, base_url: str = "http://127.0.0.1:9090", timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict) -> dict:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            try:
                body = json.load(exc)
                detail = f"{body.get('errorType', 'error')}: {body.get('error', exc.reason)}"
            except Exception:
                detail = str(exc.reason)
            raise PrometheusError(f"{self.base_url}: query refused ({exc.code}) {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"{self.base_url}: cannot reach Prometheus ({reason})") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{self.base_url}: {body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query(self, promql: str, at: Optional[float] = None) -> list[dict]:
        """Evaluate an instant query; one dict per series: its labels plus ``value`` (float)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data.get("resultType") == "scalar":
            return [{"value": float(data["result"][1])}]
        return [{**r["metric"], "value": float(r["value"][1])} for r in data.get("result", [])]

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict]:
        """Evaluate a range query; one dict per series: its labels plus ``values`` [(unix_s, float)]."""
        data = self._get(
            "/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step_s}
        )
        return [{**r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]} for r in data["result"]]

    def runs(self, job: Optional[str] = None) -> list[str]:
        """Run ids Prometheus has ranksight series for (optionally of one job)."""
        rows = self.query(f"count by (run) ({selector('ranksight_step_seconds_count', job=job)})")
        return sorted(r["run"] for r in rows if "run" in r)

    def rank_snapshot(self, run: str, job: Optional[str] = None) -> list[dict]:
        """Latest value of every per-rank series of a run: one dict per rank, ordered by rank.

        Each dict has ``rank``, ``node``, ``local_rank`` and one key per series name (absent series,
        e.g. GPU gauges on a CPU job, are missing rather than zero).
        """
        by_rank: dict[int, dict] = {}
        names = "|".join(RANK_SERIES)
        promql = f'{{__name__=~"{names}",run={promql_string(run)}' + (
            f",job={promql_string(job)}}}" if job is not None else "}"
        )
        for r in self.query(promql):
            try:
                rank = int(r["rank"])
            except (KeyError, ValueError):
                continue
            row = by_rank.setdefault(rank, {"rank": rank, "node": r.get("node"), "local_rank": r.get("local_rank")})
            row[r["__name__"]] = r["value"]
        return [by_rank[k] for k in sorted(by_rank)]
