"""``diagnose(run_path)``: read a run, compute its features, apply the rules (the one place that does I/O)."""

from __future__ import annotations

import os

from ranksight.collectors import RunDirError, compute_features, open_run, read_rank_meta, step_breakdown

from ._evaluate import evaluate, run_checklist
from ._load import load_rules


def diagnose(run_path: str, rules_dir: str | None = None, *, warmup_steps: int = 5) -> dict:
    """Diagnose a run directory (live, finished or crashed); the object ``ranksight diagnose --json`` prints.

    Raises RunDirError for a path that is not a run (or has nothing recorded yet) and RuleError for bad
    rule files.
    """
    rules = load_rules(rules_dir)  # bad rules are reported before any data is read
    con = open_run(run_path)
    metas = read_rank_meta(run_path)
    breakdown = step_breakdown(con, warmup_steps=warmup_steps)
    if not metas and not breakdown:
        raise RunDirError(f"{run_path}: no rank has recorded anything yet")
    features = compute_features(con, metas, warmup_steps, breakdown)
    run_ids = sorted({m.data.get("run") for m in metas if m.data.get("run")})
    return {
        "run": run_ids[0] if len(run_ids) == 1 else os.path.basename(os.path.normpath(run_path)),
        "findings": evaluate(rules.rules, features),
        "breakdown": {"ranks": breakdown},
        "checklist": run_checklist(rules.checklist, features),
    }


def diagnose_features(run_path: str, *, warmup_steps: int = 5) -> dict[int, dict]:
    """The per-rank features ``diagnose`` judges (for ``ranksight diagnose --features`` and tuning)."""
    con = open_run(run_path)
    return compute_features(con, read_rank_meta(run_path), warmup_steps)
