"""What the training thread does in the time no measured phase explains ("other"): a short sampled window
of its Python stack.

Every ``every_s`` seconds (the first after ``first_after_s``) a helper thread reads the training thread's
innermost frames ``hz`` times a second for ``window_s`` seconds with ``sys._current_frames()`` — the
training thread itself runs no code for it. Each sample is classed by the monitor's own marks: inside
``mon.data()``, forward/backward, the optimizer, a timed collective, between steps, or none of those
("other"). The places "other" samples land most often become one ``host_other_top`` fact in the rank
file and one event line, so a breakdown with a large "other" share can say what it is
(``get_batch (train.py:42)``, ``item (torch/_tensor.py)``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from typing import Any, Optional

from ._events import EV_INFO

_OWN = os.path.dirname(os.path.abspath(__file__))
_COLLECTIVE_WRAPPERS = {
    ("timed", os.path.join(_OWN, "_collectives.py")),
    ("_timed_wait", os.path.join(_OWN, "_collectives.py")),
}
_LIBRARY_MARKS = (
    os.sep + "site-packages" + os.sep,
    os.sep + "dist-packages" + os.sep,
    os.sep + "lib" + os.sep + "python",
)


def _is_library(filename: str) -> bool:
    return filename.startswith(_OWN) or any(mark in filename for mark in _LIBRARY_MARKS) or filename.startswith("<")


def describe(frame: Any) -> tuple[str, bool]:
    """(where, in_collective): the innermost frame of the user's code (``func (file:line)``), with the
    innermost library frame when that is where the thread is, and whether a timed collective is on the stack."""
    innermost = frame
    user = None
    in_collective = False
    f = frame
    depth = 0
    while f is not None and depth < 64:
        code = f.f_code
        if (code.co_name, os.path.abspath(code.co_filename)) in _COLLECTIVE_WRAPPERS:
            in_collective = True
        if user is None and not _is_library(code.co_filename):
            user = f
        f = f.f_back
        depth += 1

    def label(fr):
        return f"{fr.f_code.co_name} ({os.path.basename(fr.f_code.co_filename)}:{fr.f_lineno})"

    if user is None:
        return label(innermost), in_collective
    if user is innermost:
        return label(user), in_collective
    return f"{label(user)} > {innermost.f_code.co_name}", in_collective


class StackWindow:
    """``Monitor.add_sampler`` entry: starts a sampling window when due, reports the last one's result."""

    __name__ = "stack_window"

    def __init__(self, monitor: Any, every_s: float = 60.0, first_after_s: float = 10.0, window_s: float = 1.0,
                 hz: float = 200.0, top: int = 5) -> None:  # fmt: skip
        self._m = monitor
        self.every_s = every_s
        self.window_s = window_s
        self.hz = hz
        self.top = top
        self._next = time.monotonic() + first_after_s
        self._thread: Optional[threading.Thread] = None
        self._result: Optional[dict] = None

    def __call__(self) -> list[dict]:
        result, self._result = self._result, None
        if result is not None and result["other_samples"]:
            self._m._append((EV_INFO, "host_other_top", result))
            shown = ", ".join(f"{t['where']} {t['share']:.0%}" for t in result["top"])
            self._m._reporter.info("other_time", f"time outside the measured phases: {shown}")
        tid = self._m._train_thread
        if tid and time.monotonic() >= self._next and (self._thread is None or not self._thread.is_alive()):
            self._next = time.monotonic() + self.every_s
            self._thread = threading.Thread(target=self._sample, args=(tid,), name="ranksight-stack", daemon=True)
            self._thread.start()
        return []

    def _phase(self) -> str:
        m = self._m
        if m._data_ctx._begin_ns:
            return "data"
        if not m._in_step:
            return "between steps"
        if m._opt_begin_ns and not m._opt_end_ns:
            return "optimizer"
        if m._fwd_ns and not m._opt_begin_ns:
            return "compute"
        return "other"

    def _sample(self, tid: int) -> None:
        period = 1.0 / self.hz
        end = time.monotonic() + self.window_s
        places: Counter = Counter()
        phases: Counter = Counter()
        try:
            while time.monotonic() < end and self._m._active:
                time.sleep(period)
                frame = sys._current_frames().get(tid)
                if frame is None:
                    break
                phase = self._phase()
                where, in_collective = describe(frame)
                if in_collective:
                    phase = "collective"
                phases[phase] += 1
                if phase == "other":
                    places[where] += 1
                del frame
        except Exception as exc:  # a sampling failure costs this window only
            self._m._reporter.count("stack_window", exc)
            return
        other = phases["other"]
        self._result = {
            "samples": sum(phases.values()),
            "other_samples": other,
            "phases": dict(phases),
            "top": [{"where": w, "share": n / other} for w, n in places.most_common(self.top)] if other else [],
        }
