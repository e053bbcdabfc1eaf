"""Caching-allocator sampler: memory stats every flush, a memory snapshot now and then.

``torch.cuda.memory_stats()`` costs ~0.2 ms and ``memory_snapshot()`` more (it walks every block
under the allocator's lock, which the training thread also takes), so both run on the agent thread:
stats at most every ``every_s``, the snapshot at most every ``snapshot_every_s``. The snapshot gives
fragmentation as 1 − largest free block / total free bytes: high when free memory is cut into pieces
too small for the next large tensor (the cause of ``num_alloc_retries`` and of OOMs with memory free).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

# memory_stats() key -> sample name
_STATS = {
    "allocated_bytes.all.current": "memory_allocated_bytes",
    "reserved_bytes.all.current": "memory_reserved_bytes",
    "allocated_bytes.all.peak": "memory_peak_bytes",
    "inactive_split_bytes.all.current": "memory_inactive_split_bytes",
    "num_alloc_retries": "memory_alloc_retries_total",
    "num_ooms": "memory_ooms_total",
    "num_device_alloc": "memory_device_allocs_total",  # cudaMalloc (or a mapping) since start; torch >= 2.1
    "num_device_free": "memory_device_frees_total",
}


def fragmentation_from_snapshot(segments: list[dict], device: Optional[int] = None) -> Optional[dict]:
    """Free-block facts of a ``torch.cuda.memory_snapshot()`` (segments list); None if nothing is free.

    Returns ``{"fragmentation_ratio", "free_blocks", "free_bytes", "largest_free_bytes"}``. A free block
    is one in state ``inactive`` (cached by the allocator, not held by a tensor).
    """
    sizes = [
        int(block["size"])
        for seg in segments
        if device is None or seg.get("device", device) == device
        for block in seg.get("blocks", ())
        if block.get("state") == "inactive"
    ]
    free = sum(sizes)
    if free <= 0:
        return None
    largest = max(sizes)
    return {
        "fragmentation_ratio": 1.0 - largest / free,
        "free_blocks": len(sizes),
        "free_bytes": free,
        "largest_free_bytes": largest,
    }


class AllocatorSampler:
    """Callable for ``Worker.samplers``: allocator stats, fragmentation and headroom of one device."""

    __name__ = "allocator"

    def __init__(
        self,
        monitor: Any,
        device: int,
        every_s: float = 2.0,
        snapshot_every_s: float = 30.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        import torch

        self._torch = torch
        self._m = monitor
        self._device = device
        self._every_ns = int(every_s * 1e9)
        self._snapshot_every_ns = int(snapshot_every_s * 1e9)
        self._clock = clock
        self._last_ns: Optional[int] = None
        self._last_snapshot_ns: Optional[int] = None

    def __call__(self) -> list[dict]:
        now = self._clock()
        if self._last_ns is not None and now - self._last_ns < self._every_ns:
            return []
        self._last_ns = now
        cuda = self._torch.cuda
        t, step = time.time_ns(), self._m._step
        stats = cuda.memory_stats(self._device)
        rows = [
            {"time_ns": t, "step": step, "name": name, "value": float(stats[key])}
            for key, name in _STATS.items()
            if key in stats
        ]
        free, total = cuda.mem_get_info(self._device)
        if total:
            rows.append({"time_ns": t, "step": step, "name": "memory_headroom_ratio", "value": free / total})
        if self._last_snapshot_ns is None or now - self._last_snapshot_ns >= self._snapshot_every_ns:
            self._last_snapshot_ns = now
            frag = fragmentation_from_snapshot(cuda.memory_snapshot(), self._device)
            if frag is not None:
                rows.append(
                    {
                        "time_ns": t,
                        "step": step,
                        "name": "memory_fragmentation_ratio",
                        "value": frag["fragmentation_ratio"],
                    }
                )
                rows.append(
                    {"time_ns": t, "step": step, "name": "memory_free_blocks", "value": float(frag["free_blocks"])}
                )
        return rows
