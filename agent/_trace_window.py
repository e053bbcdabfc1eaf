"""The sampled kernel-level window: every few hundred steps (or ~60 s), trace a couple of steps with
the Kineto profiler (CPU + CUDA) and reduce the trace off the training thread (a child process, else the agent thread).

Why the low-level profiler calls instead of ``torch.profiler.profile``: its ``__exit__`` calls
``torch.cuda.synchronize()`` and parses every event into Python objects on the training thread.
Here the window's end is a CUDA event; the profiler is stopped at a later step boundary once
``event.query()`` says the GPU has caught up (no sync), and the raw result is handed to the agent
thread, which reads it and reduces it (``ranksight.trace_reduce``). The training thread pays only for the
profiler's own start/stop and its per-op recording during the traced steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, Optional

from ranksight.trace_reduce import ACTIVITY_KIND, AFTER_MARK, WINDOW_MARK, Ev, reduce_window

from ._events import EV_GPU, EV_INFO
from ._trace_reduce import reduce_file_in_child

log = logging.getLogger("ranksight")

_FAILED = object()  # the child could not reduce the window (None is a window without steps)

_windows: weakref.WeakSet[TraceWindow] = weakref.WeakSet()  # this process's windows, for yield_to_user_profiler
_hook_lock = threading.Lock()
_hooked: list = []  # (class, its own _prepare_trace) once hooked
_detach_set_here = False  # whether TEARDOWN_CUPTI=1 is the agent's setting (detach_cupti_after_trace)


def yield_to_user_profiler(torch: Any) -> None:
    """Make a profiler the user starts stop this process's sampled windows first (hooked once per process).

    Why: with a CUDA build of torch (2.11 on an H200), a Kineto profiler already prepared or running makes
    the user's ``torch.profiler.profile()`` (or ``torch.autograd.profiler.profile()``) raise "Can't disable
    Kineto profiler when it's not running" -- into their code. Their profile is what they asked for, ours a
    sample: at their profiler's start (``profile._prepare_trace``, which both call) any window of ours that
    is not idle is dropped, and the window then skips its turns while theirs runs (``_user_profiling``).
    """
    cls = getattr(getattr(torch.autograd, "profiler", None), "profile", None)
    original = getattr(cls, "_prepare_trace", None)
    if original is None:
        return
    with _hook_lock:
        if _hooked:
            return

        def _prepare_trace(self, *args, **kwargs):
            for window in list(_windows):
                if window.state != window.IDLE:
                    window.yield_to_user()
            _say_cupti_was_detached()
            return original(self, *args, **kwargs)

        cls._prepare_trace = _prepare_trace
        _hooked.append((cls, original))


def detach_cupti_after_trace(torch: Any) -> bool:
    """Have Kineto detach CUPTI (``cuptiFinalize``) when a window stops, unless the user chose otherwise.

    Why: CUPTI left attached after a trace keeps its callbacks on every CUDA runtime call, which slows a
    host-bound job's kernel launches for the rest of the run (10-20 % reported in pytorch/pytorch#144455),
    although the window itself lasted two steps. Kineto detaches when ``TEARDOWN_CUPTI=1``. Before CUDA 12.6
    re-attaching after a detach could crash with CUDA graphs (torch.profiler keeps CUPTI attached there),
    so older CUDA is left as it is. Returns whether detaching is on."""
    if "TEARDOWN_CUPTI" in os.environ or os.environ.get("DISABLE_CUPTI_LAZY_REINIT") == "1":
        return os.environ.get("TEARDOWN_CUPTI") == "1"
    try:
        major, minor = (int(x) for x in str(torch.version.cuda).split(".")[:2])
    except (AttributeError, TypeError, ValueError):
        return False
    if (major, minor) < (12, 6):
        return False
    global _detach_set_here
    os.environ["TEARDOWN_CUPTI"] = "1"
    _detach_set_here = True
    return True


def _say_cupti_was_detached() -> None:
    """Warn once, as a user's profiler starts, that a window of ours detached CUPTI earlier in the process.

    Why: on torch 2.11 with CUDA 13 (one H200), a ``torch.profiler`` started after the agent's windows had
    detached CUPTI recorded no GPU kernel (2 of 2 runs of tests/test_gpu_cuda.py with detaching on; 15 of
    15 tests pass with it off); three synchronising calls before their start did not help. Their trace
    looks empty for no reason they could see: the warning names the option that keeps CUPTI attached."""
    if not _detach_set_here:  # no detach of ours (a user's own TEARDOWN_CUPTI is theirs to know)
        return
    for window in list(_windows):
        if window.detach_cupti and window.windows_done:
            window._m._warn_once(
                "trace_window_detached_cupti",
                "ranksight's kernel window detached CUPTI earlier in this process (detach_cupti): a profiler "
                "started now may record no GPU kernels; to profile in-process, start ranksight with "
                "gpu={'detach_cupti': False} (host-bound steps then pay CUPTI's callbacks, docs/agent.md)",
            )
            return


@contextlib.contextmanager
def _cupti_kept_attached() -> Iterator[None]:
    """Within: a profiler stop leaves CUPTI attached, if the agent was the one to ask for detaching
    (Kineto reads ``TEARDOWN_CUPTI`` when a trace stops)."""
    ours = os.environ.get("TEARDOWN_CUPTI") == "1" and _detach_set_here
    if ours:
        os.environ["TEARDOWN_CUPTI"] = "0"
    try:
        yield
    finally:
        if ours:
            os.environ["TEARDOWN_CUPTI"] = "1"


def _kind_without_activity_type(e: Any, cpu: Any) -> Optional[str]:
    """Classify an event on torch < 2.12, whose ``_KinetoEvent`` has no ``activity_type()``."""
    name = e.name()
    annotation = e.is_user_annotation() if hasattr(e, "is_user_annotation") else name.startswith("ranksight#")
    if e.device_type() != cpu:
        if annotation or name.startswith(("ranksight#", "ProfilerStep")):
            return None  # the GPU-side shadow of a CPU annotation, not GPU work
        if name.startswith("Memcpy"):
            return "memcpy"
        if name.startswith("Memset"):
            return "memset"
        return "kernel"
    if annotation:
        return "ann"
    if name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper()):
        return "rt"
    return "op"


def events_from_kineto(result: Any, use_activity_type: bool = True) -> list[Ev]:
    """Normalise a ``_ProfilerResult`` (from ``_disable_profiler()``) into :class:`Ev` tuples."""
    from torch.autograd import DeviceType

    out = []
    for e in result.events():
        if use_activity_type and hasattr(e, "activity_type"):
            kind = ACTIVITY_KIND.get(e.activity_type())
        else:
            kind = _kind_without_activity_type(e, DeviceType.CPU)
        if kind is None:
            continue
        start = e.start_ns()
        out.append(Ev(kind, e.name(), start, start + e.duration_ns(), e.device_resource_id(), e.correlation_id()))
    return out


class TraceWindow:
    """State machine driven from the step boundaries: idle → warming up one step → tracing k steps →
    waiting for the GPU → one untraced step that measures what the window cost → idle.

    The warm-up step prepares the profiler (CUPTI set-up, the slow part on a first window) outside the
    traced steps, as ``torch.profiler``'s warm-up phase does: measured on an H200, preparing and starting
    in the same step stalled the host ~100 ms inside the window and showed a GPU-bound job's GPU idle
    42 % "waiting for the host".

    The first window is due once ``first_step`` steps and ``first_s`` seconds have passed (a short job
    pays no window); later ones once both ``every_steps`` steps and ``every_s`` seconds have passed since the
    last one: the step floor keeps slow jobs sampled, the time floor bounds the cost on fast ones. What a window
    costs depends on the job: on an H200 0.05-0.07 s of training time on the DDP tutorial, 0.15-0.31 s on
    nanoGPT's four micro-steps of 191M parameters, of which the profiler's stop on the training thread is
    0.10-0.19 s, and up to 0.76 s when the next warm-up attaches a detached CUPTI again
    (benchmarks/results/gpu1_window_stop.json). So the window measures its own cost -- the time from its
    warm-up step to the step after its stop, less as many of that step, plus the agent thread's reduction,
    which holds the GIL the training thread needs -- and, with ``budget``, the next one waits until that
    cost is at most ``budget`` of the time since (0.3 s at 0.002: 150 s, not 60 s).

    ``begin``/``end`` run on the training thread only when ``due`` or busy (checked by the caller with
    two integer compares); everything heavy happens on the agent thread in :meth:`reduce`.
    """

    IDLE, TRACING, DRAINING, WARMING, COOLING = 0, 1, 2, 3, 4

    def __init__(
        self,
        monitor: Any,
        steps: int = 2,
        every_steps: int = 300,
        every_s: float = 60.0,
        first_step: int = 50,
        first_s: float = 0.0,
        max_drain_steps: int = 20,
        use_cuda: bool = True,
        trace_dir: Optional[str] = None,
        detach_cupti: bool = False,
        budget: Optional[float] = None,
    ) -> None:
        import torch
        from torch.autograd.profiler import ProfilerActivity, ProfilerConfig, ProfilerState

        self._m = monitor
        self._torch = torch
        self.steps = max(1, int(steps))
        self.every_steps = max(self.steps + 2, int(every_steps))
        self.every_ns = int(max(0.0, every_s or 0.0) * 1e9)
        self.next_step = max(0, int(first_step))
        self.next_ns = time.perf_counter_ns() + int(first_s * 1e9) if first_s > 0 else 0  # 0: by step alone
        self.max_drain_steps = max_drain_steps
        self.use_cuda = use_cuda
        self.trace_dir = trace_dir
        self.detach_cupti = detach_cupti
        self.budget = budget if budget and budget > 0 else None
        self.state = self.IDLE
        self.windows_done = 0
        self.last_stop_cost_ns = 0
        self.last_cost_ns = 0  # the last window's measured cost to the training thread
        self._t_prepare = 0  # perf_counter_ns at the warm-up step's start
        self._prepare_step = 0
        self._t_cooling = 0  # perf_counter_ns at the start of the step after the stop
        self._calls_ns = 0  # time inside the profiler's prepare, enable and stop calls
        self._result: Any = None
        self._last = 0
        self._first = 0
        self._drained = 0
        self._record = None
        self._end_event = None
        self._started_ns = 0
        self._pending: list = []  # finished profiler results for the agent thread
        self.reduce_in_child = True  # reduce in a child process (reduce_file_in_child); off after a failure
        self._activities = {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if use_cuda else set())
        try:
            from torch._C._profiler import _ExperimentalConfig

            experimental = _ExperimentalConfig()
        except Exception:
            experimental = None
        args = [ProfilerState.KINETO, False, False, False, False, False]
        self._config = ProfilerConfig(*args, experimental) if experimental is not None else ProfilerConfig(*args)
        self._rf_enter = torch.ops.profiler._record_function_enter_new
        self._rf_exit = torch.ops.profiler._record_function_exit._RecordFunction
        _windows.add(self)
        yield_to_user_profiler(torch)

    # ------------------------------------------------------------ training thread
    def due(self, step: int, now_ns: int) -> bool:
        """Whether a window is running or should start at this step (a few compares)."""
        return self.state != self.IDLE or (step >= self.next_step and now_ns >= self.next_ns)

    def begin(self, step: int) -> None:
        """At a step's start: prepare the profiler if due, start it a step later, then mark the step."""
        if self.state == self.IDLE:
            self._prepare(step)
            return
        if self.state == self.COOLING:
            self._t_cooling = time.perf_counter_ns()
            return
        if self.state == self.WARMING:
            self._enable(step)
            if self.state == self.IDLE:
                return
        self._record = self._rf_enter(WINDOW_MARK if self.state == self.TRACING else AFTER_MARK, None)

    def end(self, step: int) -> None:
        """At a step's end: close the mark; after the k-th step, wait (without blocking) for the GPU."""
        if self._record is not None:
            self._rf_exit(self._record)
            self._record = None
        if self.state == self.TRACING:
            if step >= self._first + self.steps - 1:
                if self.use_cuda:
                    self._end_event = self._torch.cuda.Event()
                    self._end_event.record()
                self.state = self.DRAINING
                self._drained = 0
        elif self.state == self.DRAINING:
            self._drained += 1
            if self._end_event is None or self._end_event.query() or self._drained >= self.max_drain_steps:
                self._stop(step)
        elif self.state == self.COOLING:
            self._cooled(step)

    def _prepare(self, step: int) -> None:
        from torch.autograd.profiler import _prepare_profiler

        self._schedule(step)
        if self._user_profiling():
            return
        self._t_prepare, self._prepare_step = time.perf_counter_ns(), step
        if self.detach_cupti:
            detach_cupti_after_trace(self._torch)
        _prepare_profiler(self._config, self._activities)
        self._calls_ns = time.perf_counter_ns() - self._t_prepare
        self.state = self.WARMING

    def _enable(self, step: int) -> None:
        from torch.autograd.profiler import _enable_profiler

        if self._user_profiling():  # started since the warm-up step
            self.state = self.IDLE
            return
        self._started_ns = time.perf_counter_ns()
        _enable_profiler(self._config, self._activities)
        self._calls_ns += time.perf_counter_ns() - self._started_ns
        self._first = step
        self.state = self.TRACING

    def _user_profiling(self) -> bool:
        """Whether someone else's profiler runs (then this window skips its turn, and says so once)."""
        if not self._torch._C._autograd._profiler_enabled():
            return False
        self._say_backing_off()
        return True

    def _say_backing_off(self) -> None:
        self._m._warn_once(
            "trace_window_backoff",
            "the profiler is already running (yours?): the sampled kernel-level window skips its turn",
        )

    def _stop(self, step: int) -> None:
        from torch.autograd.profiler import _disable_profiler

        t0 = time.perf_counter_ns()
        self._result = _disable_profiler()
        self.last_stop_cost_ns = time.perf_counter_ns() - t0
        self._calls_ns += self.last_stop_cost_ns
        self.state = self.COOLING
        self._end_event = None
        self._last = step
        self.windows_done += 1
        self._schedule(step)

    def _cooled(self, step: int) -> None:
        """The step after the stop, untraced: what the window cost is its steps' time less as many of this
        one (at least the profiler calls' own time); hand the result to the agent thread, space the next."""
        now = time.perf_counter_ns()
        steps = max(1, step - self._prepare_step)
        span = self._t_cooling - self._t_prepare if self._t_cooling else 0
        cost = max(self._calls_ns, span - steps * (now - self._t_cooling)) if span > 0 else self._calls_ns
        self.last_cost_ns = cost
        self._space_after(cost)
        self._hand_over(cost)

    def _space_after(self, cost_ns: int) -> None:
        """Under a budget, the next window waits until ``cost_ns`` is at most ``budget`` of the time since."""
        if self.budget:
            self.next_ns = max(self.next_ns, time.perf_counter_ns() + int(cost_ns / self.budget))

    def _hand_over(self, cost_ns: int) -> None:
        result, self._result, self._t_cooling = self._result, None, 0
        self.state = self.IDLE
        if result is not None:
            payload = ("w", result, self._first, self._last, self.last_stop_cost_ns, cost_ns)
            self._m._append((EV_GPU, self._first, payload))

    def _schedule(self, step: int) -> None:
        self.next_step = step + self.every_steps
        self.next_ns = time.perf_counter_ns() + self.every_ns

    def yield_to_user(self) -> None:
        """A user's profiler is starting: drop this window (said once), so that theirs can start. The next
        window stays due when it was (``_prepare`` scheduled it), and skips its turn while theirs runs.

        With ``detach_cupti`` on, CUPTI stays attached through this stop: theirs attaches it again at once.
        If an earlier window detached CUPTI, a warning says so (``_say_cupti_was_detached``)."""
        self._say_backing_off()
        with _cupti_kept_attached():
            self.abort()

    def abort(self) -> None:
        """Stop a running profiler (agent switched off or closing); the partial window is dropped, a
        finished one still handed over (its cost then is the profiler calls' own time)."""
        if self.state == self.COOLING:
            self._hand_over(self._calls_ns)
            return
        if self.state != self.IDLE:
            warming, self.state = self.state == self.WARMING, self.IDLE
            try:
                if self._record is not None:
                    self._rf_exit(self._record)
                from torch.autograd.profiler import _disable_profiler, _enable_profiler

                if warming:  # prepared only: start it so that it can be stopped (as torch.profiler does)
                    _enable_profiler(self._config, self._activities)
                _disable_profiler()
            except Exception as exc:  # counted: a profiler left running would slow every later step
                self._m._reporter.count("trace_window_stop", exc)
            self._record = None

    # ------------------------------------------------------------ agent thread
    def reduce(self, payload: tuple) -> list[dict]:
        """Turn one finished window into sample rows (and info events for CPU ops and host syncs)."""
        _, result, first, last, stop_ns, cost_ns = payload
        t0 = time.thread_time_ns()  # this thread's CPU time: not the waits for a GIL the training thread held
        red: Any = _FAILED
        tried_child = self.reduce_in_child
        if tried_child:
            red = self._reduce_in_child(result, first)
        if red is _FAILED:
            if self.trace_dir and not tried_child:  # a result saves once: the child's try kept its file
                result.save(self._trace_path(first))
            red = reduce_window(events_from_kineto(result), model_on_gpu=self.use_cuda)
        reduce_ns = time.thread_time_ns() - t0
        # This thread held the GIL through that: a training thread that releases it for every op gets it
        # back only when this thread lets go, so it lost about as much (a 1.8 ms torch step ran 6.5-550x
        # slower beside a Python thread that never let go, benchmarks/results/cpu_gil_convoy.json). It
        # counts in the window's cost.
        self._space_after(cost_ns + reduce_ns)
        if red is None:
            return []
        if self.use_cuda and red.span_ns == 0:
            # Seen on an H200 with the device all but full: CPU events only.
            self._m._warn_once(
                "trace_window_no_gpu",
                f"the sampled window (steps {first}-{first + red.steps - 1}) captured no GPU activity: "
                "kernel-level signals (kernel busy, idle, copies) are missing; a full GPU can starve the profiler",
            )
        now = time.time_ns()
        rows = [{"time_ns": now, "step": first, "name": k, "value": float(v)} for k, v in red.samples.items()]
        rows.append({"time_ns": now, "step": last, "name": "trace_window_stop_seconds", "value": stop_ns / 1e9})
        rows.append({"time_ns": now, "step": last, "name": "trace_window_cost_seconds", "value": cost_ns / 1e9})
        rows.append({"time_ns": now, "step": last, "name": "trace_window_reduce_seconds", "value": reduce_ns / 1e9})
        if red.cpu_ops_top and red.samples.get("cpu_op_ratio", 0.0) >= 0.01:
            ops = ", ".join(f"{n} {s * 1e3:.2f} ms/step" for n, s in red.cpu_ops_top)
            self._info("cpu_ops", f"steps {first}-{first + red.steps - 1}: ops on CPU tensors: {ops}")
        if red.sync_sources:
            srcs = ", ".join(f"{n} x{c:g}/step" for n, c in red.sync_sources)
            self._info("host_syncs", f"steps {first}-{first + red.steps - 1}: host syncs from {srcs}")
        return rows

    def _trace_path(self, first: int) -> str:
        assert self.trace_dir
        os.makedirs(self.trace_dir, exist_ok=True)
        return os.path.join(self.trace_dir, f"window_r{os.getpid()}_s{first:06d}.json")

    def _reduce_in_child(self, result: Any, first: int) -> Any:
        """Reduce the window in a child process: this thread only has Kineto write the trace (one C++ call,
        the cheapest way out of the profiler per event) and waits, GIL released, for the child's figures.

        Why: read event by event here, a window of 200,000 events held the GIL ~4 s on a loaded 2-core host
        (``events()`` 0.48 s, reading each event 3.1 s, the reduction 0.6 s), which the training thread lost;
        the file costs the training thread the write alone. Returns ``_FAILED`` when the child could not do it
        (then it is reduced here, and a warning says so once)."""
        if self.trace_dir:
            path, keep = self._trace_path(first), True
        else:
            fd, path = tempfile.mkstemp(prefix="ranksight-window-", suffix=".json")
            os.close(fd)
            keep = False
        try:
            result.save(path)
            return reduce_file_in_child(path, self.use_cuda)
        except Exception as exc:
            self.reduce_in_child = False
            self._m._warn_once(
                "trace_window_child",
                f"the kernel window is reduced on the agent thread from now on: its child process failed ({exc})",
            )
            return _FAILED
        finally:
            if not keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _info(self, component: str, message: str) -> None:
        # Picked up by the next flush as an events row of level "info".
        self._m._append((EV_INFO, "info", (component, message)))
