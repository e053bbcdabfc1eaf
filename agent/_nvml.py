"""NVML sampler: GPU utilization and device memory of this rank's GPU, read on the agent thread.

NVML counts devices in its own order (PCI bus), which is not CUDA's order and ignores
``CUDA_VISIBLE_DEVICES``; the device is therefore matched by UUID, falling back to the visible-devices
list, then to the CUDA index. Without NVML (no library, no driver, a container without it) the
sampler returns nothing: the signals are absent, not zero, and one warning says why.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional


def _strip_uuid(u: str) -> str:
    u = str(u).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix) :]
    return u


def nvml_index_for(cuda_index: int, cuda_uuid: Optional[str], nvml_uuids: list[str], visible: Optional[str]) -> int:
    """Map a CUDA device index to NVML's index: by UUID, else via CUDA_VISIBLE_DEVICES, else as is."""
    if cuda_uuid:
        want = _strip_uuid(cuda_uuid)
        for i, u in enumerate(nvml_uuids):
            if _strip_uuid(u) == want:
                return i
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if cuda_index < len(entries):
            entry = entries[cuda_index]
            if entry.isdigit():
                return int(entry)
            for i, u in enumerate(nvml_uuids):
                if _strip_uuid(u).startswith(_strip_uuid(entry)):
                    return i
    return cuda_index


class NvmlSampler:
    """Callable for ``Worker.samplers``: one utilization row per ~``period_s`` and one memory row per call."""

    __name__ = "nvml"

    def __init__(self, monitor: Any, cuda_index: int, period_s: float = 1.0, clock: Callable[[], int] = time.time_ns):
        self._m = monitor
        self._cuda_index = cuda_index
        self._period_us = int(period_s * 1e6)
        self._clock = clock
        self._nvml = None
        self._handle = None
        self._failed = False
        self._last_ts_us = 0
        self._use_samples = True

    def _open(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            uuids = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                uuids.append(u.decode() if isinstance(u, bytes) else u)
            cuda_uuid = None
            try:
                import torch

                cuda_uuid = str(torch.cuda.get_device_properties(self._cuda_index).uuid)
            except Exception:
                pass
            index = nvml_index_for(self._cuda_index, cuda_uuid, uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
            self._last_ts_us = self._clock() // 1000  # the driver's buffer also holds samples from before us
            return True
        except Exception as exc:
            self._failed = True
            self._m._warn_once(
                "nvml", f"NVML is not available ({type(exc).__name__}: {exc}); GPU utilization is absent"
            )
            return False

    def __call__(self) -> list[dict]:
        if self._failed or (self._nvml is None and not self._open()):
            return []
        nv, h = self._nvml, self._handle
        now = self._clock()
        step = self._m._step
        rows = self._utilization_rows(nv, h, now, step)
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            rows.append({"time_ns": now, "step": step, "name": "gpu_memory_used_bytes", "value": float(mem.used)})
        except Exception as exc:  # utilization still comes; the memory figure is counted as missing
            self._m._reporter.count("nvml_memory", exc)
        return rows

    def _utilization_rows(self, nv: Any, h: Any, now: int, step: int) -> list[dict]:
        """Read the driver's buffered utilization samples since the last call, averaged per period.

        The flush runs every ~2 s; the driver keeps samples (about 6 a second), so nothing between two
        flushes is missed. Fall back to the instantaneous reading where sample buffers are unsupported.
        """
        if self._use_samples:
            try:
                _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, self._last_ts_us)
                bins: dict[int, list[float]] = {}
                for s in samples:
                    if s.timeStamp <= self._last_ts_us:
                        continue
                    bins.setdefault(s.timeStamp // self._period_us, []).append(float(s.sampleValue.uiVal))
                if samples:
                    self._last_ts_us = max(self._last_ts_us, max(s.timeStamp for s in samples))
                return [
                    {
                        "time_ns": (b + 1) * self._period_us * 1000,
                        "step": step,
                        "name": "gpu_utilization_ratio",
                        "value": sum(v) / len(v) / 100.0,
                    }
                    for b, v in sorted(bins.items())
                ]
            except Exception:
                self._use_samples = False
        try:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            return [{"time_ns": now, "step": step, "name": "gpu_utilization_ratio", "value": util.gpu / 100.0}]
        except Exception:
            return []

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
