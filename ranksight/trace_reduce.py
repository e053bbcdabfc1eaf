"""Reduce a profiler window to the kernel-level sample names (pure: no torch, no I/O).

Shared by the agent's sampled window (``ranksight.agent``) and the trace importer
(``ranksight import``, in ``ranksight.importer``): one definition of each ratio for both.

Input is a flat list of :class:`Ev` tuples, built either from a live profiler result
(``_trace_window.events_from_kineto``) or from an exported Chrome trace (:func:`events_from_chrome`),
so the same code runs in the agent and on recorded traces in tests.

Definitions follow Holistic Trace Analysis (HTA): shares are unions of intervals over a span, so
overlapping kernels on several streams are not double counted; idle = span − |∪ GPU activity|;
overlap = |∪compute ∩ ∪comm| / |∪comm|.

The window is marked by the agent with CPU annotations: ``ranksight#window`` around each traced step,
``ranksight#after`` around the step(s) that ran while the profiler waited for the GPU to finish.
The GPU span runs from the first GPU activity launched in the first window step to the first one
launched after the window (else the last one's end), so it covers whole GPU steps, including the
idle gap between them.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import NamedTuple, Optional

WINDOW_MARK = "ranksight#window"
AFTER_MARK = "ranksight#after"

# Runtime calls that block the host until the GPU catches up (a host sync).
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)

# Runtime and driver calls by which the caching allocator takes memory from, or gives it back to, the
# device. Past warm-up a job whose cache fits never makes them; under memory pressure the allocator frees
# cached blocks (``cudaFree`` waits for the device to finish) and allocates again, step after step.
ALLOC_CALLS = frozenset(
    {
        "cudaMalloc",
        "cudaFree",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemCreate",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemRelease",
        "cuMemSetAccess",
        "cuMemAddressReserve",
        "cuMemAddressFree",
    }
)

# Aten ops that only touch tensor metadata: on any device they launch nothing and cost ~1 µs, so
# they are never "work left on the CPU".
METADATA_OPS = frozenset(
    "aten::" + n
    for n in (
        "view _unsafe_view reshape _reshape_alias t transpose permute expand expand_as as_strided select slice "
        "unsqueeze squeeze flatten unflatten narrow split chunk unbind detach detach_ alias empty empty_like "
        "empty_strided resize_ contiguous lift_fresh is_same_size _has_compatible_shallow_copy_type result_type "
        "size stride numel dim is_nonzero set_ to _to_copy clone view_as new_empty new_empty_strided "
        "record_stream _local_scalar_dense item zeros_like_meta"
    ).split()
)


class Ev(NamedTuple):
    """One trace event, device-neutral: times in ns on one clock."""

    kind: str  # op | rt (CUDA runtime/driver call) | kernel | memcpy | memset | ann (CPU annotation)
    name: str
    start_ns: int
    end_ns: int
    lane: int  # CPU thread id, or GPU stream id
    corr: int  # correlation id linking a runtime call to the GPU activity it launched (0 if none)


ACTIVITY_KIND = {  # profiler category (Kineto activity type / Chrome "cat") -> Ev kind
    "cpu_op": "op",
    "cuda_runtime": "rt",
    "cuda_driver": "rt",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "user_annotation": "ann",
}


def events_from_chrome(trace: dict) -> list[Ev]:
    """Normalise a Chrome trace (``torch.profiler`` export) into :class:`Ev` tuples."""
    out = []
    for e in trace.get("traceEvents", ()):
        if e.get("ph") != "X":
            continue
        kind = ACTIVITY_KIND.get(e.get("cat", ""))
        if kind is None:
            continue
        start = int(round(float(e["ts"]) * 1000))
        end = start + int(round(float(e.get("dur", 0)) * 1000))
        args = e.get("args") or {}
        lane = e.get("tid", 0)
        try:
            lane = int(lane)
        except (TypeError, ValueError):
            lane = hash(lane)
        out.append(Ev(kind, e.get("name", ""), start, end, lane, int(args.get("correlation", 0) or 0)))
    return out


__all__ = [
    "ACTIVITY_KIND",
    "AFTER_MARK",
    "LOADER_MARK",
    "METADATA_OPS",
    "SYNC_CALLS",
    "ALLOC_CALLS",
    "WINDOW_MARK",
    "Ev",
    "WindowReduction",
    "clip_intervals",
    "events_from_chrome",
    "intersection_length",
    "is_comm_kernel",
    "possible_gpu_records",
    "reduce_window",
    "total_length",
    "union_intervals",
]


def union_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge intervals into a sorted list of disjoint ones."""
    merged: list[list[int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1][1] = e
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def total_length(merged: list[tuple[int, int]]) -> int:
    """Summed length of disjoint intervals."""
    return sum(e - s for s, e in merged)


def clip_intervals(intervals, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of intervals inside [lo, hi)."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def intersection_length(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the intersection of two disjoint sorted interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_comm_kernel(name: str) -> bool:
    """NCCL kernels (``ncclDevKernel_*``, ``ncclKernel_*``) are communication, as in HTA."""
    return name.lower().startswith("nccl")


class WindowReduction(NamedTuple):
    """What one window says: sample values by name, plus the details that go into event rows."""

    samples: dict[str, float]
    cpu_ops_top: list[tuple[str, float]]  # (op name, CPU seconds per step), largest first
    sync_sources: list[tuple[str, float]]  # (where the sync came from, syncs per step)
    steps: int
    span_ns: int


def reduce_window(events: list[Ev], model_on_gpu: bool = True, top: int = 5) -> Optional[WindowReduction]:
    """Reduce one window's events; None when the trace holds no marked window step."""
    windows = sorted((e.start_ns, e.end_ns) for e in events if e.kind == "ann" and e.name == WINDOW_MARK)
    if not windows:
        return None
    afters = sorted(e.start_ns for e in events if e.kind == "ann" and e.name == AFTER_MARK)
    steps = len(windows)
    cpu_lo = windows[0][0]
    cpu_hi = afters[0] if afters and afters[0] >= windows[-1][1] else windows[-1][1]
    samples: dict[str, float] = {"trace_window_steps": float(steps)}

    launch_by_corr = {e.corr: e for e in events if e.kind == "rt" and e.corr}
    gpu, impossible = possible_gpu_records(
        [e for e in events if e.kind in ("kernel", "memcpy", "memset")], launch_by_corr
    )
    if impossible:
        samples["impossible_gpu_records"] = float(impossible)

    def launched_at(e: Ev) -> int:
        rt = launch_by_corr.get(e.corr)
        return rt.start_ns if rt is not None else e.start_ns

    in_window = [e for e in gpu if cpu_lo <= launched_at(e) < cpu_hi]
    after = [e for e in gpu if launched_at(e) >= cpu_hi]
    span_ns = 0
    if in_window:
        lo = min(e.start_ns for e in in_window)
        hi = min(e.start_ns for e in after) if after else max(e.end_ns for e in in_window)
        hi = max(hi, lo)
        span_ns = hi - lo
    sync_calls = _runtime_calls(events, SYNC_CALLS, cpu_lo, cpu_hi)
    aten_sources = _enclosing_ops(events, sync_calls, aten_only=True)
    if span_ns > 0:
        samples.update(_gpu_shares(gpu, lo, hi, launch_by_corr, sync_calls, aten_sources))
        kernels = [e for e in in_window if e.kind == "kernel"]
        samples["kernels_per_step"] = len(kernels) / steps
        # The GPU's own clock: kernel time of the steps' launches, wherever the host was when they ran.
        kernel_ns = total_length(union_intervals([(e.start_ns, e.end_ns) for e in kernels]))
        samples["kernel_seconds_per_step"] = kernel_ns * 1e-9 / steps
        # Device-to-host copies the steps launched: a loss read is one; ops sent to the CPU make round trips.
        samples["d2h_copies_per_step"] = sum(1 for e in in_window if e.kind == "memcpy" and "DtoH" in e.name) / steps
        launches = [(k, launch_by_corr[k.corr]) for k in kernels if k.corr in launch_by_corr]
        if launches:
            short = sum(1 for k, rt in launches if (k.end_ns - k.start_ns) < (rt.end_ns - rt.start_ns))
            samples["short_kernel_ratio"] = short / len(launches)
            delays = sorted(max(0, k.start_ns - rt.start_ns) for k, rt in launches)
            samples["launch_delay_seconds"] = delays[len(delays) // 2] * 1e-9

    cpu_ops_top: list[tuple[str, float]] = []
    if model_on_gpu:
        # Only inside the traced steps, and not in the DataLoader's own next(): collate between or inside
        # steps runs in the main process (num_workers=0) on CPU tensors by design, and is input work.
        step_span = sum(hi - lo for lo, hi in windows)
        ratio, cpu_ops_top, loader_ns = _cpu_ops(events, windows, steps, top)
        samples["cpu_op_ratio"] = ratio
        samples["loader_cpu_op_ratio"] = loader_ns / step_span if step_span > 0 else 0.0
    syncs = _host_syncs(sync_calls, _enclosing_ops(events, sync_calls))
    h2d_calls = _h2d_copy_calls(gpu, launch_by_corr, cpu_lo, cpu_hi)
    samples["host_syncs_per_step"] = len(sync_calls) / steps
    samples["compiled_syncs_per_step"] = _compiled_syncs(events, sync_calls) / steps
    samples["copy_syncs_per_step"] = _copy_syncs(sync_calls, aten_sources, h2d_calls) / steps
    cpu_span = cpu_hi - cpu_lo
    if cpu_span > 0:
        alloc_calls = _runtime_calls(events, ALLOC_CALLS, cpu_lo, cpu_hi)
        samples["host_sync_wait_share"] = _host_ns(sync_calls) / cpu_span
        samples["sync_op_share"] = _sync_op_ns(sync_calls, aten_sources) / cpu_span
        samples["pageable_copy_host_share"] = _host_ns([rt for rt, pageable in h2d_calls if pageable]) / cpu_span
        samples["alloc_calls_per_step"] = len(alloc_calls) / steps
        samples["alloc_call_share"] = _host_ns(alloc_calls) / cpu_span
    sync_sources = [(name, n / steps) for name, n in syncs.most_common(top)]
    return WindowReduction(samples, cpu_ops_top, sync_sources, steps, span_ns)


def possible_gpu_records(gpu: list[Ev], launch_by_corr: dict) -> tuple[list[Ev], int]:
    """The GPU records that could have happened, and how many could not: one that starts before the host
    call that launched it began. Some CUPTI versions hand back the first records of a later profiling session
    on another clock, a day or more early; kept, one such record stretches the window's span and reads a busy
    GPU as idle, or closes the span before it opens and leaves no kernel-level reading at all."""
    kept = []
    for e in gpu:
        rt = launch_by_corr.get(e.corr)
        if rt is not None and e.start_ns < rt.start_ns - _CLOCK_SLACK_NS:
            continue
        kept.append(e)
    return kept, len(gpu) - len(kept)


def _gpu_shares(
    gpu: list[Ev], lo: int, hi: int, launch_by_corr: dict, sync_calls: list[Ev], sync_sources: list[Optional[Ev]]
) -> dict[str, float]:
    """Union-of-interval shares of the GPU span [lo, hi)."""
    span = hi - lo
    kernels = [(e.start_ns, e.end_ns) for e in gpu if e.kind == "kernel"]
    comm_kernels = [(e.start_ns, e.end_ns) for e in gpu if e.kind == "kernel" and is_comm_kernel(e.name)]
    comp_kernels = [(e.start_ns, e.end_ns) for e in gpu if e.kind == "kernel" and not is_comm_kernel(e.name)]
    comm = union_intervals(clip_intervals(comm_kernels, lo, hi))
    comp = union_intervals(clip_intervals(comp_kernels, lo, hi))
    copies = union_intervals(clip_intervals([(e.start_ns, e.end_ns) for e in gpu if e.kind != "kernel"], lo, hi))
    h2d = [e for e in gpu if e.kind == "memcpy" and "HtoD" in e.name]
    h2d_union = union_intervals(clip_intervals([(e.start_ns, e.end_ns) for e in h2d], lo, hi))
    busy = union_intervals(clip_intervals([(e.start_ns, e.end_ns) for e in gpu], lo, hi))
    out = {
        "kernel_busy_ratio": total_length(union_intervals(clip_intervals(kernels, lo, hi))) / span,
        "compute_kernel_ratio": total_length(comp) / span,
        "comm_kernel_ratio": total_length(comm) / span,
        "memcpy_ratio": total_length(copies) / span,
        "idle_ratio": (span - total_length(busy)) / span,
        "h2d_copy_ratio": total_length(h2d_union) / span,
    }
    if comm:
        out["comm_overlap_ratio"] = intersection_length(comp, comm) / total_length(comm)
    h2d_total = sum(e.end_ns - e.start_ns for e in h2d)
    if h2d_total > 0:
        pageable = sum(e.end_ns - e.start_ns for e in h2d if "Pageable" in e.name)
        out["h2d_pageable_ratio"] = pageable / h2d_total
    # Host wait: a gap in GPU activity whose next activity was launched only after the gap began,
    # i.e. the GPU ran dry because the CPU had not issued the work yet.
    starts = sorted((e.start_ns, e) for e in gpu if lo <= e.start_ns < hi)
    start_keys = [s for s, _ in starts]
    host_wait = 0
    for (_, gap_lo), (gap_hi, _) in zip(busy, busy[1:]):
        i = bisect.bisect_left(start_keys, gap_hi)
        if i < len(starts):
            rt = launch_by_corr.get(starts[i][1].corr)
            if rt is not None and rt.start_ns >= gap_lo:
                host_wait += gap_hi - gap_lo
    out["idle_host_wait_ratio"] = host_wait / span
    out["sync_drain_idle_share"] = _sync_drain_idle_ns(busy, sync_calls, sync_sources) / span
    return out


def _by_lane(events: list[Ev], kind: str) -> dict[int, list[Ev]]:
    lanes: dict[int, list[Ev]] = defaultdict(list)
    for e in events:
        if e.kind == kind:
            lanes[e.lane].append(e)
    for lst in lanes.values():
        lst.sort(key=lambda e: (e.start_ns, -e.end_ns))
    return lanes


LOADER_MARK = "enumerate(DataLoader)"
"""Prefix of the record_function torch's DataLoader wraps each ``next()`` in."""


def _cpu_ops(
    events: list[Ev], spans: list[tuple[int, int]], steps: int, top: int
) -> tuple[float, list[tuple[str, float]], int]:
    """Time in aten ops that launched no GPU work: CPU tensors inside a GPU model's steps.

    An op counts when it starts inside a traced step, no CUDA runtime call happened inside it on its
    thread, it is not a metadata op and it does not run inside the DataLoader's ``next()`` (those are
    returned apart: collate on the main process is input work); nested ops are counted once (the
    outermost qualifying op). Returns (share of the steps' time, top ops per step, loader op ns).
    """
    ops = _by_lane(events, "op")
    rts = _by_lane(events, "rt")
    loader_marks = defaultdict(list)
    for e in events:
        if e.name.startswith(LOADER_MARK):
            loader_marks[e.lane].append((e.start_ns, e.end_ns))
    span_starts = [lo for lo, _ in spans]
    total = loader = 0
    per_name: Counter = Counter()
    for lane, lane_ops in ops.items():
        rt_starts = [r.start_ns for r in rts.get(lane, ())]
        marks = loader_marks.get(lane, ())
        covered_until = -1
        for op in lane_ops:
            if not op.name.startswith("aten::") or op.name in METADATA_OPS or op.start_ns < covered_until:
                continue  # not an op that computes, or inside an op already counted
            j = bisect.bisect_right(span_starts, op.start_ns) - 1
            if j < 0 or op.start_ns >= spans[j][1]:
                continue  # between steps
            i = bisect.bisect_left(rt_starts, op.start_ns)
            if i < len(rt_starts) and rt_starts[i] <= op.end_ns:
                continue  # launched GPU work (or synced): a GPU op
            dur = op.end_ns - op.start_ns
            covered_until = op.end_ns
            if any(lo <= op.start_ns and op.end_ns <= hi for lo, hi in marks):
                loader += dur
                continue
            total += dur
            per_name[op.name] += dur
    step_span = sum(hi - lo for lo, hi in spans)
    ratio = total / step_span if step_span > 0 else 0.0
    return ratio, [(name, ns * 1e-9 / steps) for name, ns in per_name.most_common(top)], loader


def _runtime_calls(events: list[Ev], names: frozenset, lo: int, hi: int) -> list[Ev]:
    """The runtime calls named ``names`` that start in [lo, hi)."""
    return [e for e in events if e.kind == "rt" and e.name in names and lo <= e.start_ns < hi]


def _host_ns(calls: list[Ev]) -> int:
    """Host time inside ``calls``."""
    return sum(e.end_ns - e.start_ns for e in calls)


COMPILED_REGION = "Torch-Compiled Region"
"""Prefix of the record_function torch.compile wraps each compiled frame's run in (graphs and the eager
code between them)."""


def _compiled_syncs(events: list[Ev], sync_calls: list[Ev]) -> int:
    """Of ``sync_calls``, those inside a compiled frame's run: a compiled graph does not sync, so such a sync
    is the eager code at a graph break (a Python ``if`` on a tensor, ``.item()`` in forward)."""
    regions: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.kind in ("ann", "op") and e.name.startswith(COMPILED_REGION):
            regions[e.lane].append((e.start_ns, e.end_ns))
    return sum(any(a <= e.start_ns and e.end_ns <= b for a, b in regions.get(e.lane, ())) for e in sync_calls)


def _enclosing_ops(events: list[Ev], calls: list[Ev], aten_only: bool = False) -> list[Optional[Ev]]:
    """For each of ``calls``, the outermost op on its thread that encloses it (None: called from Python).

    ``aten_only``: the outermost aten op (``aten::item``, ``aten::to``), not a frame around it (a compiled
    region, an autograd node, a module), whose time is the whole frame's rather than the sync's."""
    ops = _by_lane(events, "op")
    found: list[Optional[Ev]] = []
    for e in calls:
        source = None
        for op in ops.get(e.lane, ()):
            if op.start_ns > e.start_ns:
                break
            if aten_only and not op.name.startswith("aten::"):
                continue
            if op.end_ns >= e.end_ns:
                source = op  # the first (outermost) op that encloses the call
                break
        found.append(source)
    return found


def _host_syncs(sync_calls: list[Ev], sources: list[Optional[Ev]]) -> Counter:
    """Count ``sync_calls`` (blocking runtime calls), keyed by the outermost aten op around each."""
    return Counter(f"{op.name if op else 'python'} ({e.name})" for e, op in zip(sync_calls, sources))


def _h2d_copy_calls(gpu: list[Ev], launch_by_corr: dict, lo: int, hi: int) -> list[tuple[Ev, bool]]:
    """The runtime calls in [lo, hi) that copied host memory to the device, each with whether the source
    was pageable (the GPU activity says ``Pageable``: the host stages it and waits for the copy)."""
    pageable_by_corr: dict[int, bool] = {}
    for e in gpu:
        if e.kind == "memcpy" and e.corr in launch_by_corr and "HtoD" in e.name:
            pageable_by_corr[e.corr] = pageable_by_corr.get(e.corr, False) or "Pageable" in e.name
    calls = (launch_by_corr[corr] for corr in pageable_by_corr)
    return [(rt, pageable_by_corr[rt.corr]) for rt in calls if lo <= rt.start_ns < hi]


def _copy_syncs(sync_calls: list[Ev], sources: list[Optional[Ev]], h2d_calls: list[tuple[Ev, bool]]) -> int:
    """Of ``sync_calls``, those that end a blocking copy of a batch to the device (``x.to(device)`` without
    ``non_blocking``): the op around the sync also copied host memory in, or the sync is that copy."""
    h2d = [rt for rt, _ in h2d_calls]
    found = 0
    for e, op in zip(sync_calls, sources):
        lo, hi = (op.start_ns, op.end_ns) if op is not None else (e.start_ns, e.end_ns)
        found += any(rt.lane == e.lane and lo <= rt.start_ns and rt.end_ns <= hi for rt in h2d)
    return found


def _sync_drain_idle_ns(busy: list[tuple[int, int]], sync_calls: list[Ev], sources: list[Optional[Ev]]) -> int:
    """GPU idle after the syncs that waited for it: the gap the host returns into, from the end of the last
    GPU activity before the sync returned to the next one, which the host could only launch afterwards.
    A sync waited when that last activity ended after the op around it (``.item()``, ``nonzero``) began:
    an ``.item()`` into pageable memory waits inside its copy call, and the stream sync after it then finds
    the GPU idle. A sync whose op began with the GPU already idle (the host sets the pace) drains nothing;
    its cost is the host's own time in it. ``busy``: the GPU's merged activity in the window span."""
    starts = [a for a, _ in busy]
    drained: set[int] = set()  # index of the busy interval the drained gap follows, counted once
    for e, op in zip(sync_calls, sources):
        began = op.start_ns if op is not None else e.start_ns
        j = bisect.bisect_right(starts, e.end_ns) - 1
        if j < 0 or j + 1 >= len(busy) or busy[j][1] <= began:
            continue  # nothing ran on the GPU while the host waited, or nothing followed in the window
        if busy[j][1] > e.end_ns + _CLOCK_SLACK_NS:
            continue  # returned while the GPU still ran (an event wait on another stream)
        drained.add(j)
    return sum(busy[j + 1][0] - busy[j][1] for j in drained)


_CLOCK_SLACK_NS = 20_000
"""How far a GPU activity's end may read after the host call that waited for it (the two clocks' skew)."""


def _sync_op_ns(sync_calls: list[Ev], sources: list[Optional[Ev]]) -> int:
    """Host time inside the ops that synced (``.item()``, ``nonzero``, ``.cpu()``: the wait, the copy
    back and the op's own work), each op once; a sync called outside any op counts its own time."""
    spans = [
        (op.start_ns, op.end_ns) if op is not None else (e.start_ns, e.end_ns) for e, op in zip(sync_calls, sources)
    ]
    return total_length(union_intervals(spans))
