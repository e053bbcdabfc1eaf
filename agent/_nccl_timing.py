"""Each NCCL collective's GPU time (``collectives.gpu_s``), from NCCL's own events, with no Python
callback per collective.

Why this source. On NCCL the host learns nothing about a collective's GPU time: ``Work`` objects of
DDP's buckets never reach Python (a Python comm hook per bucket cost 1.3-2.8 % of a step), and CUDA
events around a Python call on the caller's stream measure how long that stream was held, not the
collective (a barrier's 10 µs kernel held its stream 0.4 ms on an H200: launch latency and the host's
wait). PyTorch already keeps what is needed:

- with ``TORCH_NCCL_ENABLE_TIMING`` (or ``ProcessGroup._enable_collectives_timing()``, switched on
  here for every existing group) ProcessGroupNCCL records a start event before each NCCL call on the
  NCCL stream, next to the end event it always records;
- its flight recorder (on by default since torch 2.5; ``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps the last
  2,000 collectives, and its watchdog fills each one's ``duration_ms`` from those two events once the
  collective completed, off every Python thread;
- ``_dump_nccl_trace`` hands the ring to Python: every collective with its ``profiling_name``, sizes,
  dtypes, process group and ``time_created_ns`` (the wall clock when it was issued).

So on the agent thread a flush reads the ring (every ``nccl_timing_every_s``; one read copies the
whole ring and holds the GIL for it, so it is rationed) and gives each finished step's collectives their
GPU time: an entry issued inside a timed Python call (``_collectives`` stamps each call's start with the
same wall clock) adds to that call's row; one issued inside the step but outside any call (DDP's bucket
all-reduces, from the autograd thread) makes an ``all_reduce`` row of origin ``ddp``. A step is filled
only if the ring still held its first collective and every collective in it had its duration; otherwise
its ``gpu_s`` stays NULL (unknown), never a partial sum.

Requires torch >= 2.4 (the flight recorder's dump with durations); on an older torch, a build without
NCCL, or with the flight recorder off, ``gpu_s`` stays NULL and one warning says why.
"""

from __future__ import annotations

import os
import pickle
import time
from bisect import bisect_right
from typing import Any, Callable, Optional

# Element sizes for the flight recorder's dtype names (c10::toString of the scalar type).
_DTYPE_BYTES = {
    "Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}  # fmt: skip
# ProcessGroupNCCL's profiling names (after "nccl:") -> the torch.distributed op a user would call.
_OP_NAMES = {
    "_allgather_base": "all_gather_into_tensor",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "all_reduce_barrier": "barrier",
    "alltoall_base": "all_to_all_single",
    "all_to_all": "all_to_all",
}
# How far a call's start, converted from the monotonic clock, may sit from the wall clock (calls that
# came without a wall stamp: another recorder's rows). A wall-stamped call is matched exactly.
_UNSTAMPED_SLACK_NS = 200_000


def op_name(profiling_name: str) -> str:
    """``nccl:_allgather_base`` -> ``all_gather_into_tensor``; unknown names keep their own."""
    name = profiling_name.split(":", 1)[-1]
    return _OP_NAMES.get(name, name)


def entry_bytes(entry: dict) -> int:
    """Bytes of the collective's input tensors, from the recorder's sizes and dtypes."""
    total = 0
    for sizes, dtype in zip(entry.get("input_sizes") or (), entry.get("input_dtypes") or ()):
        n = 1
        for s in sizes:
            n *= int(s)
        total += n * _DTYPE_BYTES.get(dtype, 0)
    return total


def _group(entry: dict) -> str:
    pg = entry.get("process_group") or ("0", "default_pg")
    desc = pg[1] if len(pg) > 1 else pg[0]
    return "default" if desc in ("default_pg", "") else str(desc)


def fill_gpu_times(
    spans: list, entries: list[dict], offset_ns: int, ddp: bool, stats: Optional[dict] = None
) -> list[dict]:
    """Give each finished step's collective rows their GPU time from flight-recorder entries.

    ``spans``: ``(step, begin_ns, end_ns, calls, rows)`` per step (monotonic ns; ``calls`` as the
    assembler keeps them, a wall-clock start as their eighth item when the call was stamped); ``entries``:
    the recorder's, oldest first; ``offset_ns``: wall minus monotonic clock now. ``rows`` are filled in
    place; the rows of collectives no call issued are returned (origin ``ddp`` when ``ddp``, else
    ``torch``). A pure function of its inputs, so recorded dumps replay in tests.
    """
    added: list[dict] = []
    if not entries:
        return added
    created = [e.get("time_created_ns", 0) for e in entries]
    first_kept = created[0] if entries[0].get("record_id", 0) != 0 else None  # None: nothing overwritten yet
    stats = stats if stats is not None else {}
    for step, begin_ns, end_ns, calls, rows in spans:
        lo, hi = begin_ns + offset_ns, end_ns + offset_ns
        windows = []
        for c in calls:
            if len(c) > 7 and c[7]:
                start, slack = c[7], 0
            else:
                start, slack = c[4] + offset_ns, _UNSTAMPED_SLACK_NS
            windows.append((start - slack, start + (c[5] - c[4]) + slack, (c[0], c[1], c[2])))
            lo = min(lo, start - slack)
            hi = max(hi, start + (c[5] - c[4]) + slack)
        if first_kept is not None and first_kept > lo:
            stats["not_covered"] = stats.get("not_covered", 0) + 1
            continue  # the ring no longer holds the step's first collectives
        mine = entries[bisect_right(created, lo - 1) : bisect_right(created, hi)]
        if not mine:
            continue
        if any(e.get("duration_ms") is None for e in mine):
            stats["incomplete"] = stats.get("incomplete", 0) + 1
            continue  # not finished on the GPU yet, or issued before timing was on
        sums: dict[tuple, list] = {}
        for e in mine:
            t = e.get("time_created_ns", 0)
            key, start = None, None
            for w_lo, w_hi, k in windows:
                # The containing call that started last: a call's window can hold another's issue (an
                # FSDP2 all-gather recorded from issue to wait holds the next unit's prefetch).
                if w_lo <= t <= w_hi and (start is None or w_lo > start):
                    key, start = k, w_lo
            if key is None:
                name = op_name(str(e.get("profiling_name", "")))
                key = ("all_reduce" if ddp and name == "all_reduce" else name, "ddp" if ddp else "torch", _group(e))
            agg = sums.setdefault(key, [0, 0, 0.0])
            agg[0] += 1
            agg[1] += entry_bytes(e)
            agg[2] += float(e["duration_ms"]) * 1e-3
        by_key = {(r["op"], r["origin"], r["process_group"]): r for r in rows}
        for key, (n, nbytes, gpu_s) in sums.items():
            row = by_key.get(key)
            if row is None:
                row = {"step": step, "op": key[0], "origin": key[1], "process_group": key[2], "count": n,
                       "bytes": nbytes, "blocked_s": None, "busy_s": None, "gpu_s": 0.0}  # fmt: skip
                by_key[key] = row
                added.append(row)
            row["gpu_s"] = (row.get("gpu_s") or 0.0) + gpu_s
        stats["timed"] = stats.get("timed", 0) + 1
    return added


class NcclTimes:
    """``Assembler.collective_gpu`` on an NCCL rank: reads the flight recorder when due and fills rows."""

    def __init__(
        self,
        monitor: Any,
        dump: Callable[[], bytes],
        every_s: float,
        ddp: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._m = monitor
        self._dump = dump
        self.every_s = every_s
        self.ddp = ddp
        self._clock = clock
        self._last = float("-inf")
        self.dumps_total = 0
        self.dump_seconds_total = 0.0
        self.stats: dict = {}
        self._empty_dumps = 0

    def __call__(self, spans: list) -> list[dict]:
        now = self._clock()
        if now - self._last < self.every_s:
            return []
        self._last = now
        try:
            t0 = time.perf_counter()
            raw = self._dump()
            entries = pickle.loads(raw).get("entries") or []  # PyTorch's own in-process dump
            self.dump_seconds_total += time.perf_counter() - t0
            self.dumps_total += 1
            if not entries and any(s[3] for s in spans):
                self._empty_dumps += 1
                if self._empty_dumps >= 3:  # collectives ran, the recorder kept none: it is off
                    self._m._warn_once(
                        "nccl_timing",
                        "NCCL's flight recorder keeps no entries (TORCH_NCCL_TRACE_BUFFER_SIZE=0?): "
                        "collectives.gpu_s stays NULL",
                    )
                    self.every_s = float("inf")
                return []
            offset = time.time_ns() - time.perf_counter_ns()
            added = fill_gpu_times(spans, entries, offset, self.ddp, self.stats)
            if not self.stats.get("timed") and self.stats.get("incomplete", 0) >= 50:
                # Steps keep collectives without a duration: their group was made before timing was on.
                self._m._warn_once(
                    "nccl_timing",
                    "NCCL collectives carry no GPU duration (set TORCH_NCCL_ENABLE_TIMING=1 before "
                    "init_process_group): collectives.gpu_s stays NULL",
                )
                self.every_s = float("inf")
            return added
        except Exception as exc:
            self.every_s = float("inf")
            self._m._fail("nccl_timing", exc)
            return []


def _dump_function(torch: Any) -> Optional[Callable[[], bytes]]:
    c10d = getattr(torch._C, "_distributed_c10d", None)
    fn = getattr(c10d, "_dump_nccl_trace", None)
    if fn is None:
        return None

    def dump() -> bytes:
        try:
            return fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        except TypeError:  # an older signature without keywords
            return fn(True, False, False)

    return dump


def attach_nccl_timing(monitor: Any, torch: Any, *, ddp: bool, every_s: float) -> Optional[NcclTimes]:
    """Switch NCCL's collective timing on and hook the reader into the monitor's assembler; None (and one
    warning where it matters) when the rank does not run NCCL or this torch cannot say."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        backend = str(dist.get_backend())
    except Exception:
        return None
    if "nccl" not in backend:
        return None  # gloo: the host's blocked time is the truth there
    dump = _dump_function(torch)
    assembler = getattr(getattr(monitor, "_worker", None), "_assembler", None)
    if dump is None or assembler is None:
        monitor._warn_once(
            "nccl_timing", f"torch {torch.__version__} has no NCCL flight recorder dump: collectives.gpu_s stays NULL"
        )
        return None
    # Groups made from now on (a device mesh after watch()) read the variable when they are created.
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    c10d = dist.distributed_c10d
    groups = list(getattr(getattr(c10d, "_world", None), "pg_map", {}) or ()) or [c10d._get_default_group()]
    enabled = 0
    for pg in groups:
        fn = getattr(pg, "_enable_collectives_timing", None)
        if fn is not None:
            try:
                fn()
                enabled += 1
            except Exception:
                pass
    if not enabled and os.environ.get("TORCH_NCCL_ENABLE_TIMING") != "1":
        monitor._warn_once("nccl_timing", "cannot switch NCCL collective timing on: collectives.gpu_s stays NULL")
        return None
    times = NcclTimes(monitor, dump, every_s, ddp)
    assembler.collective_gpu = times
    return times
