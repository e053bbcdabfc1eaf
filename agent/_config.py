"""Agent configuration: one dataclass, validated on construction, overridable from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Config:
    """What the agent does and where it writes. Every field has a ``RANKSIGHT_*`` environment twin."""

    run_dir: str = "ranksight-runs"
    """Parent folder of runs; each run gets ``<run_dir>/<run_id>/``."""
    job: str = "default"
    """Job name: a label on every record and metric."""
    run_id: Optional[str] = None
    """Run id shared by all ranks; derived from the launcher when None (see docs/agent.md)."""
    enabled: bool = True
    """False makes every call a no-op: no thread, no files, no hooks."""
    flush_interval_s: float = 2.0
    """How often the agent thread writes spool segments; bounds what a SIGKILL can lose."""
    max_buffered_events: int = 50_000
    """Bound on hot-path events waiting for the agent thread; the oldest are dropped (and counted) past it.
    50,000 step events hold ~21 MB (benchmarks/agent_memory.py) and cover ~5 s of 1 ms steps with 4 buckets
    each: several flush intervals."""
    comm_hook: bool = True
    """Wrap DDP's all-reduce in a timing communication hook (per-bucket all-reduce time)."""
    compile_poll: bool = True
    """Poll torch._dynamo counters for graph breaks and recompiles (only once dynamo is imported)."""
    ddp_stats_every_steps: int = 200
    """Read DDP's own logging data (unused parameters, bucket sizes) every this many steps."""
    prometheus_port: Optional[int] = None
    """Base port for the Prometheus endpoint (port = base + local_rank); None turns it off, 0 picks free ports."""
    prometheus_host: str = "127.0.0.1"
    """Interface the Prometheus endpoint binds to."""
    otlp_endpoint: Optional[str] = None
    """OTLP/HTTP endpoint for metrics; None turns OTLP off."""
    extra: dict = field(default_factory=dict)
    """Free-form settings for optional parts (GPU sampling periods, ...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job:
            raise ValueError("ranksight: job must be a non-empty string")
        if self.flush_interval_s <= 0:
            raise ValueError(f"ranksight: flush_interval_s must be > 0, got {self.flush_interval_s}")
        if self.max_buffered_events < 1000:
            raise ValueError(f"ranksight: max_buffered_events must be >= 1000, got {self.max_buffered_events}")
        if self.prometheus_port is not None and not 0 <= int(self.prometheus_port) < 65536:
            raise ValueError(f"ranksight: prometheus_port must be in 0..65535, got {self.prometheus_port}")

    @classmethod
    def from_env(cls, **overrides) -> Config:
        """Build a config from keyword arguments, with ``RANKSIGHT_*`` variables filling the rest."""
        env = os.environ
        values: dict = {}
        if "RANKSIGHT_RUN_DIR" in env:
            values["run_dir"] = env["RANKSIGHT_RUN_DIR"]
        if "RANKSIGHT_JOB" in env:
            values["job"] = env["RANKSIGHT_JOB"]
        if env.get("RANKSIGHT_RUN_ID"):
            values["run_id"] = env["RANKSIGHT_RUN_ID"]
        if "RANKSIGHT_FLUSH_INTERVAL_S" in env:
            values["flush_interval_s"] = float(env["RANKSIGHT_FLUSH_INTERVAL_S"])
        if env.get("RANKSIGHT_PROMETHEUS_PORT", "") != "":
            values["prometheus_port"] = int(env["RANKSIGHT_PROMETHEUS_PORT"])
        if env.get("RANKSIGHT_PROMETHEUS_HOST"):
            values["prometheus_host"] = env["RANKSIGHT_PROMETHEUS_HOST"]
        otlp = env.get("RANKSIGHT_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if otlp:
            values["otlp_endpoint"] = otlp
        # Explicit arguments win over the environment, except the kill switch, which always wins.
        values.update({k: v for k, v in overrides.items() if v is not None})
        if _env_flag("RANKSIGHT_DISABLED"):
            values["enabled"] = False
        return cls(**values)
