"""What a path on the command line may be: a run, a folder of runs (its latest run), a bare run id; and the
one-line errors for everything else. Every command goes through ``ranksight.commands._paths``.

The real CLI runs in a subprocess on runs written with the real schema; ``ranksight run`` trains the docs'
plain example script under the agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_dashboard import write_run
from tests.test_integration_support import example

RANKSIGHT = [sys.executable, "-m", "ranksight"]


def _cli(args: list[str], cwd, env: dict | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    return subprocess.run(
        RANKSIGHT + args,
        cwd=str(cwd),
        env={**base, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture
def root(tmp_path):
    """./ranksight-runs with an older run (input-bound) and a newer one (healthy)."""
    runs = tmp_path / "ranksight-runs"
    write_run(str(runs / "older-run"), 2, 12, data_wait_s=0.2)
    write_run(str(runs / "newer-run"), 2, 12, data_wait_s=0.001)
    return runs


def test_summary_of_a_folder_of_runs_uses_the_latest_and_says_so(root):
    out = _cli(["summary", "ranksight-runs"], root.parent)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == "ranksight: using the latest run under ranksight-runs: newer-run (finished)"
    assert "Step-time breakdown per rank (7 steps after 5 warm-up)" in out.stdout
    # With no argument at all: the default folder, the same run.
    bare = _cli(["summary"], root.parent)
    assert bare.returncode == 0 and bare.stdout == out.stdout and "newer-run" in bare.stderr


def test_a_bare_run_id_is_found_under_the_default_root_or_ranksight_run_dir(root, tmp_path):
    here = _cli(["summary", "older-run"], root.parent)
    assert here.returncode == 0 and here.stderr == "", here.stderr  # a run named exactly: nothing to announce
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = _cli(["summary", "older-run"], elsewhere, env={"RANKSIGHT_RUN_DIR": str(root)})
    assert moved.returncode == 0 and moved.stdout == here.stdout
    missing = _cli(["summary", "older-run"], elsewhere)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "older-run: no such run folder, and no run of that id under ranksight-runs" in missing.stderr


def test_diagnose_and_compare_take_the_same_arguments(root):
    latest = _cli(["diagnose", "ranksight-runs", "--json"], root.parent)
    assert latest.returncode == 0, latest.stderr
    assert "latest run under ranksight-runs: newer-run" in latest.stderr
    by_id = _cli(["diagnose", "older-run", "--json"], root.parent)
    assert by_id.returncode == 0, by_id.stderr
    rules = [f["rule"] for f in json.loads(by_id.stdout)["findings"]]
    assert "input-bound" in rules and "input-bound" not in [f["rule"] for f in json.loads(latest.stdout)["findings"]]
    compared = _cli(["compare", "older-run", "newer-run", "--json"], root.parent)
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    assert [f["rule"] for f in result["findings"]["disappeared"]] == ["input-bound"]


def test_missing_paths_and_files_are_one_line_errors(root, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        ("runs", "nosuchdir"): "nosuchdir: no such folder",
        ("dashboard", "nosuchdir"): "nosuchdir: no such run folder",
        ("summary", "nosuchdir"): "nosuchdir: no such run folder",
        ("diagnose", "nosuchdir"): "nosuchdir: no such run folder",
        ("runs", str(a_file)): "not a directory",
        ("dashboard", str(a_file)): "not a directory",
        ("summary", str(a_file)): "not a directory",
        ("summary", str(empty)): f"no runs under {empty}",
    }
    for (command, path), message in cases.items():
        out = _cli([command, path], root.parent)
        assert out.returncode == 2, (command, path, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and message in out.stderr, (command, path, out.stderr)
        assert out.stderr.startswith(f"ranksight {command}: ")
    listed = _cli(["runs"], root.parent)
    assert listed.returncode == 0 and listed.stdout.index("newer-run") < listed.stdout.index("older-run")


@pytest.mark.slow
def test_run_ends_with_the_verdict_and_the_dashboard_command(tmp_path):
    pytest.importorskip("torch")
    out = _cli(
        ["run", "--run-dir", "runs", "--run-id", "slow-loader", "--", sys.executable, example("plain_train.py")]
        + ["--steps", "10", "--slow-data"],
        tmp_path,
        env={"OMP_NUM_THREADS": "1", "RANKSIGHT_FLUSH_INTERVAL_S": "0.5"},
        timeout_s=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_path = os.path.join(os.path.abspath(tmp_path), "runs", "slow-loader")
    last_two = out.stderr.strip().splitlines()[-2:]
    assert last_two[0].startswith("ranksight run: verdict: [") and "input-bound" in last_two[0], out.stderr
    assert "fixing this could make steps up to" in last_two[0]
    assert last_two[1] == f"ranksight run: dashboard: ranksight dashboard {run_path}"
