"""One profiled step of a Kineto trace -> the step, bucket and collective rows the agent writes (pure).

The phases follow the agent's own definitions (``agent/_assemble.py``), read off the trace instead of
hot-path marks, so a run imported from ``torch.profiler`` reads like one the agent recorded:

    step          ``ProfilerStep#N`` (``prof.step()`` to the next one: the batch fetch plus the step body)
    data_wait     the DataLoader's ``enumerate(DataLoader)#...__next__`` spans inside the step
    compute       forward start (``DistributedDataParallel.forward`` or the first computing aten op after
                  the fetch) to the last gradient bucket's all-reduce issue inside backward (no DDP: to
                  ``Optimizer.step#``), less the blocking collectives and fetches inside it
    comm_exposed  last bucket issued to its all-reduce done (the ``gloo:*`` span on gloo's thread), cut
                  at the optimizer's start
    comm_blocked  collectives the training thread called itself (not from backward), issue to done
    optimizer     ``Optimizer.step#...`` spans
    other         the rest

On a GPU trace the same marks bound the GPU's side, read on the GPU's clock as the agent's CUDA events
do: the step's GPU span (its activities, by the launch that issued them), the gap before it, host-to-
device copies, compute, exposed NCCL time (HTA's overlap: comm kernels not overlapped by compute) and
the optimizer's GPU time; the kernel-level ratios come from ``ranksight.trace_reduce.reduce_window``,
the agent's sampled window, applied to each step.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple, Optional

from ranksight.format.phases import host_other
from ranksight.trace_reduce import (
    LOADER_MARK,
    METADATA_OPS,
    WINDOW_MARK,
    Ev,
    clip_intervals,
    is_comm_kernel,
    possible_gpu_records,
    reduce_window,
    total_length,
    union_intervals,
)

_NS = 1e-9
GPU_KINDS = frozenset({"kernel", "memcpy", "memset"})
FORWARD_MARKS = ("DistributedDataParallel.forward", "FullyShardedDataParallel.forward", "## forward ##")
"""Annotations torch puts around a wrapped model's forward (DDP, FSDP1) and Lightning's forward mark."""
OPTIMIZER_MARK = "Optimizer.step#"
AUTOGRAD_MARK = "autograd::engine::evaluate_function"
_NOT_FORWARD = METADATA_OPS | {"aten::copy_", "aten::pin_memory", "aten::_pin_memory", "aten::randn", "aten::normal_"}
"""Ops that may run between the fetch and forward without being forward (moving the batch, noise)."""


class TraceEvent(NamedTuple):
    """A :class:`ranksight.trace_reduce.Ev` (same fields first, so ``reduce_window`` reads it) plus the
    tensor bytes of a collective, when the trace recorded shapes."""

    kind: str
    name: str
    start_ns: int
    end_ns: int
    lane: int
    corr: int
    nbytes: Optional[int] = None


class StepSpan(NamedTuple):
    """One ``ProfilerStep#N`` mark: its number, host span and the training thread it ran on."""

    step: int
    start_ns: int
    end_ns: int
    lane: int


class StepReduction(NamedTuple):
    """What one step of a trace says: rows for each record kind, minus the identity columns."""

    step: dict
    buckets: list[dict]
    collectives: list[dict]
    samples: dict[str, float]
    gpu_end_ns: Optional[int]  # where the step's GPU work ended, for the next step's gap


def _spans(events: list[TraceEvent], lo: int, hi: int) -> list[tuple[int, int]]:
    return union_intervals(clip_intervals([(e.start_ns, e.end_ns) for e in events], lo, hi))


def _inside(point: int, merged: list[tuple[int, int]]) -> bool:
    i = bisect.bisect_right(merged, (point, float("inf"))) - 1
    return i >= 0 and merged[i][0] <= point < merged[i][1]


def _collective_op(name: str) -> str:
    """``c10d::allreduce_`` -> ``all_reduce``, as the agent names the op in ``collectives`` rows."""
    op = name.split("::", 1)[-1].rstrip("_")
    return {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter"}.get(op, op)


def reduce_step(
    span: StepSpan, events: list[TraceEvent], prev_gpu_end_ns: Optional[int], wall_offset_ns: int
) -> StepReduction:
    """Reduce one profiled step's events (host events inside its span, GPU events it launched)."""
    s0, s1, main = span.start_ns, span.end_ns, span.lane
    step_ns = s1 - s0
    host = [e for e in events if e.kind not in GPU_KINDS]
    on_main = sorted((e for e in host if e.lane == main), key=lambda e: (e.start_ns, -e.end_ns))

    loader = _spans([e for e in on_main if e.name.startswith(LOADER_MARK)], s0, s1)
    data_ns = total_length(loader) if loader else None
    opt = _spans([e for e in on_main if e.name.startswith(OPTIMIZER_MARK)], s0, s1)
    opt_b, opt_e = (opt[0][0], opt[-1][1]) if opt else (None, None)
    boundary = opt_b if opt_b is not None else s1

    fwd = next((e.start_ns for e in on_main if e.name.startswith(FORWARD_MARKS) and e.start_ns < boundary), None)
    if fwd is None:  # a bare model: forward starts with the first computing op after the fetch
        fwd = next(
            (
                e.start_ns
                for e in on_main
                if e.kind == "op"
                and e.name.startswith("aten::")
                and e.name not in _NOT_FORWARD
                and not _inside(e.start_ns, loader)
                and e.start_ns < boundary
            ),
            None,
        )

    # Collectives: those issued from inside backward (an autograd function: DDP's bucket hook) are
    # gradient buckets; the others the training thread called and waited for itself.
    autograd = union_intervals([(e.start_ns, e.end_ns) for e in host if e.name.startswith(AUTOGRAD_MARK)])
    c10d = sorted((e for e in host if e.kind == "op" and e.name.startswith("c10d::")), key=lambda e: e.start_ns)
    bucket_calls = [e for e in c10d if _inside(e.start_ns, autograd)]
    user_calls = [e for e in c10d if e.lane == main and not _inside(e.start_ns, autograd)]
    # gloo runs each collective on its own thread, in issue order: its gloo:<op> span ends when it is done.
    gloo = sorted((e for e in host if e.name.startswith("gloo:") and e.lane != main), key=lambda e: e.start_ns)
    done_by_call: dict[int, int] = {}
    gloo_by_call: dict[int, TraceEvent] = {}
    pool = list(gloo)
    for call in sorted(bucket_calls + user_calls, key=lambda e: e.start_ns):
        j = next((k for k, g in enumerate(pool) if g.start_ns >= call.start_ns), None)
        if j is not None:
            gloo_by_call[id(call)] = g = pool.pop(j)
            done_by_call[id(call)] = g.end_ns

    bytes_by_call = {id(c): _call_bytes(c, gloo_by_call.get(id(c)), host) for c in bucket_calls + user_calls}
    exposed_ns = allreduce_ns = None
    buckets: list[dict] = []
    if bucket_calls:
        # A bucket is ready when DDP's hook runs: right after the gradient was copied into it (the hook's
        # own Python, before it issues the all-reduce, is already the wait), as the agent marks it.
        ready = [_ready_ns(c, host, autograd) for c in bucket_calls]
        last_ready = min(max(ready), boundary)
        dones = [done_by_call.get(id(c), c.end_ns) for c in bucket_calls]
        last_done = min(max(dones), boundary)
        exposed_ns = max(0, last_done - last_ready)
        allreduce_ns = sum(max(0, d - r) for r, d in zip(ready, dones))
        compute_end = last_ready
        for i, (c, r, d) in enumerate(zip(bucket_calls, ready, dones)):
            buckets.append(
                {
                    "step": span.step,
                    "bucket": i,
                    "bytes": bytes_by_call[id(c)],
                    "ready_s": (r - s0) * _NS,
                    "allreduce_s": max(0, d - r) * _NS,
                    "is_last": i == len(bucket_calls) - 1,
                }
            )
    else:
        compute_end = boundary

    blocked = []
    for c in user_calls:
        end = max(c.end_ns, done_by_call.get(id(c), c.end_ns))
        blocked.append((c, max(c.start_ns, s0), min(end, s1)))
    blocked_ns = sum(max(0, e - b) for _, b, e in blocked)
    compute_ns = None
    if fwd is not None:
        inside = union_intervals([(b, e) for _, b, e in blocked] + loader)
        compute_ns = max(0, compute_end - fwd) - total_length(clip_intervals(inside, fwd, compute_end))
    optimizer_ns = (opt_e - opt_b) if opt_b is not None else None

    collectives = _collective_rows(span.step, blocked, bucket_calls, allreduce_ns, bytes_by_call)
    bucket_bytes = _sum_known([bytes_by_call[id(c)] for c in bucket_calls])
    user_bytes = _sum_known([bytes_by_call[id(c)] for c in user_calls])
    row = {
        "step": span.step,
        "time_ns": s1 + wall_offset_ns,
        "step_s": step_ns * _NS,
        "data_wait_s": data_ns * _NS if data_ns is not None else None,
        "h2d_s": None,
        "compute_s": compute_ns * _NS if compute_ns is not None else None,
        "comm_exposed_s": exposed_ns * _NS if exposed_ns is not None else None,
        "allreduce_s": allreduce_ns * _NS if allreduce_ns is not None else None,
        "optimizer_s": optimizer_ns * _NS if optimizer_ns is not None else None,
        "other_s": host_other(step_ns, data_ns, compute_ns, exposed_ns, blocked_ns, optimizer_ns) * _NS,
        "buckets": len(bucket_calls) or None,
        "bucket_bytes": bucket_bytes,
        "comm_blocked_s": blocked_ns * _NS,
        "collectives": len(user_calls),
        "collective_bytes": user_bytes if user_calls else 0,
        "data_wait_in_step_s": None,
    }

    launches = {e.corr: e for e in host if e.kind == "rt" and e.corr}
    gpu, impossible = possible_gpu_records([e for e in events if e.kind in GPU_KINDS], launches)
    samples: dict[str, float] = {}
    gpu_end = None
    if gpu:
        gpu_end = _gpu_phases(row, gpu, launches, fwd, opt_b, boundary, prev_gpu_end_ns)
        marked = [*events, Ev("ann", WINDOW_MARK, s0, s1, main, 0)]
        red = reduce_window(marked, model_on_gpu=True)
        if red is not None:
            samples = dict(red.samples)
            samples.pop("trace_window_steps", None)
    if impossible:  # also where every record of the step was one: the import says how many it left out
        samples["impossible_gpu_records"] = float(impossible)
    return StepReduction(row, buckets, collectives, samples, gpu_end)


def _gpu_phases(
    row: dict,
    gpu: list[TraceEvent],
    launches: dict,
    fwd: Optional[int],
    opt_b: Optional[int],
    boundary: int,
    prev_end,
) -> int:
    """Fill the GPU columns of a step row on the GPU's clock (``launches``: the runtime call of each
    correlation id); return where the step's GPU work ended."""

    def launched(e: Ev) -> int:
        rt = launches.get(e.corr)
        return rt.start_ns if rt is not None else e.start_ns

    g_lo = min(e.start_ns for e in gpu)
    g_hi = max(e.end_ns for e in gpu)
    row["gpu_step_s"] = (g_hi - g_lo) * _NS
    row["gpu_gap_s"] = max(0, g_lo - prev_end) * _NS if prev_end is not None else None
    h2d = _spans([e for e in gpu if e.kind == "memcpy" and "HtoD" in e.name], g_lo, g_hi)
    row["h2d_s"] = total_length(h2d) * _NS
    opt_start = None
    if opt_b is not None:
        opt_start = min((e.start_ns for e in gpu if launched(e) >= opt_b), default=None)
        row["gpu_optimizer_s"] = (g_hi - opt_start) * _NS if opt_start is not None else 0.0
    body_end = opt_start if opt_start is not None else g_hi
    comm = _spans([e for e in gpu if e.kind == "kernel" and is_comm_kernel(e.name)], g_lo, body_end)
    comp = _spans([e for e in gpu if e.kind != "memcpy" and not is_comm_kernel(e.name)], g_lo, body_end)
    exposed = union_intervals(_minus(comm, comp))
    row["gpu_comm_exposed_s"] = total_length(exposed) * _NS if comm else None
    if fwd is not None:
        started = [e for e in gpu if launched(e) >= fwd and launched(e) < boundary and not is_comm_kernel(e.name)]
        if started:
            c_lo = min(e.start_ns for e in started)
            c_hi = max(e.end_ns for e in started if e.kind != "memcpy" or "HtoD" not in e.name)
            c_hi = max(c_lo, min(c_hi, body_end))
            taken = total_length(clip_intervals(union_intervals(h2d + exposed), c_lo, c_hi))
            row["gpu_compute_s"] = max(0, c_hi - c_lo - taken) * _NS
            if h2d and h2d[0][0] < c_lo:
                # As the agent's events measure it: from the step's first GPU work to the forward's, so a
                # pageable copy's gaps (the host staging each chunk) count as the copy's, not as idle.
                row["h2d_s"] = max(row["h2d_s"], (c_lo - g_lo) * _NS)
        else:
            row["gpu_compute_s"] = 0.0
    return g_hi


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of the disjoint sorted intervals ``a`` not covered by the disjoint sorted intervals ``b``."""
    out = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def _sum_known(values: list) -> Optional[int]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ready_ns(call: TraceEvent, host: list[TraceEvent], autograd: list[tuple[int, int]]) -> int:
    """When DDP's hook for this bucket ran: the end of the gradient's copy into the bucket just before it."""
    i = bisect.bisect_right(autograd, (call.start_ns, float("inf"))) - 1
    lo = autograd[i][0] if i >= 0 else call.start_ns
    ends = [
        e.end_ns
        for e in host
        if e.lane == call.lane and e.name in _BUCKET_COPIES and lo <= e.start_ns and e.end_ns <= call.start_ns
    ]
    return max(ends, default=call.start_ns)


_BUCKET_COPIES = frozenset({"torch::distributed::reducer::copy_", "torch::autograd::AccumulateGrad"})


def _call_bytes(call: TraceEvent, gloo: Optional[TraceEvent], host: list[TraceEvent]) -> Optional[int]:
    """A collective's bytes: its gloo span's (it names the dtype), an NCCL span inside the call, or its own."""
    if gloo is not None and gloo.nbytes:
        return gloo.nbytes
    inner = next(
        (
            e.nbytes
            for e in host
            if e.nbytes and e.name.startswith("nccl:") and e.lane == call.lane
            and call.start_ns <= e.start_ns <= call.end_ns
        ),
        None,
    )  # fmt: skip
    return inner or call.nbytes


def _collective_rows(
    step: int, blocked: list, bucket_calls: list[TraceEvent], allreduce_ns: Optional[int], nbytes: dict
) -> list[dict]:
    """Per (op, origin) of the step, as the agent sums them: user calls with their held time, DDP's buckets."""
    rows: dict[tuple[str, str], dict] = {}
    for call, b, e in blocked:
        r = rows.setdefault(
            (_collective_op(call.name), "user"),
            {"count": 0, "blocked_s": 0.0, "busy_s": None, "bytes": None},
        )
        r["count"] += 1
        r["blocked_s"] += max(0, e - b) * _NS
        if nbytes.get(id(call)) is not None:
            r["bytes"] = (r["bytes"] or 0) + nbytes[id(call)]
    if bucket_calls:
        rows[("all_reduce", "ddp")] = {
            "count": len(bucket_calls),
            "blocked_s": None,
            "busy_s": allreduce_ns * _NS if allreduce_ns is not None else None,
            "bytes": _sum_known([nbytes.get(id(c)) for c in bucket_calls]),
        }
    return [
        {"step": step, "op": op, "origin": origin, "process_group": "default", "gpu_s": None, **r}
        for (op, origin), r in rows.items()
    ]
