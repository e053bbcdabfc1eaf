"""GPU phases from sampled steps: which steps record CUDA events, and how every reader leaves the others out.

A GPU rank records its CUDA events on a subset of steps (``GpuOptions.events_every_steps``); the other steps
keep their host-clock columns and carry ``gpu_sampled = false``. The rows here are written through the
agent's own spool writer and node-spool publisher (digests included) and read by the real readers: the
breakdown from rows and from digests, the dashboard's rollup, the live metrics and the verdict must all
read the sampled steps alone, as if the unsampled rows were not there. The same on real CUDA events runs
in ``tests/test_gpu_cuda.py`` on the H200.
"""

from __future__ import annotations

import os
import time

import pytest

from ranksight.agent._event_sampling import MAX_EVERY, choose_every, is_sampled, threshold
from ranksight.agent._gpu_resolver import GpuResolver
from ranksight.agent._identity import Identity
from ranksight.agent._node_spool import publish_node_spool
from ranksight.agent._spool import SpoolWriter
from ranksight.collectors import PHASES, open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.dashboard import _queries as q
from ranksight.dashboard._rollup import Rollup
from ranksight.rules import diagnose

MS = 1e-3


def _sampled(steps, every: int) -> set[int]:
    bound = threshold(every)
    return {s for s in steps if is_sampled(s, bound)}


def test_the_schedule_samples_one_step_in_n_irregularly_and_nested():
    steps = range(20_000)
    for every in (2, 3, 8, 10, 64):
        got = _sampled(steps, every)
        assert len(got) == pytest.approx(len(steps) / every, rel=0.02)
        # A loop with a logging .item() or an eval every 10 / 100 steps: those steps are sampled at the same
        # rate as the rest, not always (a stride of 10) or never (a stride of 8 against a period of 10).
        for period in (10, 100):
            hit = sum(1 for s in range(0, 20_000, period) if s in got)
            assert hit / (20_000 / period) == pytest.approx(1 / every, rel=0.25, abs=0.01), (every, period)
    # Nested: a rank that settled on a sparser schedule samples a subset of a denser rank's steps.
    assert _sampled(steps, 16) <= _sampled(steps, 8) <= _sampled(steps, 3)
    assert _sampled(steps, 1) == set(steps)


def test_the_sampling_follows_the_cost_of_the_events_against_the_step():
    # 60 us of events per sampled step; a 0.1 % budget allows 10 us of a 10 ms step: one step in 6.
    assert choose_every(0.010, 60e-6, 0.001) == 6
    assert choose_every(0.003, 60e-6, 0.001) == 20
    assert choose_every(0.200, 60e-6, 0.001) == 1  # a long step pays for its events
    assert choose_every(0.0001, 60e-6, 0.001) == MAX_EVERY
    assert choose_every(0.0, 60e-6, 0.001) == 1  # nothing measured yet


class _Event:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _Event) -> float:
        return other.ms - self.ms


class _Marks:
    """What the resolver reads of ``GpuMarks``: the pool, whether events are on, the measured record cost."""

    def __init__(self, events_on: bool = True) -> None:
        self.events_on = events_on
        self.record_cost_s = 5e-6
        self.every = 1

    def release(self, events) -> None:
        pass

    def set_every(self, every: int) -> None:
        self.every = every


def test_the_resolver_marks_sampled_rows_and_retunes_from_their_cost():
    marks = _Marks()
    res = GpuResolver(marks)
    res.budget = 0.001
    gpu_marks = []
    for s in (0, 2):  # steps 0 and 2 sampled (begin, forward, end); step 1 marked its end only, for step 2's gap
        gpu_marks += [(None, s, (k, _Event(10 * s + dt))) for k, dt in (("b", 0), ("f", 1), ("e", 9))]
    gpu_marks.append((None, 1, ("e", _Event(19))))
    rows = [{"step": s, "step_s": 0.001} for s in range(4)]
    out = res(gpu_marks, rows, final=False)
    assert [(r["step"], r["gpu_sampled"]) for r in out] == [(0, True), (1, False), (2, True), (3, False)]
    assert out[0]["gpu_step_s"] == pytest.approx(0.009) and "gpu_step_s" not in out[1]
    assert out[2]["gpu_gap_s"] == pytest.approx(0.001)  # from step 1's end, kept although step 1 was not sampled
    # Three events a sampled step at 5 us each against a 0.1 % budget of a 1 ms step: well past one in 15.
    assert marks.every >= 15
    off = GpuResolver(_Marks(events_on=False))
    assert "gpu_sampled" not in off([], [{"step": 0, "step_s": 0.001}], final=True)[0]  # events off: NULL


# A GPU-bound rank: on its sampled steps the GPU computes 30 ms of a 31 ms period and never waits for
# the loader. Its unsampled steps carry only the host's clock, which ran ahead and says 60 % data wait:
# were they read, the verdict would be input-bound.
SAMPLED_GPU = {"step_s": 31 * MS, "data_wait_s": 0.5 * MS, "compute_s": 3 * MS, "optimizer_s": 0.3 * MS,
               "other_s": 27.2 * MS, "gpu_gap_s": 0.01 * MS, "gpu_step_s": 31 * MS, "h2d_s": 0.2 * MS,
               "gpu_compute_s": 30 * MS, "gpu_optimizer_s": 0.5 * MS, "gpu_sampled": True}  # fmt: skip
UNSAMPLED_HOST = {"step_s": 31 * MS, "data_wait_s": 19 * MS, "compute_s": 3 * MS, "optimizer_s": 0.3 * MS,
                  "other_s": 8.7 * MS, "gpu_sampled": False}  # fmt: skip
EVERY = 4
STEPS = range(0, 160)


def _rows(steps, keep_unsampled: bool) -> list[dict]:
    rows = []
    chosen = _sampled(steps, EVERY)
    for s in steps:
        j = 1 + 0.03 * ((s * 7) % 5 - 2)  # +-6 %: medians are not degenerate
        shape = SAMPLED_GPU if s in chosen else UNSAMPLED_HOST
        if s not in chosen and not keep_unsampled:
            continue
        row = {k: v * j if isinstance(v, float) else v for k, v in shape.items()}
        rows.append({"step": s, "time_ns": time.time_ns() + s * 10**7, **row})
    return rows


def _write(root, name: str, keep_unsampled: bool) -> str:
    local, run = os.path.join(str(root), "local", name), os.path.join(str(root), "runs", name)
    os.makedirs(run)
    for rank in (0, 1):
        ident = Identity("sampling", name, "n0", rank, rank, 2, 4000 + rank)
        w = SpoolWriter(local, ident)
        w.write("steps", _rows(STEPS, keep_unsampled))
        meta = {**ident.labels(), "status": "finished", "heartbeat_ns": time.time_ns(), "steps": len(STEPS)}
        meta["model"] = {"devices": ["cuda:0"], "parameter_bytes": 10**8, "class": "Net"}
        w.write_meta(meta)
        SpoolWriter(run, ident).write_meta(meta)
    publish_node_spool(local, run, "n0")  # one step file for the node, with its digests
    return run


def _shares(rows: list[dict]) -> dict:
    return {r["rank"]: (r["steps"], *(round(r[f"{p[:-2]}_share"], 9) for p in PHASES)) for r in rows}


def test_every_reader_takes_gpu_phases_from_the_sampled_steps_alone(tmp_path):
    run = _write(tmp_path, "sampled", keep_unsampled=True)
    ref = _write(tmp_path, "only-sampled", keep_unsampled=False)
    want = _shares(step_breakdown(open_run(ref)))
    assert want[0][0] == len(_sampled(range(5, 160), EVERY))  # the steps a share rests on, warm-up left out

    con = open_run(run)
    assert con.summary().read_from == ("digests",)  # the breakdown below comes from the published digests
    assert _shares(step_breakdown(con)) == want
    digests = os.path.join(run, "steps", ".digests")
    os.rename(digests, digests + "-aside")  # and from the rows
    try:
        assert _shares(step_breakdown(open_run(run))) == want
        rolled = {r["rank"]: r for r in q.breakdown_per_rank(Rollup(run).cursor())}
    finally:
        os.rename(digests + "-aside", digests)
    for rank, shares in want.items():
        for i, p in enumerate(PHASES):
            assert rolled[rank][f"{p[:-2]}_share"] == pytest.approx(shares[1 + i], abs=1e-9)
    assert want[0][1 + PHASES.index("data_wait_s")] < 0.01  # the GPU never waited for the loader
    findings = [f["rule"] for f in diagnose(run)["findings"] if f["severity"] != "info"]
    assert "input-bound" not in findings, findings
    assert findings == [f["rule"] for f in diagnose(ref)["findings"] if f["severity"] != "info"]


def test_live_metrics_take_ratios_from_the_sampled_steps_and_step_times_from_all():
    from ranksight.agent._rollup import Rollup as MetricRollup

    rows = _rows(STEPS, keep_unsampled=True)
    live, ref = MetricRollup(), MetricRollup()
    live.update("steps", rows)
    ref.update("steps", [r for r in rows if r["gpu_sampled"]])
    snap, want = live.snapshot(), ref.snapshot()
    assert snap.step_count == len(STEPS)
    assert snap.gauges["ranksight_data_wait_ratio"] == pytest.approx(want.gauges["ranksight_data_wait_ratio"])
    assert snap.gauges["ranksight_data_wait_ratio"] < 0.01


def test_gpu_options_from_the_environment_merge_with_the_call(monkeypatch):
    from ranksight.agent._config import Config

    monkeypatch.setenv("RANKSIGHT_GPU", '{"events_every_steps": 1, "nvml": false}')
    cfg = Config.from_env(gpu={"nvml": True})
    assert (cfg.gpu.events_every_steps, cfg.gpu.nvml) == (1, True)  # the call's key wins, the rest applies
    monkeypatch.setenv("RANKSIGHT_GPU", '{"events_every_step": 1}')
    with pytest.raises(ValueError, match="unknown gpu option"):
        Config.from_env()
    monkeypatch.setenv("RANKSIGHT_GPU", "{1")
    with pytest.raises(ValueError, match="RANKSIGHT_GPU must be a JSON object"):
        Config.from_env()


@pytest.fixture
def cupti_env(monkeypatch):
    """TEARDOWN_CUPTI, DISABLE_CUPTI_LAZY_REINIT and the agent's record of having set the first, absent here
    and restored after: the code under test sets them for the process, and a detach left set would make
    every later window in the test process detach CUPTI (tests/test_gpu_cuda.py on a GPU)."""
    from ranksight.agent import _trace_window as tw

    for name in ("TEARDOWN_CUPTI", "DISABLE_CUPTI_LAZY_REINIT"):
        monkeypatch.setenv(name, "")  # recorded as the state to restore, then removed
        monkeypatch.delenv(name)
    monkeypatch.setattr(tw, "_detach_set_here", False)
    return monkeypatch


def test_the_kernel_window_detaches_cupti_after_it_unless_the_user_chose(cupti_env):
    """CUPTI left attached after a window slows every later kernel launch of a host-bound job: the window
    asks Kineto to detach it (``TEARDOWN_CUPTI=1``) on CUDA >= 12.6, and leaves a user's choice alone."""
    import types

    from ranksight.agent._trace_window import detach_cupti_after_trace

    def torch_with(cuda):
        return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda))

    monkeypatch = cupti_env
    assert detach_cupti_after_trace(torch_with("12.4")) is False and "TEARDOWN_CUPTI" not in os.environ
    assert detach_cupti_after_trace(torch_with(None)) is False and "TEARDOWN_CUPTI" not in os.environ
    assert detach_cupti_after_trace(torch_with("13.0")) is True and os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the user's (or torch.profiler's, under CUDA graphs)
    assert detach_cupti_after_trace(torch_with("13.0")) is False and os.environ["TEARDOWN_CUPTI"] == "0"
    monkeypatch.delenv("TEARDOWN_CUPTI")
    monkeypatch.setenv("DISABLE_CUPTI_LAZY_REINIT", "1")
    assert detach_cupti_after_trace(torch_with("13.0")) is False and "TEARDOWN_CUPTI" not in os.environ


def test_a_window_dropped_for_the_users_profiler_leaves_cupti_attached(cupti_env):
    """Dropping the window because the user's profiler starts must not detach CUPTI: theirs attaches it
    again at once, and a detach still in progress left their trace without GPU activity. The agent's own
    ``TEARDOWN_CUPTI=1`` reads 0 during that stop and 1 again after; a user's own setting is left alone."""
    import types

    from ranksight.agent import _trace_window as tw

    monkeypatch = cupti_env
    assert tw.detach_cupti_after_trace(types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0")))
    seen = []

    class Window:  # the two calls yield_to_user makes
        def _say_backing_off(self):
            pass

        def abort(self):
            seen.append(os.environ.get("TEARDOWN_CUPTI"))

    tw.TraceWindow.yield_to_user(Window())
    assert seen == ["0"] and os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setattr(tw, "_detach_set_here", False)  # the user's own TEARDOWN_CUPTI=1
    tw.TraceWindow.yield_to_user(Window())
    assert seen == ["0", "1"]


def test_the_window_detaches_cupti_unless_told_not_to(monkeypatch):
    """``detach_cupti`` is on by default (left attached, CUPTI slowed a host-bound H200 step 1.19x after the
    first window); each window's preparation asks for the detach, and none is asked for when it is off."""
    import types

    from ranksight.agent import _trace_window as tw
    from ranksight.agent._config import GpuOptions

    assert GpuOptions().detach_cupti is True
    asked = []
    monkeypatch.setattr(tw, "detach_cupti_after_trace", lambda torch: asked.append(torch) or True)
    monitor = types.SimpleNamespace(_warn_once=lambda *a: None)
    for detach in (False, True):
        window = tw.TraceWindow(monitor, first_step=0, use_cuda=False, detach_cupti=detach)
        window.begin(0)
        assert window.state == window.WARMING
        window.abort()
    assert len(asked) == 1


def test_a_users_profiler_start_is_warned_once_a_window_detached_cupti(monkeypatch):
    """After a window of ours detached CUPTI, a profiler the user starts may record no GPU kernels (seen on an
    H200): their start is warned, once, with the option that keeps CUPTI attached; not before any window
    ended, not when the detach was the user's own setting, and not with detaching off."""
    import types

    from ranksight.agent import _trace_window as tw

    warned = []

    def window(detach, done):
        m = types.SimpleNamespace(_warn_once=lambda key, msg: warned.append((key, msg)))
        return types.SimpleNamespace(detach_cupti=detach, windows_done=done, _m=m)

    kept = [window(True, 0), window(False, 3)]
    monkeypatch.setattr(tw, "_windows", kept)
    monkeypatch.setattr(tw, "_detach_set_here", True)
    tw._say_cupti_was_detached()
    assert warned == []
    kept.append(window(True, 1))
    monkeypatch.setattr(tw, "_detach_set_here", False)  # TEARDOWN_CUPTI=1 was the user's
    tw._say_cupti_was_detached()
    assert warned == []
    monkeypatch.setattr(tw, "_detach_set_here", True)
    tw._say_cupti_was_detached()
    assert [key for key, _ in warned] == ["trace_window_detached_cupti"]
    assert "detach_cupti': False" in warned[0][1]


def test_the_cupti_tests_leave_the_process_as_they_found_it():
    """Runs after the tests above (file order): none of them left a detach set for later tests."""
    from ranksight.agent import _trace_window as tw

    assert "TEARDOWN_CUPTI" not in os.environ and tw._detach_set_here is False
