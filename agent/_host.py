"""How busy this rank's host is: the figures the oversubscription and busy-host checks read.

Sampled on the agent thread at each flush, from the OS alone (no psutil): the process's CPU seconds
per wall second (how many cores this rank keeps busy, its loader threads included) and the 1-minute
load average over the CPUs this process may run on.
"""

from __future__ import annotations

import os
import time
from typing import Callable


class HostSampler:
    """``Monitor.add_sampler`` entry: ``process_cpu_cores`` and ``host_load_ratio`` rows."""

    __name__ = "host_sampler"

    def __init__(self, step: Callable[[], int]) -> None:
        self._step = step
        self._last = self._read()
        try:
            self._cpus = max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            self._cpus = max(1, os.cpu_count() or 1)

    @staticmethod
    def _read() -> tuple[float, float]:
        t = os.times()
        return time.monotonic(), t.user + t.system

    def __call__(self) -> list[dict]:
        now, cpu = self._read()
        wall0, cpu0 = self._last
        self._last = (now, cpu)
        rows = []
        stamp, step = time.time_ns(), self._step()
        if now - wall0 > 0.05:
            rows.append(
                {"time_ns": stamp, "step": step, "name": "process_cpu_cores", "value": (cpu - cpu0) / (now - wall0)}
            )
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on this platform: the ratio stays absent
            return rows
        rows.append({"time_ns": stamp, "step": step, "name": "host_load_ratio", "value": load / self._cpus})
        return rows
