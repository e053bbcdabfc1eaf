"""The agent thread's side of the GPU step phases: ``GpuResolver`` turns the CUDA events ``GpuMarks`` recorded on
the training thread into a step row's GPU columns once the GPU has reached them, and ``TraceSampler`` reduces the
profiler windows the marks handed over.

Why apart from the marks: the marks run on the hot path and may do nothing but ``Event.record()`` and a
``deque.append``; everything here runs on the agent thread, reads events with ``query()`` and
``elapsed_time()`` (never ``synchronize()``), holds rows the GPU has not reached and puts the events back in
the marks' pool. The phases each column holds are listed in ``_gpu_hooks``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional, Protocol

from ._event_sampling import choose_every

_MAX_HELD_ROWS = 10_000  # bound on step rows waiting for the GPU; past it the oldest go out as they are


class EventPool(Protocol):
    """What the resolver needs of the marks (``_gpu_hooks.GpuMarks``), which import it: their events back, and
    the sampling period to set. Optional: ``events_on`` (False: no events at all) and ``elapsed`` (the C++
    ``elapsed_time``)."""

    record_cost_s: float
    """The training thread's time to record one event, measured at start-up."""

    def release(self, events) -> None: ...

    def set_every(self, every: int) -> None: ...


def _elapsed_time(a: Any, b: Any) -> float:
    return a.elapsed_time(b)


class GpuResolver:
    """``Worker.gpu_resolver``: fill the GPU columns of finished step rows from completed events.

    A GPU-bound job's host runs ahead of the GPU (seconds, with few long kernels per step), so a step
    row can be ready on the host long before the GPU has reached its end event. Such rows are held,
    in order, until that event completes — checked with ``query()`` at each flush, never waited for —
    or ``max_hold_s`` has passed; then they go out with whatever could be measured.
    """

    def __init__(self, marks: EventPool, max_hold_s: float = 60.0) -> None:
        self._marks = marks
        # The C++ method when the marks give it (one Python frame less per call, 6 calls per row).
        self._elapsed = getattr(marks, "elapsed", None) or _elapsed_time
        self.max_hold_s = max_hold_s
        self._held: deque = deque()  # (monotonic time first seen, step row), in step order
        self._pending: dict[int, dict[str, Any]] = {}
        self.windows: list = []  # finished profiler windows, for the trace sampler
        self.resolved_total = 0
        self.dropped_total = 0
        self._prev_end: Optional[tuple[int, Any]] = None  # (step, end event) kept for the next step's gap
        self.budget: Optional[float] = None  # GpuOptions.events_budget under automatic sampling, else None
        self._read_s: Optional[float] = None  # this thread's time to read one sampled step (running mean)

    def __call__(self, gpu_marks: list, step_rows: list[dict], final: bool) -> list[dict]:
        """Take this flush's marks and step rows; return the rows to write now, GPU columns filled."""
        pending = self._pending
        for _, step, payload in gpu_marks:
            if payload[0] == "w":
                self.windows.append(payload)
                continue
            if payload[0] in ("c", "k"):  # pairs: a collective's hold on the stream, an in-step data fetch
                pending.setdefault(step, {}).setdefault(payload[0], []).append(payload[1:])
                continue
            slot = pending.setdefault(step, {})
            old = slot.get(payload[0])
            if old is not None:  # e.g. several "last" buckets: keep the latest mark
                self._marks.release([old])
            slot[payload[0]] = payload[1]
        now = time.monotonic()
        self._held.extend((now, row) for row in step_rows)
        ready: list[dict] = []
        self._ready = ready  # for salvage() if anything below fails
        events_on = getattr(self._marks, "events_on", True)
        t0 = time.perf_counter()
        sampled = events = 0
        while self._held:
            since, row = self._held[0]
            marks = pending.get(row["step"])
            end = marks.get("e") if marks else None
            waiting = not final and now - since < self.max_hold_s and len(self._held) <= _MAX_HELD_ROWS
            if end is not None and waiting and not end.query():
                break  # the GPU has not got there yet; later steps are behind it on the stream
            self._held.popleft()
            pending.pop(row["step"], None)
            on = marks is not None and marks.get("b") is not None
            if events_on:  # NULL where events are off: then the host's phases are the rank's only ones
                row["gpu_sampled"] = on
            if marks:
                if on:
                    sampled += 1
                    events += sum(2 * len(v) if k in ("c", "k") else 1 for k, v in marks.items())
                self._fill(row, marks, queried=end is not None and waiting)
                self._keep_end(row["step"], marks)
                self._release(marks)
            ready.append(row)
        if sampled:
            self._retune(ready, sampled, events, time.perf_counter() - t0)
        # Marks whose step row was already written (or will never be) are dropped, not kept forever.
        newest = max((r["step"] for r in ready), default=None)
        if final or newest is not None:
            for step in [s for s in pending if final or s <= newest]:
                self._release(pending.pop(step))
        if final and self._prev_end is not None:
            self._marks.release([self._prev_end[1]])
            self._prev_end = None
        return ready

    def _retune(self, rows: list[dict], sampled: int, events: int, spent_s: float) -> None:
        """With automatic sampling, set how many steps apart events are recorded from what they cost: the
        training thread's ``record()`` per event times the events of a sampled step, plus this thread's
        reading of one sampled step, against ``budget`` of the median host step of this flush."""
        if self.budget is None:
            return
        read_s = spent_s / sampled
        self._read_s = read_s if self._read_s is None else 0.8 * self._read_s + 0.2 * read_s
        steps = sorted(r["step_s"] for r in rows if r.get("step_s"))
        if not steps:
            return
        cost = self._marks.record_cost_s * events / sampled + self._read_s
        self._marks.set_every(choose_every(steps[len(steps) // 2], cost, self.budget))

    def _release(self, marks: dict) -> None:
        pairs = [*marks.pop("c", ()), *marks.pop("k", ())]
        self._marks.release([ev for pair in pairs for ev in pair])
        self._marks.release(marks.values())

    def salvage(self, step_rows: list[dict]) -> list[dict]:
        """After a failure: every row this flush brought or the resolver held, in step order, once."""
        rows = {id(r): r for r in [*getattr(self, "_ready", []), *(r for _, r in self._held), *step_rows]}
        self._held.clear()
        return sorted(rows.values(), key=lambda r: r["step"])

    def _keep_end(self, step: int, marks: dict) -> None:
        """Hold this step's end event back from the pool: the next step's gap is measured from it."""
        end = marks.pop("e", None)
        if end is None:
            return
        if self._prev_end is not None:
            self._marks.release([self._prev_end[1]])
        self._prev_end = (step, end)

    def _fill(self, row: dict, marks: dict, queried: bool = False) -> None:
        """Phases from the step's events, each read once as an offset from the step's begin.

        The step's own marks (b, f, r, o, e) are recorded on one stream in that order, so once ``e`` is
        complete they all are: only ``e`` is queried, and not twice (``queried``: the hold loop just
        did). ``d`` (NCCL: an autograd callback's mark) is on the step's stream too; ``q`` (gloo: the
        last bucket's future callback) may sit on another stream and is queried. Fewer CUDA calls per row
        matter: they run on the agent thread while the training thread launches kernels, and each holds
        the GIL (``query`` and ``elapsed_time`` do not release it).
        """
        b, e = marks.get("b"), marks.get("e")
        if b is None and e is not None:
            return  # an unsampled step's end, kept only for the next step's gap
        if b is None or e is None or not (queried or e.query()):
            self.dropped_total += 1
            return
        el = self._elapsed

        def at(ev):  # ms from the step's begin
            return el(b, ev)

        end_ms = at(e)
        row["gpu_step_s"] = end_ms * 1e-3
        prev = self._prev_end
        if prev is not None and prev[0] == row["step"] - 1:  # recorded before b on the same stream
            row["gpu_gap_s"] = max(0.0, el(prev[1], b) * 1e-3)
        f, r, d, o, q = marks.get("f"), marks.get("r"), marks.get("d"), marks.get("o"), marks.get("q")
        r_ms = at(r) if r is not None else None
        o_ms = at(o) if o is not None else None
        compute_end_ms = r_ms if r_ms is not None else o_ms if o_ms is not None else end_ms
        f_ms = at(f) if f is not None else None
        if f_ms is not None:
            row["h2d_s"] = f_ms * 1e-3
            row["gpu_compute_s"] = max(0.0, compute_end_ms - f_ms) * 1e-3
        # "q": the last bucket's all-reduce done (gloo's per-bucket hook, on a stream that waits for it);
        # "d", on NCCL: backward's end after DDP made the step's stream wait for every bucket.
        done_ms = at(d) if d is not None else at(q) if q is not None and q.query() else None
        if r_ms is not None and done_ms is not None:
            # Capped at the step's end: a collective still running then belongs to no phase of this step.
            row["gpu_comm_exposed_s"] = max(0.0, min(done_ms, end_ms) - r_ms) * 1e-3
        pairs = marks.get("c")
        if pairs:  # recorded on the step's stream before e (the marks check the stream)
            row["gpu_comm_blocked_s"] = sum(max(0.0, el(a, z)) for a, z in pairs) * 1e-3
        if o_ms is not None:
            row["gpu_optimizer_s"] = max(0.0, end_ms - o_ms) * 1e-3
        fetches = marks.get("k")
        if fetches:
            self._take_out_data_idle(row, fetches, at, f_ms, compute_end_ms, o_ms)
        self.resolved_total += 1

    def _take_out_data_idle(
        self,
        row: dict,
        fetches: list,
        at: Callable[[Any], float],
        f_ms: Optional[float],
        compute_end_ms: float,
        o_ms: Optional[float],
    ) -> None:
        """Move the stream's time inside in-step data fetches out of the GPU phase each fell in (by where
        the fetch began on the stream) into ``gpu_data_idle_s``. A fetch outside every bounded phase (after
        backward, no optimizer mark) was in the period's remainder, which shrinks by itself. Offsets are ms
        from the step's begin event (``at``)."""
        el = self._elapsed
        total = 0.0
        for a, z in fetches:
            idle = max(0.0, el(a, z)) * 1e-3
            if not idle:
                continue
            total += idle
            start = at(a)
            if f_ms is not None and start < f_ms:
                phase = "h2d_s"
            elif f_ms is not None and start < compute_end_ms:
                phase = "gpu_compute_s"
            elif o_ms is not None and start >= o_ms:
                phase = "gpu_optimizer_s"
            else:
                continue
            row[phase] = max(0.0, row[phase] - idle)
        row["gpu_data_idle_s"] = total


class TraceSampler:
    """``Worker.samplers`` entry: reduce the profiler windows the resolver collected."""

    __name__ = "trace_window"

    def __init__(self, resolver: GpuResolver, window: Any) -> None:
        self._resolver = resolver
        self._window = window

    def __call__(self) -> list[dict]:
        rows: list[dict] = []
        while self._resolver.windows:
            rows.extend(self._window.reduce(self._resolver.windows.pop(0)))
        return rows
