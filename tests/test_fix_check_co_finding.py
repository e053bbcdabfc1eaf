"""benchmarks/fix_check.py --co-finding reproduces, from the committed runs, a figure that
benchmarks/results/benchmarks_history.md keeps: launch-bound's stated cost on the fixed-rows fragmentation plant
against what packing the lengths gave back."""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results"


def _fix_check():
    spec = importlib.util.spec_from_file_location("fix_check", RESULTS.parent / "fix_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unpack(tar: str, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(RESULTS / tar) as t:
        t.extractall(dest, filter="data")
    return dest


def test_co_finding_prices_launch_bound_against_the_packed_plant(tmp_path):
    probe = _unpack("gpu1_frag_probe.tar", tmp_path / "probe")
    fragtok = _unpack("gpu1_fragtok.tar", tmp_path / "fragtok")
    out = tmp_path / "co.json"
    before = sorted(str(p) for p in probe.glob("*.json"))
    after = [str(fragtok / "gpu1_fragtok_k0_l0.5.json"), str(RESULTS / "gpu1_frag_tokens.json")]
    args = [*before, "--co-finding", "launch-bound", "--after", *after, "--work-ratio", "1.56", "--json", str(out)]
    assert _fix_check().main(args) == 0
    row = json.loads(out.read_text())["co_finding"]
    documented = json.loads((RESULTS / "gpu1_launch_bound_by_packing.json").read_text())["co_finding"]
    for key in ("named_in", "runs_before", "runs_after", "cost_stated", "gain", "diff_pp"):
        assert row[key] == documented[key], key
    assert row["named_in"] < row["runs_before"]  # a finding the plant did not mean: not in every run


def test_co_finding_without_the_rule_in_the_runs_before_says_so(tmp_path, capsys):
    after = str(RESULTS / "gpu1_frag_tokens.json")
    assert _fix_check().main([after, "--co-finding", "cpu-ops", "--after", after]) == 1
    assert "no cpu-ops finding" in capsys.readouterr().out
