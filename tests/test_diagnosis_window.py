"""`diagnose --since`: the recent window's verdict, and since when it differs from the whole run's.
Also: a data wait nobody measured is NULL all the way to the output, never 0 %."""

from __future__ import annotations

import json
import os
import time

import pytest

from ranksight.cli import main
from ranksight.collectors import open_run
from ranksight.collectors._queries import step_breakdown
from ranksight.rules import diagnose

from .test_diagnose import _identity, _write

T0 = 1_790_000_000 * 10**9  # a fixed wall clock (ns)


def _run(tmp_path, phases: list[tuple[int, float, float | None]], ranks: int = 2) -> str:
    """A run whose steps come in phases of (steps, wall s, data wait s or None); time_ns is their end."""
    run = str(tmp_path / "run-1")
    os.makedirs(os.path.join(run, "ranks"), exist_ok=True)
    for rank in range(ranks):
        rows, t, step = [], T0, 0
        for count, wall, wait in phases:
            for _ in range(count):
                t += int(wall * 1e9)
                compute = wall - (wait or 0.0) - 0.003
                rows.append(
                    {"step": step, "time_ns": t, "step_s": wall, "data_wait_s": wait, "compute_s": compute,
                     "comm_exposed_s": 0.001, "allreduce_s": 0.002, "optimizer_s": 0.001, "other_s": 0.001,
                     "buckets": 1, "bucket_bytes": 1 << 20}
                )  # fmt: skip
                step += 1
        _write(run, "steps", rank, rows, ranks)
        meta = {**_identity(rank, ranks), "status": "finished", "heartbeat_ns": 1, "steps": step}
        meta["ddp"] = {"find_unused_parameters": False, "bucket_cap_bytes": 25 << 20, "backend": "gloo"}
        with open(os.path.join(run, "ranks", f"rank-{rank:05d}.json"), "w") as f:
            json.dump(meta, f)
    return run


def _clock(step_end_ns: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(step_end_ns / 1e9))


def test_the_recent_window_is_judged_and_the_change_dated(tmp_path):
    # 60 healthy steps of 200 ms, then the loader slows: 15 steps of 300 ms, 100 ms of it waiting.
    run = _run(tmp_path, [(60, 0.2, 0.0), (15, 0.3, 0.1)])
    whole = diagnose(run)
    assert [f for f in whole["findings"] if f["severity"] != "info"] == []
    recent = diagnose(run, since_s=3)
    first = recent["findings"][0]
    assert (first["rule"], first["severity"]) == ("input-bound", "critical")
    assert first["evidence"]["data_wait_share"] == pytest.approx(1 / 3, rel=0.01)
    assert recent["window"]["steps"] == 10 and recent["window"]["since_s"] == 3
    change = recent["change"]
    onset = T0 + int(60 * 0.2e9) + int(0.3e9)  # the end of the first slow step
    assert change["changed"] and change["since_ns"] == onset
    assert change["now"] == {"rule": "input-bound", "severity": "critical"} and change["before"] is None
    assert (
        change["text"]
        == f"input-bound since {_clock(onset)}, step time 200 → 300 ms (whole run: no warning or critical finding)"
    )
    assert recent["whole_run"]["findings"] == whole["findings"]


def test_an_unchanged_verdict_says_so(tmp_path):
    run = _run(tmp_path, [(40, 0.3, 0.1)])
    change = diagnose(run, since_s=2)["change"]
    assert not change["changed"] and change["text"].startswith("unchanged: the whole run says the same (input-bound)")


def test_since_on_the_command_line(tmp_path, capsys):
    run = _run(tmp_path, [(60, 0.2, 0.0), (15, 0.3, 0.1)])
    assert main(["diagnose", run, "--since", "3s"]) == 0
    text = capsys.readouterr().out
    assert "Window: the last 3 s of the run's data" in text and "Change: input-bound since" in text
    assert text.index("Change:") < text.index("Verdict: [CRITICAL] data_pipeline / input-bound")
    assert main(["diagnose", run, "--since", "3s", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"window", "change", "whole_run"} <= set(out) and out["change"]["changed"] is True
    assert main(["diagnose", run, "--since", "soon"]) == 2
    assert "--since needs a positive duration" in capsys.readouterr().err


def test_a_data_wait_nobody_measured_is_null_not_zero(tmp_path, capsys):
    run = _run(tmp_path, [(30, 0.2, None)])
    row = step_breakdown(open_run(run))[0]
    assert row["data_wait_share"] is None and row["data_wait_host_share"] is None
    assert row["compute_share"] == pytest.approx(0.197 / 0.2, rel=0.01)
    result = diagnose(run)
    first = result["findings"][0]
    assert (first["rule"], first["severity"], first["ranks"]) == ("input-not-measured", "info", [0, 1])
    assert "mon.loader()" in first["fix"]["text"]
    assert main(["diagnose", run]) == 0
    table = capsys.readouterr().out.split("Step-time breakdown")[1]
    rank0 = next(line for line in table.splitlines() if line.startswith("0 "))
    assert "–" in rank0.split()[4] and "0.0%" not in rank0
    assert main(["summary", run]) == 0
    summary = capsys.readouterr().out
    rank0 = next(line for line in summary.splitlines() if line.startswith("0 "))
    assert " – " in rank0 and "0.0%" not in rank0.split()[4]
