"""Time every ``torch.distributed`` collective and barrier a rank issues outside DDP's gradient buckets.

DDP's bucket all-reduces run in C++ and are timed by the comm hook (``_attach``). Everything else goes
through the Python functions of ``torch.distributed``: a metric ``all_reduce`` of the loss, a
``barrier``, object collectives, FSDP2's all-gathers and reduce-scatters, a framework's
``sync_dist``. Those functions are wrapped once per process: each call costs two clock reads, a
few attribute reads and one ``deque.append`` on the calling thread. An async op costs its caller the
issue and, later, the ``Work.wait()``: a wait called from Python outside any timed call is recorded
as its own ``wait`` row (torch's sync ops wait inside the timed call, so they are not counted twice),
so what is recorded is always the time the caller was held.

On a GPU rank the host is released when the collective is enqueued, so the wrapper also records two
CUDA events around the call on the current stream (never waited for): the time that stream was held.
Each call also carries the wall clock at its start: NCCL's flight recorder stamps the collectives it
records with that clock (``time_created_ns``), which is how ``_nccl_timing`` finds the call a
collective's GPU time belongs to.

Origins, read from the calling module (one frame up, no stack walk): ``fsdp`` (torch's FSDP),
``framework`` (Lightning, transformers, accelerate), ``torch`` (other torch internals, e.g. DDP's
start-up broadcast) and ``user``.
"""

from __future__ import annotations

import functools
import sys
import threading
from time import perf_counter_ns, time_ns
from typing import Any, Callable, Optional

from ._events import EV_COLLECTIVE

# op -> (index of the tensor whose bytes count, how to count them, positional index of `group`)
# "one": that tensor's bytes; "list": the sum over a list of tensors; None: no tensor (barrier, objects).
_OPS: dict[str, tuple[Optional[int], Optional[str], Optional[int]]] = {
    "all_reduce": (0, "one", 2),
    "broadcast": (0, "one", 2),
    "reduce": (0, "one", 3),
    "all_gather": (0, "list", 2),
    "all_gather_into_tensor": (0, "one", 2),
    "all_gather_single": (0, "one", 2),
    "reduce_scatter": (1, "list", 3),
    "reduce_scatter_tensor": (1, "one", 3),
    "reduce_scatter_single": (1, "one", 3),
    "all_to_all": (1, "list", 2),
    "all_to_all_single": (1, "one", 4),
    "gather": (0, "one", 3),
    "scatter": (0, "one", 3),
    "barrier": (None, None, 0),
    "monitored_barrier": (None, None, 0),
    "all_gather_object": (None, None, 2),
    "broadcast_object_list": (None, None, 2),
    "gather_object": (None, None, 3),
    "scatter_object_list": (None, None, 3),
}
_TENSOR_KWARGS = ("tensor", "output_tensor", "input_tensor", "output", "input", "tensor_list", "input_list")
_FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


class _State:
    """What the wrappers read: the recording monitor (None: pass through) and per-thread nesting."""

    def __init__(self) -> None:
        self.monitor: Any = None
        self.local = threading.local()
        self.originals: dict[tuple[Any, str], Callable] = {}
        self.wait_original: Optional[Callable] = None
        self.groups: dict[int, str] = {}


_state = _State()


def install(monitor: Any) -> bool:
    """Start timing collectives for ``monitor`` (the wrappers are installed once per process)."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
    except ImportError:
        return False
    if not dist.is_available():
        return False
    _state.monitor = monitor
    if _state.originals:
        return True
    for module in (dist, c10d):
        for name in _OPS:
            fn = getattr(module, name, None)
            if fn is None or getattr(fn, "_ranksight_wrapped", False):
                continue
            _state.originals[(module, name)] = fn
            setattr(module, name, _wrap(name, fn))
    work = getattr(c10d, "Work", None)
    if work is not None and _state.wait_original is None:
        _state.wait_original = work.wait
        work.wait = _timed_wait
    return True


def uninstall(monitor: Any) -> None:
    """Stop recording for ``monitor``; restore torch's functions unless someone wrapped them after us."""
    if _state.monitor is not monitor:
        return
    _state.monitor = None
    for (module, name), fn in list(_state.originals.items()):
        current = getattr(module, name, None)
        if getattr(current, "_ranksight_wrapped", False):
            setattr(module, name, fn)
        del _state.originals[(module, name)]
    if _state.wait_original is not None:
        from torch.distributed import distributed_c10d as c10d

        if c10d.Work.wait is _timed_wait:
            c10d.Work.wait = _state.wait_original
        _state.wait_original = None


class _Uninstaller:
    """A hook-handle-like object ``Monitor.close()`` calls ``remove()`` on."""

    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor

    def remove(self) -> None:
        uninstall(self._monitor)


def handle(monitor: Any) -> _Uninstaller:
    """What ``Monitor.close()`` removes to undo :func:`install`."""
    return _Uninstaller(monitor)


class untimed:
    """``with untimed():`` collectives inside are not counted (the DDP comm hook's own all-reduce,
    which the bucket marks already time)."""

    __slots__ = ("_was",)

    def __enter__(self) -> untimed:
        local = _state.local
        self._was = getattr(local, "busy", False)
        local.busy = True
        return self

    def __exit__(self, *exc) -> bool:
        _state.local.busy = self._was
        return False


def _origin(frame_globals: dict) -> str:
    module = frame_globals.get("__name__", "") or ""
    if module.startswith("torch.distributed.fsdp"):
        return "fsdp"
    if module.startswith("torch"):
        return "torch"
    if module.split(".", 1)[0] in _FRAMEWORKS:
        return "framework"
    return "user"


def _group_label(group: Any) -> str:
    if group is None:
        return "default"
    label = _state.groups.get(id(group))
    if label is None:
        try:
            desc = getattr(group, "group_desc", None) or getattr(group, "group_name", None) or "group"
            label = f"{desc}/{group.size()}"
        except Exception:
            label = "group"
        _state.groups[id(group)] = label
    return label


def _bytes(spec: tuple, args: tuple, kwargs: dict) -> int:
    index, how, _ = spec
    if how is None:
        return 0
    value = args[index] if len(args) > index else next((kwargs[k] for k in _TENSOR_KWARGS if k in kwargs), None)
    if value is None:
        return 0
    if how == "list":
        return sum(t.numel() * t.element_size() for t in value)
    return value.numel() * value.element_size()


def _wrap(name: str, fn: Callable) -> Callable:
    spec = _OPS[name]
    group_pos = spec[2]
    clock = perf_counter_ns
    wall = time_ns  # the flight recorder's clock (CLOCK_REALTIME), to match its entries to this call

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        m = _state.monitor
        local = _state.local
        if m is None or not m._active or getattr(local, "busy", False):
            return fn(*args, **kwargs)
        local.busy = True  # object collectives call broadcast / all_gather inside: count the outer op only
        gpu = m._gpu
        ev0 = None
        try:
            if gpu is not None:
                ev0 = gpu.collective_begin()
        except Exception as exc:
            m._reporter.count("collective_gpu_events", exc)
        wall_begin = wall()
        begin = clock()
        try:
            out = fn(*args, **kwargs)
        finally:
            local.busy = False
        end = clock()
        try:
            group = kwargs.get("group", args[group_pos] if group_pos is not None and len(args) > group_pos else None)
            origin = _origin(sys._getframe(1).f_globals)
            key = (name, origin, _group_label(group), _bytes(spec, args, kwargs))
            step = m._step
            m._append((EV_COLLECTIVE, step, *key, begin, end, end - begin, wall_begin))
            if ev0 is not None:
                gpu.collective_end(step, ev0)
        except Exception as exc:  # one lost record, never the user's collective
            m._reporter.count("collective_timing", exc)
        return out

    timed._ranksight_wrapped = True  # type: ignore[attr-defined]
    return timed


def _timed_wait(work, *args, **kwargs):
    """``Work.wait`` called from Python outside a timed call: the wait for an async op (user code,
    FSDP2's async unshard) holds the caller, so it is recorded as a ``wait`` row."""
    original = _state.wait_original
    m = _state.monitor
    if m is None or not m._active or getattr(_state.local, "busy", False):
        return original(work, *args, **kwargs)
    begin = perf_counter_ns()
    try:
        return original(work, *args, **kwargs)
    finally:
        end = perf_counter_ns()
        try:
            origin = _origin(sys._getframe(1).f_globals)
            m._append((EV_COLLECTIVE, m._step, "wait", origin, "-", 0, begin, end, end - begin))
        except Exception as exc:
            m._reporter.count("collective_timing", exc)
