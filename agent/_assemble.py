"""Turn raw hot-path marks into step and bucket records (runs on the agent thread).

Phases partition the step's wall time ``[t0, end]``, where ``t0`` is the start of the loader wait
that fed the step (or the step's own start without a wrapped loader):

    data_wait   [fetch_begin, fetch_end] plus time inside ``mon.data()`` blocks (NULL when neither exists)
    compute     [forward start, last bucket ready]      (no DDP: up to optimizer start or step end; without
                bucket marks, backward's end: ``EV_GRAD_SYNC``),
                less the data fetches and blocking collectives that ran inside it
    comm_exposed[last bucket ready, min(last bucket done, optimizer start)] (without bucket marks: backward's
                end to DDP's wait returning), plus the time the thread was
                held in other collectives and barriers during the step (``comm_blocked_s`` on its own)
    optimizer   [optimizer pre-hook, post-hook]
    other       the rest (batch to device, loss bookkeeping, zero_grad, logging)

Collectives outside DDP's buckets are also summed per (step, op, origin, group) into ``collectives``
rows, as are the DDP buckets (origin ``ddp``), so that table holds every collective of the step.

Bucket done callbacks arrive on the communication thread and may trail the step mark, so a step is
finalised once all its buckets are done, or one drain after it was seen, or at close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ranksight.format.phases import host_other

from ._events import EV_BUCKET_DONE, EV_BUCKET_READY, EV_COLLECTIVE, EV_GRAD_SYNC, EV_STEP

_NS = 1e-9


@dataclass
class _Pending:
    raw: tuple | None = None
    buckets: dict = field(default_factory=dict)  # bucket index -> [bytes, ready_ns, done_ns, is_last]
    # (op, origin, group, bytes, begin_ns, end_ns, blocked_ns[, wall clock ns at begin])
    collectives: list = field(default_factory=list)
    age: int = 0
    sync: tuple | None = None  # (ready_ns, done_ns) of DDP's gradient sync, timed without bucket marks


class Assembler:
    """Stateful join of step marks with bucket marks; emits finished rows."""

    def __init__(self, wall_offset_ns: int) -> None:
        self._wall_offset_ns = wall_offset_ns
        self._pending: dict[int, _Pending] = {}
        self.last_step = -1
        self.grad_bytes: int | None = None  # what DDP all-reduces per step, when no comm hook times its buckets
        self.bucket_count: int | None = None  # DDP's buckets, from its logging data, for steps timed by EV_GRAD_SYNC

    def add(self, event: tuple) -> None:
        """Feed one raw event from the hot path."""
        tag = event[0]
        if tag == EV_STEP:
            p = self._pending.setdefault(event[1], _Pending())
            p.raw = event
            self.last_step = max(self.last_step, event[1])
        elif tag == EV_BUCKET_READY:
            _, step, index, nbytes, ready_ns, is_last = event
            b = self._pending.setdefault(step, _Pending()).buckets.setdefault(index, [0, 0, 0, False])
            b[0], b[1], b[3] = nbytes, ready_ns, bool(is_last)
        elif tag == EV_BUCKET_DONE:
            _, step, index, done_ns = event
            b = self._pending.setdefault(step, _Pending()).buckets.setdefault(index, [0, 0, 0, False])
            b[2] = done_ns
        elif tag == EV_GRAD_SYNC:
            self._pending.setdefault(event[1], _Pending()).sync = event[2:]
        elif tag == EV_COLLECTIVE:
            self._pending.setdefault(event[1], _Pending()).collectives.append(event[2:])

    def drain(self, final: bool = False) -> tuple[list[dict], list[dict], list[dict]]:
        """Return (step rows, bucket rows, collective rows) for every step that is complete (or all, when
        final). Collectives issued between steps (an eval, a barrier before the loop) are written for the
        step index they were issued under, even if that step never ran."""
        steps: list[dict] = []
        buckets: list[dict] = []
        collectives: list[dict] = []
        spans: list = []  # (step, begin_ns, end_ns, calls, its collective rows) for collective_gpu
        for step in sorted(self._pending):
            p = self._pending[step]
            if p.raw is None:
                # Marks without a step mark: the step is still running; wait. At close its collectives
                # still happened (e.g. a final barrier): keep those; lone bucket marks are dropped.
                if final:
                    collectives.extend(_collective_rows(step, p.collectives, (), None))
                    del self._pending[step]
                continue
            complete = all(b[1] and b[2] for b in p.buckets.values())
            if not (complete or final or p.age >= 1):
                p.age += 1
                continue
            row, brows = self._finish(p)
            steps.append(row)
            buckets.extend(brows)
            crows = (
                _collective_rows(step, p.collectives, p.buckets.values(), row["allreduce_s"])
                if p.collectives or p.buckets
                else []
            )
            if p.sync is not None and not p.buckets and row["buckets"]:  # DDP's all-reduce, untimed per bucket
                crows.append(
                    {"step": step, "op": "all_reduce", "origin": "ddp", "process_group": "default",
                     "count": row["buckets"], "bytes": row["bucket_bytes"], "blocked_s": None, "gpu_s": None,
                     "busy_s": None}
                )  # fmt: skip
            collectives.extend(crows)
            if self.collective_gpu is not None:
                begin = min([p.raw[2], *(c[4] for c in p.collectives)])
                spans.append((step, begin, p.raw[3], p.collectives, crows))
            del self._pending[step]
        if spans:
            collectives.extend(self._time_on_gpu(spans))
        return steps, buckets, collectives

    def _time_on_gpu(self, spans: list) -> list[dict]:
        """Let ``collective_gpu`` fill the rows' ``gpu_s`` (and add the rows of collectives no Python call
        issued, DDP's buckets on NCCL); return the added rows. A failure turns it off, never the drain."""
        try:
            return self.collective_gpu(spans)
        except Exception:
            self.collective_gpu = None
            return []

    def _finish(self, p: _Pending) -> tuple[dict, list[dict]]:
        _, step, begin, end, fetch_b, fetch_e, fwd, opt_b, opt_e = p.raw[:9]
        data_ns, pre_data_ns, pre_begin, data_in_compute, cpu_ns = p.raw[9:]
        has_fetch = fetch_e > 0 and fetch_b <= fetch_e <= begin
        t0 = fetch_b if has_fetch else begin
        if 0 < pre_begin < t0:  # a mon.data() fetch before the step opened: the step starts there
            t0 = pre_begin
        step_s = (end - t0) * _NS
        loader_ns = fetch_e - fetch_b if has_fetch else 0
        data_wait = None if data_ns < 0 and not has_fetch else (loader_ns + pre_data_ns + max(0, data_ns)) * _NS

        buckets = p.buckets.values()
        ready = [b[1] for b in buckets if b[1]] if p.buckets else ()
        done = [b[2] for b in buckets if b[2]] if p.buckets else ()
        boundary = opt_b if opt_b and begin <= opt_b <= end else end
        compute_start = fwd if fwd and begin <= fwd <= boundary else None
        allreduce = exposed = None
        if ready:
            last_ready = min(max(ready), boundary)
            last_done = min(max(done), boundary) if done else boundary
            exposed = max(0, last_done - last_ready) * _NS
            allreduce = sum(b[2] - b[1] for b in p.buckets.values() if b[1] and b[2]) * _NS
            compute_end = last_ready
        elif p.sync is not None:  # one mark pair per step: no per-bucket all-reduce times
            compute_end = min(p.sync[0], boundary)
            exposed = max(0, min(p.sync[1], boundary) - compute_end) * _NS
        else:
            compute_end = boundary
        # Time the thread was held by collectives / data fetches inside [t0, end]; those inside the compute
        # span come out of compute (a metric all_reduce between forward and backward is not compute).
        blocked = blocked_in_compute = 0
        count = nbytes = 0
        for c in p.collectives:
            size, c_begin, c_end, held = c[3], c[4], c[5], c[6]
            if t0 <= c_end and c_begin <= end:
                blocked += held
                count += 1
                nbytes += size
                if compute_start is not None and compute_start <= c_begin and c_end <= compute_end:
                    blocked_in_compute += held
        # Without a forward mark (no watch()), compute cannot be told apart from the rest of the step.
        compute = None
        if compute_start is not None:
            compute_ns = max(0, compute_end - compute_start) - blocked_in_compute
            compute_ns -= data_in_compute  # a prefetch after forward (nanoGPT-style) is data, not compute
            compute = max(0, compute_ns) * _NS
        comm_blocked = blocked * _NS if p.collectives or self.collectives_on else None
        optimizer = (opt_e - opt_b) * _NS if opt_b and begin <= opt_b <= opt_e <= end else None
        bucket_bytes = sum(b[0] for b in p.buckets.values()) if p.buckets else self.grad_bytes
        row = {
            "step": step,
            "time_ns": end + self._wall_offset_ns,
            "step_s": step_s,
            "data_wait_s": data_wait,
            "h2d_s": None,
            "compute_s": compute,
            "comm_exposed_s": exposed,
            "comm_blocked_s": comm_blocked,
            "collectives": count if p.collectives or self.collectives_on else None,
            "collective_bytes": nbytes if p.collectives or self.collectives_on else None,
            "allreduce_s": allreduce,
            "optimizer_s": optimizer,
            "other_s": host_other(step_s, data_wait, compute, exposed, comm_blocked, optimizer),
            "buckets": len(p.buckets) if p.buckets else (self.bucket_count if p.sync is not None else None),
            "bucket_bytes": bucket_bytes,
            "gpu_compute_s": None,
            "gpu_step_s": None,
            "gpu_gap_s": None,
            "gpu_comm_exposed_s": None,
            "gpu_comm_blocked_s": None,
            "gpu_data_idle_s": None,
            "data_wait_in_step_s": max(0, data_ns) * _NS if data_wait is not None else None,
            "gpu_optimizer_s": None,
            "cpu_s": cpu_ns * _NS if cpu_ns >= 0 else None,
        }
        brows = p.buckets and [
            {
                "step": step,
                "bucket": index,
                "bytes": b[0],
                "ready_s": (b[1] - t0) * _NS if b[1] else None,
                "allreduce_s": (b[2] - b[1]) * _NS if b[1] and b[2] else None,
                "is_last": b[3],
            }
            for index, b in sorted(p.buckets.items())
        ]
        return row, brows or []

    collectives_on = False
    """Set when collective timing is installed: a step without any then reads 0, not unknown."""

    collective_gpu = None
    """On an NCCL rank, ``_nccl_timing.NcclTimes``: called once per drain with the finished steps'
    ``(step, begin_ns, end_ns, calls, rows)``; fills ``gpu_s`` from NCCL's own timing."""


def _collective_rows(step: int, calls: list, buckets, allreduce_s) -> list[dict]:
    """Sum one step's collectives per (op, origin, group); DDP's buckets make one ``ddp`` all_reduce row."""
    sums: dict[tuple, list] = {}
    for op, origin, group, size, _begin, _end, held, *_wall in calls:
        agg = sums.setdefault((op, origin, group), [0, 0, 0])
        agg[0] += 1
        agg[1] += size
        agg[2] += held
    rows = [
        {"step": step, "op": op, "origin": origin, "process_group": group, "count": n, "bytes": size,
         "blocked_s": held * _NS, "busy_s": None, "gpu_s": None}
        for (op, origin, group), (n, size, held) in sums.items()
    ]  # fmt: skip
    buckets = list(buckets)
    if buckets:
        rows.append(
            {"step": step, "op": "all_reduce", "origin": "ddp", "process_group": "default", "count": len(buckets),
             "bytes": sum(b[0] for b in buckets), "blocked_s": None, "gpu_s": None, "busy_s": allreduce_s}
        )  # fmt: skip
    return rows
