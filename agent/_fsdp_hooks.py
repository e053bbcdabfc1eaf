"""FSDP2 (``fully_shard``) from inside: each unit's all-gathers, split into forward and backward, and its
reduce-scatters, with how much of each all-gather held the training thread (exposed) and how much ran
while it computed (overlapped).

The generic collective timing (``_collectives``) sees FSDP2's ``all_gather_single`` and
``reduce_scatter_single`` calls but not which pass issued them, and an async all-gather's wait only as
an anonymous ``wait``. So for every FSDP parameter group (one per ``fully_shard`` unit with parameters)
three things are wrapped, on that group only (never torch's classes):

- its all-gather and reduce-scatter callables (``_all_gather_comm``, ``_reduce_scatter_comm``, as in
  torch 2.13; without them the generic timing covers the unit): their class is swapped for a subclass
  whose ``__call__`` times the collective and runs it with the generic timer off, so nothing is
  counted twice; ``isinstance`` checks in FSDP2 still pass;
- its ``wait_for_unshard``: it first waits for an async all-gather's ``Work`` itself (timed: the exposed
  rest of a prefetched all-gather), then runs FSDP2's own (the copy-out, whose wait now returns at once).

Each all-gather becomes one ``collectives`` row per step and pass: op ``all_gather_forward`` or
``all_gather_backward``, ``blocked_s`` = time held at the issue + at the wait (what the step waited),
its span from issue to wait kept per unit (``fsdp_units`` in the rank metadata: issue-to-wait span,
exposed time, bytes, calls), so the overlap is ``1 - exposed / span``. Reduce-scatters are op
``reduce_scatter``. On a GPU the host times say little (NCCL returns at enqueue); there the wait is
bracketed with CUDA events on the step's stream, so ``gpu_comm_blocked_s`` holds the time compute
waited for the all-gather (and its copy-out), and an all-gather issued on the compute stream
(``unshard_async_op``) is bracketed at the issue too.

Cost on the training thread: per unit and pass about 4 clock reads, one tuple and one ``deque.append``
(against FSDP2's own tens of microseconds of Python per unit). Any error switches the recording off for
that unit and is counted; FSDP2 goes on.
"""

from __future__ import annotations

import math
import sys
from time import perf_counter_ns
from typing import Any, Optional

from ._collectives import _group_label, untimed
from ._events import EV_COLLECTIVE, EV_INFO

SNAPSHOT_EVERY_STEPS = 20
"""How often (in steps) the per-unit totals go to the rank metadata (and once more at close)."""

MAX_UNIT_SLOTS = 8
"""Collective rows per step and op are kept per unit up to this many units, per slot of consecutive units
beyond: enough to match calls across ranks, at most 3 x 8 rows per step whatever the model's depth."""

_STAT_FIELDS = (
    "all_gathers_forward", "all_gathers_backward", "all_gather_bytes", "all_gather_exposed_s",
    "all_gather_span_s", "reduce_scatters", "reduce_scatter_bytes", "reduce_scatter_s",
)  # fmt: skip
_AG_FWD, _AG_BWD, _AG_BYTES, _AG_EXPOSED, _AG_SPAN, _RS_N, _RS_BYTES, _RS_HELD = range(len(_STAT_FIELDS))


def _fsdp_module_class() -> Optional[type]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6 keeps it under _composable
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return None
    return FSDPModule


def fsdp_modules(module: Any) -> list[tuple[str, Any]]:
    """(name, module) of every ``fully_shard`` module in ``module``, outermost first; [] without FSDP2."""
    cls = _fsdp_module_class()
    if cls is None:
        return []
    return [(name or "(root)", m) for name, m in module.named_modules() if isinstance(m, cls)]


def _groups(fsdp_module: Any) -> list:
    """The FSDP parameter groups of one ``fully_shard`` module (none when it manages no parameter)."""
    try:
        state = fsdp_module._get_fsdp_state()
    except Exception:
        return []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch < 2.9: one optional group
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


def _backend(modules: list) -> Optional[str]:
    """The shard group's backend (gloo, nccl): what the all-gathers' bandwidth is judged against."""
    import torch.distributed as dist

    for _, mod in modules:
        for g in _groups(mod):
            try:
                return str(dist.get_backend(g._all_gather_process_group))
            except Exception:
                return None
    return None


def state_of(fsdp_module: Any) -> Any:
    """The FSDP2 state of a ``fully_shard`` module (None when it cannot be read)."""
    try:
        return fsdp_module._get_fsdp_state()
    except Exception:
        return None


def _dtype_name(dtype: Any) -> Optional[str]:
    return None if dtype is None else str(dtype).replace("torch.", "")


def fsdp_facts(module: Any) -> dict:
    """What the FSDP rules are fitted to: the units, their sizes, resharding, prefetching, precision."""
    units = []
    modules = fsdp_modules(module)
    policy: dict = {}
    async_op = False
    for name, mod in modules:
        groups = _groups(mod)
        try:
            state = mod._get_fsdp_state()
            fwd = len(getattr(state, "_states_to_forward_prefetch", []) or [])
            bwd = len(getattr(state, "_states_to_backward_prefetch", []) or [])
        except Exception:
            fwd = bwd = 0
        param_bytes = params = 0
        reshard = None
        for g in groups:
            for p in getattr(g, "fsdp_params", []):
                size = p._orig_size.numel() if hasattr(p, "_orig_size") else 0
                params += size
                param_bytes += size * p.sharded_param.element_size()
            # post_forward_mesh_info is None exactly when reshard_after_forward is False.
            reshard = getattr(g, "post_forward_mesh_info", None) is not None
            async_op = async_op or bool(getattr(g, "unshard_async_op", False))
            mp = getattr(g, "mp_policy", None)
            if mp is not None and not policy:
                policy = {"param_dtype": _dtype_name(mp.param_dtype), "reduce_dtype": _dtype_name(mp.reduce_dtype)}
        # FSDP2 keeps the root unsharded after forward unless told otherwise (it sets that at the first forward).
        if mod is modules[0][1] and reshard and getattr(state_of(mod), "_auto_reshard_after_forward", False):
            reshard = False
        units.append({
            "name": name, "params": params, "param_bytes": param_bytes, "has_params": bool(groups),
            "reshard_after_forward": reshard, "forward_prefetch": fwd, "backward_prefetch": bwd,
        })  # fmt: skip
    with_params = [u for u in units if u["has_params"]]
    mesh = None
    for _, mod in modules:
        for g in _groups(mod):
            try:
                mesh = g._all_gather_process_group.size()
            except Exception:
                pass
            break
        if mesh:
            break
    return {
        "backend": _backend(modules),
        "units": len(units),
        "units_with_params": len(with_params),
        "unit_list": units[:256],
        "param_bytes": sum(u["param_bytes"] for u in units),
        "reshard_after_forward_units": sum(1 for u in with_params if u["reshard_after_forward"]),
        "forward_prefetch_units": sum(1 for u in units if u["forward_prefetch"]),
        "backward_prefetch_units": sum(1 for u in units if u["backward_prefetch"]),
        "unshard_async_op": async_op,
        "param_dtype": policy.get("param_dtype"),
        "reduce_dtype": policy.get("reduce_dtype"),
        "shard_group_size": mesh,
    }


def _gpu_begin(m: Any, gpu: Any) -> Any:
    """The CUDA event opening a collective's hold on the step stream, or None (no GPU part, or it failed:
    counted, and the host timing goes on)."""
    if gpu is None:
        return None
    try:
        return gpu.collective_begin()
    except Exception as exc:
        m._reporter.count("collective_gpu_events", exc)
        return None


class _Recorder:
    """The per-unit hooks of one watched model, and the totals they keep (snapshot into the metadata)."""

    def __init__(self, m: Any, module: Any) -> None:
        self.m = m
        self.module = module
        self.units: list[_UnitHooks] = []
        self.next_snapshot = SNAPSHOT_EVERY_STEPS
        self.handle: Any = None

    def snapshot(self) -> None:
        """Per-unit totals to the rank metadata (``fsdp_units``): evidence for which unit waits most."""
        rows = []
        for u in self.units:
            row = {"name": u.name}
            for field, value in zip(_STAT_FIELDS, u.stats):
                row[field] = value * 1e-9 if field.endswith("_s") else value
            rows.append(row)
        self.m._append((EV_INFO, "fsdp_units", rows))

    def maybe_snapshot(self, step: int) -> None:
        if step < self.next_snapshot:
            return
        self.next_snapshot = step + SNAPSHOT_EVERY_STEPS
        self.snapshot()

    def watch_settings(self) -> None:
        """Read the facts again at the first forward of step 1 (prefetching and resharding are often set
        after watch(), and FSDP2 settles the root's at its first forward), then stop looking."""
        handle = None

        def once(module, args):
            try:
                if self.m._step >= 1 and handle is not None:
                    handle.remove()
                    self.m._append((EV_INFO, "fsdp", fsdp_facts(self.module)))
            except Exception as exc:
                self.m._fail("fsdp_facts", exc)

        handle = self.module.register_forward_pre_hook(once)
        self.handle = handle

    def remove(self) -> None:
        """Undo the wrapping (``Monitor.close()``) and send the final totals."""
        try:
            if self.handle is not None:
                self.handle.remove()
            self.snapshot()
        finally:
            for u in self.units:
                u.unwrap()


_PRE_BACKWARD = None  # TrainingState.PRE_BACKWARD, read once


def _subclass(cls: type, kind: str) -> type:
    """A subclass of FSDP2's comm class whose call is timed by the group's hooks (cached per class)."""
    cache = _subclass.__dict__.setdefault("cache", {})
    key = (cls, kind)
    if key not in cache:
        base_call = cls.__call__

        def __call__(self, *args, **kwargs):
            hooks = self.__dict__.get("_ranksight_hooks")
            if hooks is None:
                return base_call(self, *args, **kwargs)
            if kind == "ag":
                return hooks.all_gather(base_call, self, args, kwargs)
            return hooks.reduce_scatter(base_call, self, args, kwargs)

        cache[key] = type(cls.__name__, (cls,), {"__call__": __call__, "_ranksight_base": cls})
    return cache[key]


class _UnitHooks:
    """Timing of one FSDP parameter group's collectives."""

    def __init__(self, recorder: _Recorder, name: str, group: Any) -> None:
        self.recorder = recorder
        self.m = recorder.m
        self.name = name
        self.group = group
        self.stats = [0] * len(_STAT_FIELDS)
        self.pending: Optional[tuple] = None  # (issue begin, issue held, backward?, bytes, work)
        self.ag_bytes = 0
        self.no_timing = untimed()
        try:
            self.label = _group_label(group._all_gather_process_group)
        except Exception:
            self.label = "default"
        self.wrapped: list = []

    def wrap(self) -> bool:
        g = self.group
        ag, rs = getattr(g, "_all_gather_comm", None), getattr(g, "_reduce_scatter_comm", None)
        if ag is None or rs is None or not hasattr(g, "wait_for_unshard"):
            return False  # a torch without per-group comm objects: the generic collective timing covers this unit
        for comm, kind in ((ag, "ag"), (rs, "rs")):
            if "_ranksight_base" not in type(comm).__dict__:  # else already wrapped: watch() called again
                comm.__class__ = _subclass(type(comm), kind)
            comm._ranksight_hooks = self  # the latest watch() records (issue and wait on the same hooks)
            self.wrapped.append(comm)
        g.wait_for_unshard = self.wait_for_unshard  # instance attribute: this group only
        self.original_wait = type(g).wait_for_unshard.__get__(g)
        return True

    def unwrap(self) -> None:
        for comm in self.wrapped:
            base = type(comm).__dict__.get("_ranksight_base")
            if base is not None:
                comm.__class__ = base
            comm.__dict__.pop("_ranksight_hooks", None)
        self.wrapped = []
        self.group.__dict__.pop("wait_for_unshard", None)

    def _off(self, exc: BaseException) -> None:
        self.m._fail("fsdp_timing", exc)
        self.unwrap()

    def all_gather(self, call, comm, args, kwargs):
        m = self.m
        if not m._active or m._is_compiling():
            return call(comm, *args, **kwargs)
        gpu = m._gpu
        ev0 = _gpu_begin(m, gpu)  # None on FSDP2's all-gather stream: only the compute stream's hold counts
        begin = perf_counter_ns()
        with self.no_timing:
            out = call(comm, *args, **kwargs)
        end = perf_counter_ns()
        try:
            nbytes = self.ag_bytes
            if not nbytes:  # a unit's all-gather output has the same size every time: read it once
                output = kwargs["output_tensor"] if "output_tensor" in kwargs else args[0]
                nbytes = self.ag_bytes = output.numel() * output.element_size()
            backward = self.group._training_state is _PRE_BACKWARD
            self.pending = (begin, end - begin, backward, nbytes, out)
            if ev0 is not None:
                gpu.collective_end(m._step, ev0)
            self.recorder.maybe_snapshot(m._step)
        except Exception as exc:
            self._off(exc)
        return out

    def wait_for_unshard(self):
        pending, m = self.pending, self.m
        if pending is None or not m._active:
            return self.original_wait()
        self.pending = None
        gpu = m._gpu
        ev0 = None
        if gpu is not None:
            try:
                ev0 = gpu.collective_begin()
            except Exception as exc:
                m._reporter.count("collective_gpu_events", exc)
        begin, held, backward, nbytes, work = pending
        t0 = perf_counter_ns()
        if work is not None:
            with self.no_timing:
                work.wait()  # the rest of an async (prefetched) all-gather: FSDP2's own wait then returns at once
        t1 = perf_counter_ns()
        result = self.original_wait()  # copy-out: memory traffic, not communication
        try:
            step = m._step
            if ev0 is not None:
                gpu.collective_end(step, ev0)
            exposed = held + (t1 - t0)
            op = "all_gather_backward" if backward else "all_gather_forward"
            m._append((EV_COLLECTIVE, step, op, "fsdp", self.label, nbytes, begin, t1, exposed))
            s = self.stats
            s[_AG_BWD if backward else _AG_FWD] += 1
            s[_AG_BYTES] += nbytes
            s[_AG_EXPOSED] += exposed
            s[_AG_SPAN] += max(exposed, t1 - begin) if work is not None else exposed
        except Exception as exc:
            self._off(exc)
        return result

    def reduce_scatter(self, call, comm, args, kwargs):
        m = self.m
        if not m._active or m._is_compiling():
            return call(comm, *args, **kwargs)
        gpu = m._gpu
        ev0 = _gpu_begin(m, gpu)  # None on FSDP2's reduce-scatter stream
        begin = perf_counter_ns()
        with self.no_timing:
            out = call(comm, *args, **kwargs)
        end = perf_counter_ns()
        try:
            inp = kwargs["input_tensor"] if "input_tensor" in kwargs else args[1]
            nbytes = inp.numel() * inp.element_size()
            step = m._step
            if ev0 is not None:
                gpu.collective_end(step, ev0)
            m._append((EV_COLLECTIVE, step, "reduce_scatter", "fsdp", self.label, nbytes, begin, end, end - begin))
            s = self.stats
            s[_RS_N] += 1
            s[_RS_BYTES] += nbytes
            s[_RS_HELD] += end - begin
        except Exception as exc:
            self._off(exc)
        return out


def attach_fsdp(m: Any, module: Any) -> Optional[_Recorder]:
    """Wrap the FSDP2 units of ``module`` (see the module docstring); None when there is nothing to wrap
    (no FSDP2, or a torch whose FSDP2 has no per-group comm objects: the generic timing covers it)."""
    global _PRE_BACKWARD
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    except ImportError:
        return None
    _PRE_BACKWARD = TrainingState.PRE_BACKWARD
    recorder = _Recorder(m, module)
    for name, mod in fsdp_modules(module):
        for group in _groups(mod):
            hooks = _UnitHooks(recorder, name, group)
            if hooks.wrap():
                recorder.units.append(hooks)
    # Rows per step carry the unit (at most MAX_UNIT_SLOTS slots of consecutive units), so the diagnosis can
    # match one call across ranks (its floor is the wait of the rank that arrived last).
    n = len(recorder.units)
    per_slot = max(1, math.ceil(n / MAX_UNIT_SLOTS))
    for i, u in enumerate(recorder.units):
        lo = i // per_slot * per_slot
        slot = u.name if per_slot == 1 else f"units {lo}-{min(n, lo + per_slot) - 1}"
        u.label = f"{u.label}|{slot}"
    if not recorder.units:
        return None
    recorder.watch_settings()
    return recorder
