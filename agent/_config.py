"""Agent configuration: one dataclass, validated on construction, overridable from the environment."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


FRAMEWORKS = ("plain", "lightning", "transformers", "accelerate", "run")
"""Who drives the training loop: plain PyTorch, a framework callback, or ``ranksight run``."""


@dataclass
class GpuOptions:
    """What the agent samples on a GPU rank. Checked at ``init``: a misspelt key is an error there,
    not a signal silently missing hours later."""

    gpu_events: bool = True
    """CUDA events around the step's phases (read later, never waited for)."""
    nvml: bool = True
    """NVML utilization and memory, about once a second, on the agent thread."""
    allocator: bool = True
    """CUDA caching-allocator statistics (fragmentation, retries)."""
    allocator_every_s: float = 2.0
    """Period of the allocator statistics."""
    snapshot_every_s: float = 30.0
    """Period of the allocator snapshot (largest free block; costs ~0.4 ms)."""
    trace_window: bool = True
    """A sampled kernel-level window (torch.profiler over a few steps, reduced off the training thread)."""
    trace_steps: int = 2
    """Steps each window traces."""
    trace_every_steps: int = 300
    """Steps between windows (and ``trace_every_s`` must also have passed)."""
    trace_every_s: float = 60.0
    """Seconds between windows (and ``trace_every_steps`` must also have passed)."""
    trace_budget: Optional[float] = 0.002
    """Share of the run's time the windows may cost: after each, the next waits until its measured cost
    (``trace_window_cost_seconds``) is at most this share of the time since, on top of the two floors. On
    one H200 a window cost the DDP tutorial 0.05-0.07 s and nanoGPT's 191M parameters 0.15-0.31 s (the
    profiler's stop 0.10-0.19 s of it; up to 0.76 s when the next window attaches a detached CUPTI again):
    at 0.002 the latter's windows come every 75-380 s (benchmarks/results/gpu1_window_stop.json). None:
    the floors alone."""
    trace_first_step: int = 50
    """Step of the first window (after compilation and allocator warm-up)."""
    trace_first_s: float = 60.0
    """Seconds after the agent attaches before the first window (and ``trace_first_step`` must also have
    passed): the budget's promise for a short job too. On one H100 a window cost a GPT-2-small Hugging Face
    Trainer job 0.19 s (0.13 s on the training thread, 0.06 s of reduction holding the GIL), 1.1 % of an
    18 s run; no window there read 1.0008 of no agent (benchmarks/results/gpu_callback_cost_h100_20261206c_*).
    A shorter run gets no kernel-level checks (pageable copies, CPU ops, host syncs, the kernel-busy share);
    0: the first window at ``trace_first_step`` whatever the time, as ``ranksight demo`` does."""
    trace_dir: Optional[str] = None
    """A folder to also save each window's Chrome trace in."""
    detach_cupti: bool = True
    """Have Kineto detach CUPTI after each window (``TEARDOWN_CUPTI=1``, CUDA >= 12.6). Left attached, CUPTI's
    callbacks stay on every CUDA call for the rest of the run: on one H200 a host-bound ~3.6 ms step ran
    1.19x slower after the first window, detached 0.92-1.10x (benchmarks/results/gpu_cost_h200_cupti.json).
    The price: a ``torch.profiler`` the user starts later in the same process recorded no GPU kernel there
    (the agent warns when one starts). Off: CUPTI stays attached; a user's own TEARDOWN_CUPTI is always left
    as they set it."""
    events_every_steps: Optional[int] = None
    """Record the step's CUDA events on about one step in this many; None (the default) picks it from the
    measured step time so the events cost at most ``events_budget`` of a step. Which steps are sampled is a
    fixed function of the step index (the same on every rank, irregular so it cannot lock onto a periodic
    eval or log step); the step before each sampled one marks its end too, for the gap. Unsampled steps
    keep their host-clock columns and carry ``gpu_sampled = false``; readers take GPU phase shares from
    the sampled rows only, so a share stays a ratio of sums over the same steps."""
    events_budget: float = 0.001
    """With ``events_every_steps=None``: the share of a step the CUDA events may cost, counting the training
    thread's ``record()`` calls (timed at attach) and the agent thread's reading of them (timed as it goes)."""
    events_full_steps: int = 200
    """Steps from the first that record events every step whatever the sampling: a short job's verdict rests
    on all of its steps, and the step time that sets the sampling is known by then."""
    nccl_timing: bool = True
    """Each NCCL collective's GPU time (``collectives.gpu_s``), from NCCL's own start and end events
    as PyTorch's flight recorder keeps them (``TORCH_NCCL_ENABLE_TIMING`` is switched on)."""
    nccl_timing_every_s: float = 30.0
    """Seconds between two reads of the flight recorder (0: every flush). A read copies its whole ring
    (2,000 entries by default; 13-27 ms on the agent thread of an H200 host); the steps of the flush that
    reads it get ``gpu_s``, the others keep it NULL."""

    def __post_init__(self) -> None:
        if self.events_every_steps is not None and int(self.events_every_steps) < 1:
            raise ValueError(
                f"ranksight: gpu option events_every_steps must be >= 1 or None (auto), got {self.events_every_steps!r}"
            )
        if not 0 < float(self.events_budget) < 1:
            raise ValueError(f"ranksight: gpu option events_budget must be in (0, 1), got {self.events_budget!r}")
        if int(self.events_full_steps) < 0:
            raise ValueError(f"ranksight: gpu option events_full_steps must be >= 0, got {self.events_full_steps!r}")
        if not float(self.nccl_timing_every_s) >= 0:
            raise ValueError(
                f"ranksight: gpu option nccl_timing_every_s must be >= 0, got {self.nccl_timing_every_s!r}"
            )
        for name in ("allocator_every_s", "snapshot_every_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"ranksight: gpu option {name} must be > 0, got {getattr(self, name)!r}")
        if not float(self.trace_every_s) >= 0:
            raise ValueError(f"ranksight: gpu option trace_every_s must be >= 0, got {self.trace_every_s!r}")
        for name in ("trace_steps", "trace_every_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ranksight: gpu option {name} must be >= 1, got {getattr(self, name)!r}")
        if self.trace_budget is not None and not 0 < float(self.trace_budget) < 1:
            raise ValueError(f"ranksight: gpu option trace_budget must be in (0, 1) or None, got {self.trace_budget!r}")
        if not float(self.trace_first_s) >= 0:
            raise ValueError(f"ranksight: gpu option trace_first_s must be >= 0, got {self.trace_first_s!r}")
        if int(self.trace_first_step) < 0:
            raise ValueError(f"ranksight: gpu option trace_first_step must be >= 0, got {self.trace_first_step!r}")

    @classmethod
    def from_value(cls, value: Union[GpuOptions, dict, None]) -> GpuOptions:
        """Accept options as a ``GpuOptions`` or a dict of its fields; unknown keys raise ``ValueError``."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"ranksight: gpu options must be a GpuOptions or a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"ranksight: unknown gpu option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**value)


@dataclass
class Config:
    """What the agent does and where it writes. Every field has a ``RANKSIGHT_*`` environment twin."""

    run_dir: str = "ranksight-runs"
    """Parent folder of runs; each run gets ``<run_dir>/<run_id>/``."""
    job: str = "default"
    """Job name: a label on every record and metric."""
    run_id: Optional[str] = None
    """Run id shared by all ranks; derived from the launcher when None (torchrun, SLURM)."""
    enabled: bool = True
    """False makes every call a no-op: no thread, no files, no hooks."""
    flush_interval_s: float = 2.0
    """How often the agent thread writes spool segments; bounds what a SIGKILL can lose."""
    node_spool_dir: Optional[str] = None
    """A node-local folder (local disk, ``/tmp``, ``/dev/shm``): ranks write their segments there and the
    node publishes them to the run folder merged, one file per kind per interval, so the shared filesystem
    sees a bounded number of files (a metadata server's create rate). None writes to the run folder directly."""
    max_job_files_per_s: float = 150.0
    """With ``node_spool_dir``: the files a second the whole job may create in the run folder; each node's
    publish interval follows from it and the job's node count (``_node_spool.publish_interval_s``)."""
    max_buffered_events: int = 50_000
    """Bound on hot-path events waiting for the agent thread; the oldest are dropped (and counted) past it.
    50,000 step events hold ~21 MB (measured at commit d0882b6) and cover ~5 s of 1 ms steps with 4 buckets
    each: several flush intervals."""
    comm_hook: bool = False
    """On gloo, also wrap DDP's all-reduce in a timing communication hook: per-bucket rows (``buckets``) and
    ``allreduce_s``, for PyTorch's Python all-reduce hook in place of DDP's C++ path and a callback per bucket
    on gloo's communication thread (0.8 ms of training-thread CPU a step; steps 1.08x the default's on a
    2-rank CPU job). Off, the exposed all-reduce is timed once per step, to DDP's wait returning. Never on
    NCCL, whose futures complete at enqueue."""
    time_collectives: bool = True
    """Time every torch.distributed collective and barrier outside DDP's buckets (user, FSDP2, framework)."""
    stack_window: bool = True
    """About once a minute, sample the training thread's Python stack for a second (from a helper thread) to
    name what the time outside every measured phase ("other") is spent on."""
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
    framework: str = "plain"
    """The training framework driving the loop (the integrations set it), so fixes speak its API."""
    gpu: Any = field(default_factory=GpuOptions)
    """GPU sampling options: a :class:`GpuOptions` or a dict of its fields (checked here)."""
    extra: dict = field(default_factory=dict)
    """Older spelling of ``gpu`` (a dict of GPU options); merged into ``gpu`` and checked alike."""

    def __post_init__(self) -> None:
        gpu = self.gpu
        if self.extra:
            base = {f.name: getattr(gpu, f.name) for f in fields(GpuOptions)} if isinstance(gpu, GpuOptions) else {}
            gpu = {**base, **(gpu if isinstance(gpu, dict) else {}), **self.extra}
        self.gpu = GpuOptions.from_value(gpu)
        if self.run_id is not None:
            from ._identity import check_run_id

            check_run_id(self.run_id)
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"ranksight: framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if not isinstance(self.job, str) or not self.job:
            raise ValueError("ranksight: job must be a non-empty string")
        if self.flush_interval_s <= 0:
            raise ValueError(f"ranksight: flush_interval_s must be > 0, got {self.flush_interval_s}")
        if not self.max_job_files_per_s > 0:
            raise ValueError(f"ranksight: max_job_files_per_s must be > 0, got {self.max_job_files_per_s}")
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
        if env.get("RANKSIGHT_NODE_SPOOL"):
            values["node_spool_dir"] = env["RANKSIGHT_NODE_SPOOL"]
        if env.get("RANKSIGHT_MAX_JOB_FILES_PER_S"):
            values["max_job_files_per_s"] = float(env["RANKSIGHT_MAX_JOB_FILES_PER_S"])
        if env.get("RANKSIGHT_PROMETHEUS_PORT", "") != "":
            values["prometheus_port"] = int(env["RANKSIGHT_PROMETHEUS_PORT"])
        if env.get("RANKSIGHT_PROMETHEUS_HOST"):
            values["prometheus_host"] = env["RANKSIGHT_PROMETHEUS_HOST"]
        if env.get("RANKSIGHT_GPU"):  # GPU options as a JSON object, e.g. '{"events_every_steps": 1}'
            try:
                values["gpu"] = json.loads(env["RANKSIGHT_GPU"])
            except ValueError as exc:
                raise ValueError(f"ranksight: RANKSIGHT_GPU must be a JSON object of gpu options ({exc})") from None
        otlp = env.get("RANKSIGHT_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if otlp:
            values["otlp_endpoint"] = otlp
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in overrides if k not in known)
        if unknown:
            raise ValueError(f"ranksight: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        # Explicit arguments win over the environment, except the kill switch, which always wins. GPU
        # options merge key by key: the environment's apply where the call does not name the same key.
        if isinstance(values.get("gpu"), dict) and isinstance(overrides.get("gpu"), dict):
            overrides = {**overrides, "gpu": {**values["gpu"], **overrides["gpu"]}}
        values.update({k: v for k, v in overrides.items() if v is not None})
        if _env_flag("RANKSIGHT_DISABLED"):
            values["enabled"] = False
        return cls(**values)
