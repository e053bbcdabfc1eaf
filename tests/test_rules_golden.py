"""The engine's findings and checklist on ~2,100 inputs are the golden ones (``tests/_rules_golden.py``):
every finding, its order, severity, ranks, cost, confidence, evidence and text; floats within 1e-6."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from ._rules_golden import GOLDEN, cases, judge


def _same(got, want, where: str) -> None:
    assert type(got) is type(want) or {type(got), type(want)} <= {int, float} and None not in (got, want), (
        f"{where}: {got!r} != {want!r}"
    )
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, float) and isinstance(want, float), f"{where}: {got!r} != {want!r} (int vs float)"
        if math.isnan(want):
            assert math.isnan(got), f"{where}: {got!r} != nan"
        else:
            assert got == pytest.approx(want, rel=1e-6, abs=1e-6), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_findings_and_checklist_are_the_golden_ones():
    with gzip.open(GOLDEN, "rt") as f:
        golden = json.load(f)
    seen = 0
    for name, rules, checklist, feats, context in cases():
        # Through JSON as the golden file went (dict keys as strings, tuples as lists).
        got = json.loads(json.dumps(judge(rules, checklist, feats, context), sort_keys=True))
        _same(got, golden[name], name)
        seen += 1
    assert seen == len(golden) > 2000


def test_a_feature_added_since_moves_no_golden_input(monkeypatch):
    """Every sample name is a feature, so a new sample is a new feature: the seeded draws must not shift with
    it (which would change the inputs and fail this golden with the engine unchanged); the new figure reads
    None in every input, as it does on a run that does not have it."""
    from . import _rules_golden, test_severity_invariant

    def drawn() -> dict:
        return {name: feats for name, _, _, feats, _ in cases() if name.startswith(("severity/", "ranks/"))}

    before = drawn()
    extra = (*_rules_golden.FEATURES, "a_feature_added_since")
    monkeypatch.setattr(_rules_golden, "FEATURES", extra)
    monkeypatch.setattr(test_severity_invariant, "FEATURES", extra)
    after = drawn()
    assert len(before) == len(after) == 1800
    for name, feats in after.items():
        assert all(f.pop("a_feature_added_since") is None for f in feats.values()), name
        assert feats == before[name], name
