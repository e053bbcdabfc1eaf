"""The GPU resolver's bookkeeping on CPU: rows held until the GPU reaches them, gaps between steps.

CUDA events cannot exist without a GPU, so ``_StreamEvent`` stands in for ``torch.cuda.Event``: a
timestamp the "GPU" reaches at some point, ``query()`` true once it has. The same logic on real
events runs in ``tests/test_gpu_cuda.py`` on the H200.
"""

from __future__ import annotations

from ranksight.agent._gpu_resolver import GpuResolver


class _StreamEvent:
    def __init__(self, gpu_ms: float, clock: dict) -> None:
        self.gpu_ms, self._clock = gpu_ms, clock

    def query(self) -> bool:
        return self._clock["gpu_ms"] >= self.gpu_ms

    def elapsed_time(self, other: _StreamEvent) -> float:
        return other.gpu_ms - self.gpu_ms


class _Pool:
    def __init__(self) -> None:
        self.released: list = []

    def release(self, events) -> None:
        self.released.extend(events)


def _marks(step: int, begin_ms: float, end_ms: float, clock: dict) -> list:
    return [(None, step, ("b", _StreamEvent(begin_ms, clock))), (None, step, ("e", _StreamEvent(end_ms, clock)))]


def _row(step: int) -> dict:
    gpu = (
        "gpu_step_s",
        "gpu_gap_s",
        "h2d_s",
        "gpu_compute_s",
        "gpu_comm_exposed_s",
        "gpu_optimizer_s",
        "gpu_data_idle_s",
    )
    return {"step": step, "step_s": 0.01, **dict.fromkeys(gpu)}


def test_rows_wait_for_the_gpu_then_get_their_columns_and_gaps():
    clock = {"gpu_ms": 0.0}
    pool = _Pool()
    res = GpuResolver(pool, max_hold_s=60)
    # The host queued steps 0-3 at once; on the GPU each takes 30 ms, with a 5 ms idle gap before step 2.
    spans = {0: (0, 30), 1: (30, 60), 2: (65, 95), 3: (95, 125)}
    marks = [m for s, (b, e) in spans.items() for m in _marks(s, b, e, clock)]
    clock["gpu_ms"] = 40.0  # the GPU has finished step 0 only
    out = res(marks, [_row(s) for s in spans], final=False)
    assert [r["step"] for r in out] == [0]  # 1-3 are held, not written without their GPU columns
    assert out[0]["gpu_step_s"] == 0.03 and out[0]["gpu_gap_s"] is None  # no previous step to measure from
    clock["gpu_ms"] = 200.0
    out = res([], [], final=False)
    assert [r["step"] for r in out] == [1, 2, 3]
    assert [round(r["gpu_gap_s"] * 1e3, 6) for r in out] == [0.0, 5.0, 0.0]
    assert all(r["gpu_step_s"] == 0.03 for r in out)
    assert res.dropped_total == 0
    assert len(pool.released) == 7  # every event back in the pool but step 3's end, kept for step 4's gap
    res([], [], final=True)
    assert len(pool.released) == 8


def test_ddp_marks_give_exposed_comm_and_optimizer_on_the_gpu_clock():
    clock = {"gpu_ms": 1000.0}
    res = GpuResolver(_Pool(), max_hold_s=60)
    # begin 0, forward 1, last bucket ready 20, its all-reduce done 32, optimizer 33, end 35 (GPU ms).
    marks = _marks(0, 0, 35, clock) + [
        (None, 0, (kind, _StreamEvent(ms, clock))) for kind, ms in (("f", 1), ("r", 20), ("d", 32), ("o", 33))
    ]
    (row,) = res(marks, [_row(0)], final=False)
    got = {k: round(row[k] * 1e3, 6) for k in ("h2d_s", "gpu_compute_s", "gpu_comm_exposed_s", "gpu_optimizer_s")}
    assert got == {"h2d_s": 1.0, "gpu_compute_s": 19.0, "gpu_comm_exposed_s": 12.0, "gpu_optimizer_s": 2.0}
    # A collective still running at step end is capped there (it belongs to no phase of this step).
    marks = _marks(1, 40, 60, clock) + [(None, 1, (k, _StreamEvent(ms, clock))) for k, ms in (("r", 50), ("d", 70))]
    (row,) = res(marks, [_row(1)], final=False)
    assert round(row["gpu_comm_exposed_s"] * 1e3, 6) == 10.0


def test_in_step_fetches_move_their_gpu_idle_out_of_the_phase_they_fell_in():
    """A nanoGPT-style prefetch between forward and backward stalls the stream inside compute: its idle
    (the span between the fetch's two events) leaves compute and is reported as ``gpu_data_idle_s``.
    One before forward leaves the copy span, one after the optimizer mark the optimizer span."""
    clock = {"gpu_ms": 1000.0}
    pool = _Pool()
    res = GpuResolver(pool, max_hold_s=60)
    ev = lambda ms: _StreamEvent(ms, clock)  # noqa: E731
    # begin 0, fetch 0.5-2.5 (before forward), forward 3, fetch 10-40 (after forward), last bucket 60,
    # optimizer 61, fetch 62-64 (inside the optimizer span), end 70; a fetch the GPU was busy through is 0.
    marks = _marks(0, 0, 70, clock) + [(None, 0, (k, ev(ms))) for k, ms in (("f", 3), ("r", 60), ("o", 61))]
    marks += [(None, 0, ("k", ev(a), ev(z))) for a, z in ((0.5, 2.5), (10, 40), (20, 20), (62, 64))]
    (row,) = res(marks, [_row(0)], final=False)
    got = {k: round(row[k] * 1e3, 6) for k in ("h2d_s", "gpu_compute_s", "gpu_optimizer_s", "gpu_data_idle_s")}
    assert got == {"h2d_s": 1.0, "gpu_compute_s": 27.0, "gpu_optimizer_s": 7.0, "gpu_data_idle_s": 34.0}
    assert len(pool.released) == 12  # b, f, r, o and the fetches' 8 events back in the pool; e kept for step 1
    # Without fetches the column stays NULL (not measured), never 0.
    (row,) = res(_marks(1, 80, 90, clock), [_row(1)], final=False)
    assert row["gpu_data_idle_s"] is None


def test_a_row_held_too_long_or_at_close_goes_out_without_gpu_columns():
    clock = {"gpu_ms": 0.0}
    res = GpuResolver(_Pool(), max_hold_s=0.0)  # never hold
    out = res(_marks(0, 0, 30, clock), [_row(0)], final=False)
    assert [r["gpu_step_s"] for r in out] == [None] and res.dropped_total == 1
    res = GpuResolver(_Pool(), max_hold_s=60)
    assert res(_marks(0, 0, 30, clock), [_row(0)], final=False) == []
    out = res([], [], final=True)  # closing: nothing is waited for
    assert [r["step"] for r in out] == [0] and out[0]["gpu_step_s"] is None


def test_salvage_returns_every_row_once_in_order():
    clock = {"gpu_ms": 0.0}
    res = GpuResolver(_Pool(), max_hold_s=60)
    res(_marks(0, 0, 30, clock) + _marks(1, 30, 60, clock), [_row(0), _row(1)], final=False)
    late = [_row(2)]
    assert [r["step"] for r in res.salvage(late)] == [0, 1, 2]
    assert res.salvage([]) == []


def test_held_rows_are_bounded(monkeypatch):
    import ranksight.agent._gpu_resolver as resolver

    monkeypatch.setattr(resolver, "_MAX_HELD_ROWS", 2)
    clock = {"gpu_ms": 0.0}  # a GPU that never gets anywhere
    res = GpuResolver(_Pool(), max_hold_s=60)
    marks = [m for s in range(4) for m in _marks(s, 10 * s + 1, 10 * s + 9, clock)]
    out = res(marks, [_row(s) for s in range(4)], final=False)
    assert [r["step"] for r in out] == [0, 1]  # the oldest went out, without GPU columns
    assert all(r["gpu_step_s"] is None for r in out) and res.dropped_total == 2
