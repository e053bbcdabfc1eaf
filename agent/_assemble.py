"""Turn raw hot-path marks into step and bucket records (runs on the agent thread).

Phases partition the step's wall time ``[t0, end]``, where ``t0`` is the start of the loader wait
that fed the step (or the step's own start without a wrapped loader):

    data_wait   [fetch_begin, fetch_end]
    compute     [forward start, last bucket ready]      (no DDP: up to optimizer start or step end)
    comm_exposed[last bucket ready, min(last bucket done, optimizer start)]
    optimizer   [optimizer pre-hook, post-hook]
    other       the rest (batch to device, loss bookkeeping, zero_grad, logging)

Bucket done callbacks arrive on the communication thread and may trail the step mark, so a step is
finalised once all its buckets are done, or one drain after it was seen, or at close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._monitor import EV_BUCKET_DONE, EV_BUCKET_READY, EV_STEP

_NS = 1e-9


@dataclass
class _Pending:
    raw: tuple | None = None
    buckets: dict = field(default_factory=dict)  # bucket index -> [bytes, ready_ns, done_ns, is_last]
    age: int = 0


class Assembler:
    """Stateful join of step marks with bucket marks; emits finished rows."""

    def __init__(self, wall_offset_ns: int) -> None:
        self._wall_offset_ns = wall_offset_ns
        self._pending: dict[int, _Pending] = {}
        self.last_step = -1

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

    def drain(self, final: bool = False) -> tuple[list[dict], list[dict]]:
        """Return (step rows, bucket rows) for every step that is complete (or all, when final)."""
        steps: list[dict] = []
        buckets: list[dict] = []
        for step in sorted(self._pending):
            p = self._pending[step]
            if p.raw is None:
                # Buckets without a step mark: the step is still running; wait (or drop at close).
                if final:
                    del self._pending[step]
                continue
            complete = all(b[1] and b[2] for b in p.buckets.values())
            if not (complete or final or p.age >= 1):
                p.age += 1
                continue
            row, brows = self._finish(p)
            steps.append(row)
            buckets.extend(brows)
            del self._pending[step]
        return steps, buckets

    def _finish(self, p: _Pending) -> tuple[dict, list[dict]]:
        _, step, begin, end, fetch_b, fetch_e, fwd, opt_b, opt_e = p.raw
        has_fetch = fetch_e > 0 and fetch_e <= begin
        t0 = fetch_b if has_fetch else begin
        step_s = (end - t0) * _NS
        data_wait = (fetch_e - fetch_b) * _NS if has_fetch else None

        ready = [b[1] for b in p.buckets.values() if b[1]]
        done = [b[2] for b in p.buckets.values() if b[2]]
        boundary = opt_b if opt_b and begin <= opt_b <= end else end
        compute_start = fwd if fwd and begin <= fwd <= boundary else None
        allreduce = exposed = None
        if ready:
            last_ready = min(max(ready), boundary)
            last_done = min(max(done), boundary) if done else boundary
            exposed = max(0, last_done - last_ready) * _NS
            allreduce = sum(b[2] - b[1] for b in p.buckets.values() if b[1] and b[2]) * _NS
            compute_end = last_ready
        else:
            compute_end = boundary
        # Without a forward mark (no watch()), compute cannot be told apart from the rest of the step.
        compute = max(0, compute_end - compute_start) * _NS if compute_start is not None else None
        optimizer = (opt_e - opt_b) * _NS if opt_b and begin <= opt_b <= opt_e <= end else None
        named = sum(x for x in (data_wait, compute, exposed, optimizer) if x)
        row = {
            "step": step,
            "time_ns": end + self._wall_offset_ns,
            "step_s": step_s,
            "data_wait_s": data_wait,
            "h2d_s": None,
            "compute_s": compute,
            "comm_exposed_s": exposed,
            "allreduce_s": allreduce,
            "optimizer_s": optimizer,
            "other_s": max(0.0, step_s - named),
            "buckets": len(p.buckets) if p.buckets else None,
            "bucket_bytes": sum(b[0] for b in p.buckets.values()) if p.buckets else None,
            "gpu_compute_s": None,
            "gpu_step_s": None,
            "gpu_gap_s": None,
            "gpu_comm_exposed_s": None,
            "gpu_optimizer_s": None,
        }
        brows = [
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
        return row, brows
