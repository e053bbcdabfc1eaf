"""GPU signals of a rank: CUDA-event step phases on the hot path, resolved later on the agent thread,
plus the NVML, allocator and sampled-trace samplers.

Hot path (training / autograd threads): ``Event.record()`` on the current stream and a
``deque.append`` — never ``synchronize()``, ``elapsed_time()`` or ``.item()``. Events come from a pool
(a deque: pop/append are atomic under the GIL, no lock); the agent thread resolves them with
``query()`` then ``elapsed_time()`` and puts them back. A step whose events the GPU has not reached
yet is held for later flushes (``GpuResolver``), never waited for.

GPU phases per step, on the stream the step ran on:
    h2d_s               step begin → first forward (the batch's copies to the device and what precedes them)
    gpu_compute_s       first forward → last DDP bucket ready (else optimizer step, else step end)
    gpu_comm_exposed_s  last bucket ready → its all-reduce done on the GPU: the all-reduce backward did not
                        hide. With NCCL the host learns nothing here (its futures complete when the
                        collective is enqueued), so this is the only honest measure of exposed comm.
                        On NCCL no per-bucket hook runs: one post-accumulate-grad hook marks the end
                        of backward and queues an autograd final callback, which runs after DDP made
                        the stream wait for every bucket; its event marks the all-reduce done.
    gpu_comm_blocked_s  the time other collectives (metric all_reduce, barrier, FSDP2's on the compute
                        stream) held the step's stream: CUDA events around each call.
    gpu_optimizer_s     optimizer step → step end
    gpu_step_s          step begin → step end
    gpu_data_idle_s     what the stream sat idle inside the step's ``mon.data()`` blocks (events around each):
                        a fetch between forward and backward (nanoGPT's prefetch) stalls the stream inside
                        compute; that idle is taken out of the phase it fell in and counted as data wait.
    gpu_gap_s      previous step's end → this step's begin: how long the GPU stream sat idle for the host
                   (data wait, work between steps). About 0 when the host had queued this step already,
                   so a host-side wait that cost nothing is told apart from one that starved the GPU.
The last-bucket-ready mark is GPU time, not wall time: all-reduce equalises wall time across ranks,
GPU compute time does not, so it is what straggler analysis compares.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Optional

from ._config import GpuOptions
from ._event_sampling import choose_every, is_sampled, threshold
from ._events import EV_GPU, EV_INFO
from ._protocol import MonitorLike

log = logging.getLogger("ranksight")

_NS = 1e-9
_MAX_EVENTS = 4096  # bound on live CUDA events (pool + in flight); past it a mark is skipped
_MAX_HELD_ROWS = 10_000  # bound on step rows waiting for the GPU; past it the oldest go out as they are
_MAX_DATA_PAIRS = 64  # in-step mon.data() blocks bracketed per step (gradient accumulation fetches per micro-step)


class GpuMarks:
    """Attached as ``Monitor._gpu``; its methods run on the training thread."""

    def __init__(self, monitor: MonitorLike, torch: Any, device: int) -> None:
        self._m = monitor
        self._append = monitor._append
        self._event_cls = torch.cuda.Event
        self._current_stream = torch.cuda.current_stream
        self._step_stream = 0
        self._stream: Any = None  # the stream steps run on, read at the first step (a Stream object per call costs)
        # Event.record(stream) in C++ directly: the Python wrapper would look the current stream up every time.
        base = getattr(torch._C, "_CudaEventBase", None)
        self._record = getattr(base, "record", None) or torch.cuda.Event.record
        self.elapsed = getattr(base, "elapsed_time", None) or torch.cuda.Event.elapsed_time  # (a, b): ms a -> b
        self._pool: deque = deque()
        self._created = 0
        self.device = device
        self._fwd_marked = True
        self._opt_marked = True
        self.events_on = True
        self.every = 1  # events on about one step in this many (GpuOptions.events_every_steps; set_every)
        self._bound = threshold(1)  # the schedule's hash bound for ``every`` (_event_sampling)
        self.full_steps = 0  # steps from the first that are all sampled (GpuOptions.events_full_steps)
        self.sampled = True  # whether the current step records its events
        self.record_cost_s = 0.0  # host time of one Event.record(), timed at attach (measure_record_cost)
        self._data_pairs = 0  # in-step data blocks bracketed in the current step
        self.window = None  # TraceWindow, when the sampled kernel-level window is on

    def set_every(self, every: int) -> None:
        """Sample about one step in ``every`` from now on (the agent thread calls it; two attribute writes)."""
        self._bound = threshold(every)
        self.every = max(1, int(every))

    def samples(self, step: int) -> bool:
        """Whether ``step`` records its CUDA events (the same steps on every rank: ``_event_sampling``)."""
        return step < self.full_steps or is_sampled(step, self._bound)

    def measure_record_cost(self, n: int = 32) -> None:
        """Time ``Event.record()`` on the current stream, before the loop: what one event costs the training
        thread on this host, which sets how sparsely events are sampled. The events go to the pool."""
        stream = self._current_stream()
        events = [self._take() for _ in range(n)]
        events = [ev for ev in events if ev is not None]
        if not events:
            return
        clock, took = time.perf_counter, []
        for ev in events:
            t0 = clock()
            self._record(ev, stream)
            took.append(clock() - t0)
        self.record_cost_s = sorted(took)[len(took) // 2]  # the median: the first record may set things up
        self._pool.extend(events)

    def _take(self) -> Optional[Any]:
        try:
            return self._pool.pop()
        except IndexError:
            if self._created >= _MAX_EVENTS:
                return None
            self._created += 1
            return self._event_cls(enable_timing=True)

    def _mark(self, step: int, kind: str) -> None:
        if not self.events_on or self._stream is None:
            return
        ev = self._take()
        if ev is not None:
            self._record(ev, self._stream)
            self._append((EV_GPU, step, (kind, ev)))

    # ---------------------------------------------------------- called by the step context and hooks
    def step_begin(self, step: int) -> None:
        """Mark the step's start on the GPU stream; start or mark the sampled window when due."""
        if self._stream is None:
            self._stream = self._current_stream()
            self._step_stream = self._stream.cuda_stream
        on = self.sampled = self.samples(step)
        self._fwd_marked = self._opt_marked = not on  # an unsampled step's hooks return at once
        self._data_pairs = 0
        if on:
            self._mark(step, "b")
        w = self.window
        if w is not None and w.due(step, self._m._step_begin_ns):
            try:
                w.begin(step)
            except Exception as exc:
                self._window_failed(exc)

    def step_end(self, step: int) -> None:
        """Mark the step's end; let the window close its mark (and stop once the GPU caught up)."""
        w = self.window
        if w is not None and w.state:
            try:
                w.end(step)
            except Exception as exc:
                self._window_failed(exc)
        # The step before a sampled one marks its end too: the sampled step's gap is measured from it.
        if self.sampled or self.samples(step + 1):
            self._mark(step, "e")

    def forward(self) -> None:
        if not self._fwd_marked and self._m._in_step:
            self._fwd_marked = True
            self._mark(self._m._step, "f")

    def optimizer(self) -> None:
        """The optimizer's start, once per step and only after forward: under ``optimizer.step(closure)``
        the pre-hook fires before the closure runs forward and backward, which are not the optimizer's
        (the framework's own "before optimizer step" callback marks it then, through the monitor)."""
        if not self._opt_marked and self._fwd_marked and self._m._in_step:
            self._opt_marked = True
            self._mark(self._m._step, "o")

    def bucket_ready(self, step: int, is_last: bool) -> None:
        """DDP comm hook: mark when the last gradient bucket became ready (end of backward compute)."""
        if is_last and self.sampled:
            self._mark(step, "r")

    def backward_done(self) -> None:
        """End of backward (post-accumulate-grad hook of the gradient computed last); the latest one wins
        under gradient accumulation."""
        if self.sampled and self._m._in_step:
            self._mark(self._m._step, "r")

    def sync_done(self) -> None:
        """End of backward, after DDP waited for its all-reduces (an autograd final callback)."""
        if self.sampled and self._m._in_step:
            self._mark(self._m._step, "d")

    def collective_begin(self) -> Optional[Any]:
        """Before a collective call on the step's stream: an event there (None when events are off or used
        up, or when the call runs on a side stream: FSDP2 issues its all-gathers and reduce-scatters on
        streams of their own, which overlap compute by design and hold the step's stream only where it
        waits for them, inside its compute)."""
        if (
            not (self.events_on and self.sampled)
            or self._stream is None  # before the first step (a barrier before the loop): no step stream yet
            or self._current_stream().cuda_stream != self._step_stream
        ):
            return None
        return self._open_pair()

    def collective_end(self, step: int, begin: Any) -> None:
        """After the call returned: the pair measures how long the call held the current stream."""
        self._close_pair(step, begin, "c")

    def data_begin(self) -> Optional[Any]:
        """Entering an in-step ``mon.data()`` block: an event on the step's stream (None when events are off,
        the step is not sampled, or the step already bracketed ``_MAX_DATA_PAIRS`` blocks)."""
        if not (self.events_on and self.sampled) or self._stream is None or self._data_pairs >= _MAX_DATA_PAIRS:
            return None
        ev = self._open_pair()
        if ev is not None:
            self._data_pairs += 1
        return ev

    def data_end(self, step: int, begin: Any) -> None:
        """Leaving the block: on the GPU the pair spans the idle the host's wait caused (the stream reaches
        the first event after the work queued before it, the second once the host recorded it), plus any
        GPU work the block itself queued (its copies: ``.to(device)`` belongs after the block)."""
        self._close_pair(step, begin, "k")

    def _open_pair(self) -> Optional[Any]:
        """The first event of a pair that times a span on the step's stream (None when none is left)."""
        ev = self._take()
        if ev is not None:
            self._record(ev, self._stream)
        return ev

    def _close_pair(self, step: int, begin: Any, kind: str) -> None:
        """Record the pair's second event and queue the pair for the resolver under ``kind``; without an
        event left, the first goes back to the pool and the span is not timed."""
        end = self._take()
        if end is None:
            self._pool.append(begin)
            return
        self._record(end, self._stream)
        self._append((EV_GPU, step, (kind, begin, end)))

    def bucket_done(self, step: int) -> None:
        """The last bucket's all-reduce callback: runs on a stream that waits for the collective (a CUDA
        future's callbacks do), so this event completes when the all-reduce has on the GPU. Kind ``q``:
        another stream than the step's, so the resolver queries it on its own."""
        if self.sampled:
            self._mark(step, "q")

    def _window_failed(self, exc: BaseException) -> None:
        w, self.window = self.window, None
        if w is not None:
            w.abort()
        self._m._fail("trace_window", exc)

    def release(self, events) -> None:
        """Give events back to the pool (agent thread)."""
        self._pool.extend(events)


def _elapsed_time(a: Any, b: Any) -> float:
    return a.elapsed_time(b)


class GpuResolver:
    """``Worker.gpu_resolver``: fill the GPU columns of finished step rows from completed events.

    A GPU-bound job's host runs ahead of the GPU (seconds, with few long kernels per step), so a step
    row can be ready on the host long before the GPU has reached its end event. Such rows are held,
    in order, until that event completes — checked with ``query()`` at each flush, never waited for —
    or ``max_hold_s`` has passed; then they go out with whatever could be measured.
    """

    def __init__(self, marks: GpuMarks, max_hold_s: float = 60.0) -> None:
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


def _device_of(model: Any, torch: Any) -> Optional[int]:
    for p in model.parameters():
        if p.device.type == "cuda":
            return p.device.index if p.device.index is not None else torch.cuda.current_device()
    return None


def attach_gpu(monitor: MonitorLike, model: Any, backward_hook: bool = False) -> None:
    """Set up GPU marks, the resolver and the GPU samplers for a model that lives on a CUDA device.

    What is sampled comes from ``Config.gpu`` (:class:`~ranksight.agent.GpuOptions`). ``backward_hook``
    marks the end of backward with one post-accumulate-grad hook (DDP on NCCL, where no per-bucket
    hook runs).
    """
    import torch

    opts: GpuOptions = monitor.config.gpu
    device = _device_of(model, torch)
    if device is None:
        monitor._warn_once("gpu_model", "CUDA is available but the model has no CUDA parameters: GPU signals are off")
        return
    marks = GpuMarks(monitor, torch, device)
    resolver = GpuResolver(marks)
    samplers: list = []
    try:  # what the memory rules compare the model's state with
        props = torch.cuda.get_device_properties(device)
        monitor._append((EV_INFO, "gpu_device", {"name": props.name, "total_memory_bytes": int(props.total_memory)}))
    except Exception as exc:
        monitor._warn_once("gpu_device", f"cannot read the GPU's properties ({exc})")

    if opts.trace_window:
        from ._trace_window import TraceWindow

        marks.window = TraceWindow(
            monitor,
            steps=opts.trace_steps,
            every_steps=opts.trace_every_steps,
            every_s=opts.trace_every_s,
            first_step=opts.trace_first_step,
            trace_dir=opts.trace_dir,
            detach_cupti=opts.detach_cupti,
        )
        samplers.append(TraceSampler(resolver, marks.window))
    if opts.nvml:
        from ._nvml import NvmlSampler

        samplers.append(NvmlSampler(monitor, device))
    if opts.allocator:
        from ._allocator import AllocatorSampler

        samplers.append(
            AllocatorSampler(monitor, device, every_s=opts.allocator_every_s, snapshot_every_s=opts.snapshot_every_s)
        )
    if opts.gpu_events:
        fwd = marks.forward

        def on_forward(module, args):
            try:
                fwd()
            except Exception as exc:
                monitor._fail("gpu_forward_hook", exc)

        opt = marks.optimizer

        def on_optimizer(optimizer, args, kwargs):
            try:
                opt()
            except Exception as exc:
                monitor._fail("gpu_optimizer_hook", exc)

        monitor._hook_handles.append(model.register_forward_pre_hook(on_forward))
        try:  # a global hook (torch >= 2.0): watch() may not have been given the optimizer
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            monitor._hook_handles.append(register_optimizer_step_pre_hook(on_optimizer))
        except ImportError:
            pass
        if backward_hook:
            _hook_backward_end(monitor, model, marks)
    else:
        marks.events_on = False
    marks.full_steps = int(opts.events_full_steps)
    if opts.events_every_steps is None:
        resolver.budget = float(opts.events_budget)
        if marks.events_on:
            try:
                marks.measure_record_cost()
            except Exception as exc:
                monitor._warn_once("gpu_event_cost", f"cannot time a CUDA event ({exc}): events on every step")
    else:
        marks.set_every(int(opts.events_every_steps))
    if opts.nccl_timing:
        try:
            from ._nccl_timing import attach_nccl_timing

            attach_nccl_timing(monitor, torch, ddp=backward_hook, every_s=float(opts.nccl_timing_every_s))
        except Exception as exc:
            monitor._fail("nccl_timing", exc)
    monitor._wire_gpu(marks, resolver, samplers)


def _hook_backward_end(monitor: MonitorLike, model: Any, marks: GpuMarks) -> None:
    """Mark the end of backward and the all-reduce's completion on the GPU, with one Python call per step.

    The gradient computed last is the first trainable parameter's (the layers nearest the input finish
    backward last): its post-accumulate-grad hook marks the end of backward compute and queues a callback
    that autograd runs when backward is done; that one queues the mark itself, which so runs after DDP's
    own finalisation, which makes the stream wait for every bucket's all-reduce. An event recorded there
    completes when the all-reduce has, on the GPU, however far ahead the host is.
    """
    param = next((p for p in model.parameters() if p.requires_grad), None)
    if param is None or not hasattr(param, "register_post_accumulate_grad_hook"):
        monitor._warn_once("backward_mark", "cannot mark the end of backward (torch < 2.1?): exposed all-reduce is off")
        return
    import torch

    engine = torch.autograd.Variable._execution_engine
    ready, done = marks.backward_done, marks.sync_done

    def after_ddp():
        # DDP queues its finalisation (the wait for every bucket) when its last bucket is ready, after
        # this hook ran: a callback queued now would run before it. Callbacks queued while final callbacks
        # run go to the end of the queue, so this second hop runs after DDP's wait (on gloo, measured: the
        # first hop 0.6 ms into backward, the second 52.7 ms, after a peer 50 ms late).
        try:
            engine.queue_callback(done)
        except Exception as exc:
            monitor._fail("backward_mark", exc)

    def on_grad(tensor):
        try:
            if not getattr(marks, "sampled", True):
                return  # an unsampled step (GpuOptions.events_every_steps): no marks, no callbacks
            ready()
            engine.queue_callback(after_ddp)
        except Exception as exc:
            monitor._fail("backward_mark", exc)

    monitor._hook_handles.append(param.register_post_accumulate_grad_hook(on_grad))
