"""A feature's value as a person reads it: with its unit or percent sign, from the feature's name.

Why from the name: the features follow one naming rule (units in names: ``_s``, ``_bytes``, ``_share``,
``_per_step``), so a rule file names its evidence and the page shows each figure with its unit without a
second table to keep in step; the few names outside the rule are listed here. A bare ``0.6105`` beside
``2.156e+05`` made a reader guess which was a share and which a byte count.
"""

from __future__ import annotations

from typing import Optional

PERCENT_SUFFIXES = ("_share", "_efficiency", "_overlap", "_explained", "_spread", "_ratio")
"""Shares of a whole (0-1), shown as a percentage."""
FLAGS = frozenset(
    {"ddp_backend_gloo", "model_on_gpu", "find_unused_parameters", "loader_pin_memory", "static_graph"}
    | {"fsdp_unshard_async", "compiled", "ddp", "fsdp", "host_cpu_contended", "data_measured"}
)
"""0/1 features: yes or no."""
MULTIPLES = frozenset({"compute_vs_median", "straggler_score", "oversubscription_ratio"})
"""Ratios of like figures that are no share of a whole: ``1.02×``."""
SIGNED_PERCENT = frozenset({"memory_reserved_excess"})
"""A fraction above a median: ``+12.0 %``."""
COUNTS = {
    "graph_breaks": "breaks",
    "recompiles": "recompiles",
    "recompiles_after_warmup": "recompiles",
    "world_size": "ranks",
    "local_world_size": "ranks",
    "ranks_reporting": "ranks",
    "ranks_data_measured": "ranks",
    "cpus_per_rank": "CPU / rank",
    "cpus_allowed": "CPUs",
    "process_cpu_cores": "cores",
    "torch_threads": "threads",
    "threads_demanded": "threads",
    "loader_num_workers": "workers",
    "memory_free_blocks": "blocks",
    "memory_alloc_retries_total": "retries",
    "memory_ooms_total": "OOMs",
    "ddp_stats_iteration": "iterations",
    "steps": "steps",
    "slowest_rank": "(rank)",
    "host_load_ratio": "load / CPU",
}
"""Counts and other plain numbers, with the noun that makes them a figure."""


def _number(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.3g}"


def _duration(seconds: float) -> str:
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.3g} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if a == 0:
        return "0 s"
    return f"{seconds * 1e6:.3g} µs"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,.0f} B"


def unit_kind(name: str) -> Optional[str]:
    """How ``name``'s values read: percent, signed-percent, multiple, flag, time, size, rate, MB, bits,
    per-step, count; None for a name none of these covers."""
    if name in FLAGS:
        return "flag"
    if name in MULTIPLES:
        return "multiple"
    if name in SIGNED_PERCENT:
        return "signed-percent"
    if name in COUNTS:
        return "count"
    if name.endswith("_bytes_per_s"):
        return "rate"
    if name.endswith(("_bytes", "_bytes_per_step", "_bytes_per_call")) or name == "unused_parameter_size":
        return "size"
    if name.endswith("_s"):
        return "time"
    if name.endswith(PERCENT_SUFFIXES):
        return "percent"
    if name.endswith("_mb"):
        return "MB"
    if name.endswith("_bits"):
        return "bits"
    if name.endswith(("_per_step", "_units")) or name == "fsdp_units":
        return "per-step" if name.endswith("_per_step") else "units"
    return None


def figure_text(name: str, value) -> str:
    """``value`` of feature ``name`` with its unit: ``61.1 %``, ``216 kB / step``, ``2.1 ms``, ``1.02×``, ``yes``.
    A missing value is "—" (not measured), never 0."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return str(value)
    kind = unit_kind(name)
    v = float(value)
    if kind == "flag":
        return "yes" if v else "no"
    if kind == "percent":
        return f"{100 * v:.1f} %"
    if kind == "signed-percent":
        return f"{100 * v:+.1f} %"
    if kind == "multiple":
        return f"{v:.2f}×"
    if kind == "time":
        return _duration(v)
    if kind == "size":
        return _size(v) + (" / step" if name.endswith("_per_step") else " / call" if name.endswith("_call") else "")
    if kind == "rate":
        return _size(v) + "/s"
    if kind == "MB":
        return f"{_number(v)} MB"
    if kind == "bits":
        return f"{_number(v)} bits"
    if kind == "per-step":
        return f"{_number(v)} / step"
    if kind == "units":
        return f"{_number(v)} units"
    if kind == "count":
        return f"{_number(v)} {COUNTS[name]}" if name != "slowest_rank" else f"rank {v:.0f}"
    return _number(v)


__all__ = ["figure_text", "unit_kind"]
