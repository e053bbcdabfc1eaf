"""How busy this rank's host is: the figures the oversubscription and busy-host checks read.

Sampled on the agent thread at each flush, from the OS alone (no psutil): the process's CPU seconds
per wall second (how many cores this rank keeps busy, its loader threads included), the 1-minute
load average over the CPUs this process may run on, and, where the kernel has pressure stall
information (Linux 4.20+), the share of wall time some task on the host was runnable but waiting for
a CPU. The last is what tells a rank slowed by a busy host from one blocked in its own I/O.
"""

from __future__ import annotations

import os
import time
from typing import Callable


class HostSampler:
    """``Monitor.add_sampler`` entry: ``process_cpu_cores``, ``host_load_ratio`` and
    ``host_cpu_pressure_ratio`` rows."""

    __name__ = "host_sampler"

    def __init__(self, step: Callable[[], int]) -> None:
        self._step = step
        self._last = self._read()
        self._pressure_last = _cpu_pressure_us()
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
        pressure, pressure0 = _cpu_pressure_us(), self._pressure_last
        self._pressure_last = pressure
        if pressure is not None and pressure0 is not None and now - wall0 > 0.05:
            share = min(1.0, max(0.0, (pressure - pressure0) * 1e-6 / (now - wall0)))
            rows.append({"time_ns": stamp, "step": step, "name": "host_cpu_pressure_ratio", "value": share})
        return rows


_PRESSURE_PATH = "/proc/pressure/cpu"


def _cpu_pressure_us() -> int | None:
    """Cumulative µs during which some task on the host waited for a CPU (PSI ``some total``), or None
    where the kernel has no pressure stall information."""
    try:
        with open(_PRESSURE_PATH, "rb") as fh:
            first = fh.readline()
    except OSError:
        return None
    for field in first.split():
        if field.startswith(b"total="):
            try:
                return int(field[6:])
            except ValueError:
                return None
    return None
