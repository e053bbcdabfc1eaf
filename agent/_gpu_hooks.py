"""GPU signals of a rank: CUDA-event step marks on the hot path (``GpuMarks``), the hooks that place them and
``attach_gpu``, which wires them with their resolver (``_gpu_resolver``: read on the agent thread) and the
NVML, allocator and sampled-trace samplers.

Hot path (training / autograd threads): ``Event.record()`` on the current stream and a
``deque.append`` — never ``synchronize()``, ``elapsed_time()`` or ``.item()``. Events come from a pool
(a deque: pop/append are atomic under the GIL, no lock); the agent thread resolves them with
``query()`` then ``elapsed_time()`` and puts them back. A step whose events the GPU has not reached
yet is held for later flushes (``_gpu_resolver.GpuResolver``), never waited for.

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
from typing import Any, Optional

from ._config import GpuOptions
from ._event_sampling import is_sampled, threshold
from ._events import EV_GPU, EV_INFO
from ._gpu_resolver import GpuResolver, TraceSampler
from ._protocol import MonitorLike

log = logging.getLogger("ranksight")

_NS = 1e-9
_MAX_EVENTS = 4096  # bound on live CUDA events (pool + in flight); past it a mark is skipped
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

    def optimizer(self, framework: bool = False) -> None:
        """The optimizer's start, once per step and only after forward. Under ``optimizer.step(closure)``
        the global pre-hook fires before the closure runs forward and backward, which are not the
        optimizer's; the framework's own "before optimizer step" callback (``framework``) comes after the
        closure and marks again: the latest mark of a step is the one kept."""
        if (framework or not self._opt_marked) and self._fwd_marked and self._m._in_step:
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


def _device_of(model: Any, torch: Any) -> Optional[int]:
    for p in model.parameters():
        if p.device.type == "cuda":
            return p.device.index if p.device.index is not None else torch.cuda.current_device()
    return None


def attach_gpu(monitor: MonitorLike, model: Any, backward_hook: bool = False) -> None:
    """Set up GPU marks, the resolver and the GPU samplers for a model that lives on a CUDA device.

    What is sampled comes from ``Config.gpu`` (:class:`~ranksight.agent.GpuOptions`). ``backward_hook``
    marks the end of backward with one post-accumulate-grad hook (DDP without the per-bucket hook: NCCL
    always, gloo unless ``Config.comm_hook``).
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
            first_s=opts.trace_first_s,
            trace_dir=opts.trace_dir,
            detach_cupti=opts.detach_cupti,
            budget=opts.trace_budget,
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
