"""The gate's statistics and limits on series whose truth is known: steps drawn with a planted shift, slow load
drifts and one-off stalls, so what the interval should say is known before it is computed."""

from __future__ import annotations

import numpy as np
import pytest

from ranksight.commands._gate_policy import GateConfig, load_config, parse_share, phase_key, verdict
from ranksight.commands._gate_samples import COLUMNS, job_series, steady
from ranksight.commands._gate_stats import block_length, compare_series


def _series(rng, n=200, step_s=0.020, data_s=0.0, drift=0.02, stall_every=0):
    """A run's steps: a period made of compute, comm and data wait, with an AR(1) load factor of standard
    deviation ``drift`` (neighbouring steps share the machine's load: its memory is about 19 steps) and,
    where asked, a 10x stall every ``stall_every`` steps."""
    load = np.empty(n)
    load[0] = 0.0
    for i in range(1, n):
        load[i] = 0.9 * load[i - 1] + rng.normal(0, drift * np.sqrt(1 - 0.81))
    factor = np.exp(load + rng.normal(0, 0.05, n))
    compute = 0.6 * step_s * factor
    comm = 0.4 * step_s * factor
    if stall_every:
        comm[::stall_every] *= 10
    data = np.full(n, data_s)
    out = {"step": np.arange(n), "data_wait_s": data, "h2d_s": np.full(n, np.nan), "compute_s": compute,
           "comm_exposed_s": comm, "optimizer_s": np.zeros(n), "other_s": np.zeros(n)}  # fmt: skip
    out["period_s"] = data + compute + comm
    return {c: out[c] for c in ("step", *COLUMNS)}


def test_two_draws_of_one_job_mostly_read_no_change_and_pass():
    rng = np.random.default_rng(1)
    passed, no_change = 0, 0
    for _ in range(20):
        c = compare_series(_series(rng, drift=0.02), _series(rng, drift=0.02), 0.95)["step"]["change"]
        passed += c["low"] <= 0.03
        no_change += verdict(c, 0.03) == "no change"
        assert c["low"] <= c["point"] <= c["high"]
    assert passed >= 19
    assert no_change >= 15


def test_a_noisy_machine_widens_the_interval_instead_of_failing_healthy_reruns():
    rng = np.random.default_rng(5)
    words = []
    for _ in range(20):
        c = compare_series(_series(rng, drift=0.15), _series(rng, drift=0.15), 0.95)["step"]["change"]
        words.append(verdict(c, 0.03))
    assert words.count("slower") <= 1
    assert words.count("cannot tell") >= 15  # a 15 % load swing: the honest answer is "cannot tell"


def test_a_planted_slowdown_in_the_data_wait_is_caught_and_attributed():
    rng = np.random.default_rng(2)
    caught = 0
    for _ in range(10):
        out = compare_series(_series(rng, drift=0.03), _series(rng, drift=0.03, data_s=0.0016), 0.95)
        caught += out["step"]["change"]["low"] > 0.03
        contributions = {p: v["contribution"]["point"] for p, v in out["phases"].items()}
        # The phases' parts add up to the change in step time, exactly.
        assert sum(contributions.values()) == pytest.approx(out["step"]["change"]["point"], abs=1e-9)
        assert out["phases"]["data_wait_s"]["contribution"]["point"] == pytest.approx(0.08, rel=0.15)
        assert out["phases"]["data_wait_s"]["contribution"]["low"] > 0.05
    assert caught >= 9
    assert "h2d_s" not in out["phases"]  # never measured: absent, not a 0 that moved


def test_one_off_stalls_do_not_read_as_a_slowdown():
    rng = np.random.default_rng(3)
    a, b = _series(rng, drift=0.02), _series(rng, drift=0.02, stall_every=25)  # 4 % of B's steps stall 10x
    mean_change = b["period_s"].mean() / a["period_s"].mean() - 1
    assert mean_change > 0.1  # a plain mean would call it a regression
    c = compare_series(a, b, 0.95)["step"]["change"]
    assert abs(c["point"]) < 0.03 and c["low"] < 0.03


def test_the_interval_is_reproducible_and_narrows_with_more_steps():
    rng = np.random.default_rng(4)
    a, b = _series(rng, n=400), _series(rng, n=400)
    assert compare_series(a, b, 0.95) == compare_series(a, b, 0.95)
    short = compare_series({k: v[:80] for k, v in a.items()}, {k: v[:80] for k, v in b.items()}, 0.95)
    long = compare_series(a, b, 0.95)
    width = lambda o: o["step"]["change"]["high"] - o["step"]["change"]["low"]  # noqa: E731
    assert width(long) < width(short)
    assert block_length(400) == 20 and block_length(10) == 5 and block_length(3) == 3


def test_warm_up_and_job_series():
    ranks = {r: _series(np.random.default_rng(r), n=100) for r in (0, 1)}
    ranks[1] = {k: v[:-3] for k, v in ranks[1].items()}  # rank 1 ended three steps early
    kept = steady(ranks[0], warmup_steps=5)
    assert kept["step"][0] == 10  # 10 % of 100 steps is more than the 5 asked for
    assert steady(ranks[0], warmup_steps=20)["step"][0] == 20
    job = job_series(ranks, [0, 1])
    assert job["step"][-1] == 96
    assert job["period_s"][7] == pytest.approx((ranks[0]["period_s"][7] + ranks[1]["period_s"][7]) / 2)


def test_verdict_words():
    assert verdict({"point": 0.08, "low": 0.05, "high": 0.11}, 0.03) == "slower"
    assert verdict({"point": 0.03, "low": 0.01, "high": 0.05}, 0.03) == "cannot tell"
    assert verdict({"point": 0.0, "low": -0.02, "high": 0.02}, 0.03) == "no change"
    assert verdict({"point": -0.08, "low": -0.11, "high": -0.05}, 0.03) == "faster"


def test_limits_parse_and_configs_load(tmp_path):
    assert parse_share("3%") == parse_share("3 %") == parse_share(0.03) == parse_share(3) == pytest.approx(0.03)
    assert parse_share("2pp") == pytest.approx(0.02) and parse_share("0.5") == 0.5
    with pytest.raises(ValueError, match="not a share"):
        parse_share("three")
    assert phase_key("data-wait") == phase_key("data_wait") == "data_wait_s"
    toml = tmp_path / "pyproject.toml"
    toml.write_text(
        '[project]\nname = "x"\n\n[tool.ranksight.gate]\nstep_time = "5%"\nconfidence = 0.9\n'
        '[tool.ranksight.gate.phases]\ndata_wait = "2pp"\ncomm_exposed = 0.04\n'
    )
    assert load_config(str(toml)) == GateConfig(0.05, {"data_wait_s": 0.02, "comm_exposed_s": 0.04}, 0.9)
    yaml_file = tmp_path / "gate.yaml"
    yaml_file.write_text("gate:\n  step_time: 3%\n  phases:\n    optimizer: 1pp\n")
    assert load_config(str(yaml_file)) == GateConfig(0.03, {"optimizer_s": 0.01})
    yaml_file.write_text("step_time: 3%\nphases:\n  warp_drive: 1pp\n")
    with pytest.raises(ValueError, match="unknown phase"):
        load_config(str(yaml_file))
    (tmp_path / "bad.toml").write_text("[tool.ranksight]\nx = 1\n")
    with pytest.raises(ValueError, match="no \\[tool.ranksight.gate\\]"):
        load_config(str(tmp_path / "bad.toml"))


def _samples(rng, run, ranks=2, n=200, stretch=1.0, data_s=0.0, world=None):
    """A run's samples as ``read_samples`` returns them: each rank's steps with the thread's CPU seconds, the
    step's own work taking ``stretch`` wall seconds per CPU second (a busier host stretches it, and the wait
    for peers at the all-reduce with it)."""
    from ranksight.commands._gate_samples import Samples

    out = Samples(run=run, world_size=world or ranks)
    for r in range(ranks):
        s = _series(rng, n=n, data_s=data_s, drift=0.01)
        cpu = s["compute_s"].copy()
        s["compute_s"] = s["compute_s"] * stretch
        s["comm_exposed_s"] = s["comm_exposed_s"] * stretch  # the wait for a peer whose work stretched too
        s["period_s"] = s["data_wait_s"] + s["compute_s"] + s["comm_exposed_s"]
        out.ranks[r] = {**s, "cpu_s": cpu, "on_gpu": np.zeros(n)}
    return out


def test_assess_gates_a_planted_slowdown_and_says_why_runs_cannot_be_compared():
    from ranksight.commands._gate import assess

    rng = np.random.default_rng(6)
    gate = GateConfig(step_time=0.03)
    a = _samples(rng, "a")
    slow = assess(a, _samples(rng, "b", data_s=0.002), {}, gate, 5)
    assert slow["status"] == "fail" and slow["exit_code"] == 1 and slow["verdict"] == "slower"
    assert slow["attribution"][0]["phase"] == "data_wait_s" and slow["attribution"][0]["moved"]
    assert set(slow["ranks"]) == {"0", "1"} and all(r["verdict"] == "slower" for r in slow["ranks"].values())
    assert slow["failed"][0]["interval"] == slow["job"]["step"]["explained"]
    same = assess(a, _samples(rng, "c"), {}, gate, 5)
    assert same["status"] == "pass" and same["verdict"] == "no change"
    short = assess(a, _samples(rng, "d", n=40), {}, gate, 5)
    assert short["exit_code"] == 2 and short["reason"].startswith("too few steps to decide: B (d) keeps 35")
    other = assess(a, _samples(rng, "e", world=4), {}, gate, 5)
    assert other["exit_code"] == 2 and other["reason"] == "different world sizes: A has 2 ranks, B 4"
    apart = _samples(rng, "f")
    apart.ranks = {2: apart.ranks[0], 3: apart.ranks[1]}
    assert assess(a, apart, {}, gate, 5)["reason"] == "no rank in both runs (A: [0, 1], B: [2, 3])"


def test_a_busier_host_passes_and_says_why_but_a_slower_input_on_it_fails():
    from ranksight.commands._gate import assess

    rng = np.random.default_rng(8)
    gate = GateConfig(step_time=0.03)
    a = _samples(rng, "a")
    busy = assess(a, _samples(rng, "b", stretch=1.4), {}, gate, 5)  # the same code on a host 40 % busier
    assert busy["job"]["step"]["change"]["low"] > 0.1  # the wall clock alone would fail it
    assert busy["job"]["step"]["host_stretch"]["point"] == pytest.approx(1.4, rel=0.03)
    assert abs(busy["job"]["step"]["explained"]["point"]) < 0.01
    assert busy["status"] == "pass" and busy["exit_code"] == 0 and busy["verdict"] == "cannot tell"
    assert "every phase of its own work moved with it (x1.3" in busy["verdict_reason"]
    # A slower input on a busier host fails, with the data wait named first; so on a host twice as busy.
    for stretch in (1.4, 2.0):
        both = assess(a, _samples(rng, "c", stretch=stretch, data_s=0.002), {}, gate, 5)
        assert both["status"] == "fail" and both["verdict"] == "slower"
        assert both["job"]["step"]["explained"]["low"] > 0.03
        assert both["attribution"][0]["phase"] == "data_wait_s" and both["attribution"][0]["moved"]
    quieter = assess(a, _samples(rng, "d", stretch=0.8, data_s=0.002), {}, gate, 5)  # a quieter host hides it
    assert quieter["job"]["step"]["change"]["high"] < 0.03 and quieter["status"] == "fail"


def _profile(n=200, **phases):
    """A series whose phases are constant (seconds per step), for the stretch arithmetic."""
    out = {"step": np.arange(n)}
    for p in COLUMNS[1:]:
        out[p] = np.full(n, float(phases.get(p[:-2], 0.0)))
    out["h2d_s"] = np.full(n, np.nan)
    out["period_s"] = sum(np.nan_to_num(out[p]) for p in COLUMNS[1:])
    return out


def test_the_host_stretch_is_what_most_of_the_work_both_runs_share_did():
    from ranksight.commands._gate_stats import host_stretch

    def stretch(a, b):
        return host_stretch({k: v[:1] for k, v in a.items()}, {k: v[:1] for k, v in b.items()})[0]

    a = _profile(data_wait=0.001, compute=0.010, comm_exposed=0.008, optimizer=0.001, other=0.001)
    assert stretch(a, _profile(data_wait=0.0013, compute=0.013, comm_exposed=0.002, optimizer=0.0013,
                               other=0.0013)) == pytest.approx(1.3)  # fmt: skip
    # A data wait the code made 5x longer does not move it; nor the exposed wait, whatever it did.
    assert stretch(a, _profile(data_wait=0.005, compute=0.010, comm_exposed=0.02, optimizer=0.001,
                               other=0.001)) == pytest.approx(1.0)  # fmt: skip
    # A data wait that was 90 % of A's own work and is 20 % of B's: the code's, not a host 30x quieter.
    slow_input = _profile(data_wait=0.090, compute=0.010, other=0.001)
    fixed = _profile(data_wait=0.003, compute=0.010, other=0.001)
    assert stretch(slow_input, fixed) == pytest.approx(1.0)
    assert stretch(fixed, slow_input) == pytest.approx(1.0)


def test_compute_and_the_exposed_wait_trading_places_is_no_change():
    # Which rank a busy host slows moves time between compute and the wait for the slower peer; the step's
    # own work stretches alike: the phases explain nothing, whatever the step did.
    a = _profile(data_wait=0.0002, compute=0.006, comm_exposed=0.004, optimizer=0.0002, other=0.0002)
    b = _profile(data_wait=0.00025, compute=0.0075, comm_exposed=0.0034, optimizer=0.00025, other=0.00025)
    out = compare_series(a, b, 0.95)
    assert out["step"]["change"]["point"] == pytest.approx(0.099, abs=0.001)
    assert out["step"]["explained"]["point"] == pytest.approx(0.0, abs=1e-9)
    assert "excess" not in out["phases"]["comm_exposed_s"]
    # The phases' parts beyond the stretch add up to what they explain.
    b = _profile(data_wait=0.0012, compute=0.0075, comm_exposed=0.0034, optimizer=0.00025, other=0.00025)
    out = compare_series(a, b, 0.95)
    parts = sum(p["excess"]["point"] for p in out["phases"].values() if "excess" in p)
    assert parts == pytest.approx(out["step"]["explained"]["point"])
    assert out["phases"]["data_wait_s"]["excess"]["point"] == pytest.approx((0.0012 / 1.25 - 0.0002) / 0.0106)


def test_judge_words_and_reasons():
    from ranksight.commands._gate import judge

    def series(change, explained):
        mk = lambda lo, hi: {"point": (lo + hi) / 2, "low": lo, "high": hi}  # noqa: E731
        return {"step": {"change": mk(*change), "explained": mk(*explained), "host_stretch": mk(1.2, 1.2)}}

    assert judge(series((-0.05, 0.02), (0.06, 0.09)), 0.03) == ("slower", None)  # a quieter host hid it
    assert judge(series((0.0, 0.02), (-0.09, -0.05)), 0.03) == ("faster", None)
    assert judge(series((-0.02, 0.02), (-0.01, 0.01)), 0.03) == ("no change", None)
    word, why = judge(series((0.06, 0.14), (-0.01, 0.01)), 0.03)  # the step moved, no phase beyond the rest
    assert word == "cannot tell" and "moved with it (x1.20)" in why and "rerun" in why
    word, why = judge(series((0.06, 0.14), (0.02, 0.04)), 0.03)
    assert word == "cannot tell" and "only in part" in why


def test_a_change_that_slows_every_phase_alike_reads_as_the_host():
    # The limit of judging shares: a model 10 % slower in all its own work, on a quiet host, moves no phase
    # beyond the rest. The gate says so instead of failing or passing it silently.
    from ranksight.commands._gate import judge

    a = _profile(data_wait=0.0002, compute=0.008, comm_exposed=0.001, optimizer=0.0005, other=0.0003)
    b = _profile(data_wait=0.00022, compute=0.0088, comm_exposed=0.001, optimizer=0.00055, other=0.00033)
    out = compare_series(a, b, 0.95)
    assert out["step"]["change"]["point"] == pytest.approx(0.09, abs=0.005)
    assert judge(out, 0.03)[0] == "cannot tell"
