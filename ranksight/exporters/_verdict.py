"""The verdict as a tracker shows it: a summary of the first finding, a findings table, a per-rank breakdown,
and the run's report files (the JSON of ``ranksight diagnose --json`` and the text ``ranksight diagnose`` prints)."""

from __future__ import annotations

import json
import time

FINDING_COLUMNS = (
    "order",
    "severity",
    "axis",
    "rule",
    "confidence",
    "cost_share",
    "speedup",
    "ranks",
    "summary",
    "fix",
)
BREAKDOWN_COLUMNS = (
    "rank", "steps", "step_median_s", "data_wait_share", "h2d_share", "compute_share", "comm_exposed_share",
    "optimizer_share", "other_share", "allreduce_share",
)  # fmt: skip


def _ranks(f: dict) -> str:
    return ",".join(str(r) for r in f.get("ranks") or [])


def verdict_summary(result: dict) -> dict:
    """The first warning-or-worse finding's fields (``axis``, ``rule``, cost, ranks, fix), or ``rule: none``."""
    serious = [f for f in result.get("findings", []) if f.get("severity") != "info"]
    if not serious:
        return {
            "rule": "none",
            "summary": "no warning or critical finding: nothing in the rules says this run is held back",
        }
    f = serious[0]
    out = {
        "axis": f["axis"],
        "rule": f["rule"],
        "severity": f["severity"],
        "confidence": f.get("confidence"),
        "cost_share": f.get("cost_share"),
        "speedup": f.get("speedup"),
        "cost_basis": f.get("cost_basis"),
        "ranks": _ranks(f),
        "summary": f.get("summary", ""),
        "fix": (f.get("fix") or {}).get("text", ""),
    }
    return {k: v for k, v in out.items() if v is not None}


def finding_rows(result: dict) -> list[list]:
    """Every finding, worst first, as rows of ``FINDING_COLUMNS``."""
    return [
        [i + 1, f["severity"], f["axis"], f["rule"], f.get("confidence"), f.get("cost_share"), f.get("speedup"),
         _ranks(f), f.get("summary", ""), (f.get("fix") or {}).get("text", "")]
        for i, f in enumerate(result.get("findings", []))
    ]  # fmt: skip


def breakdown_rows(result: dict) -> list[list]:
    """The per-rank step breakdown the verdict rests on, as rows of ``BREAKDOWN_COLUMNS``."""
    return [[r.get(c) for c in BREAKDOWN_COLUMNS] for r in result.get("breakdown", {}).get("ranks", [])]


def report_files(result: dict, run_path: str) -> dict[str, str]:
    """``report.json`` (``diagnose --json``'s object) and ``report.txt`` (what ``ranksight diagnose``
    prints): the same report wherever the run is read."""
    from ranksight.commands.diagnose import render_report

    return {
        "report.json": json.dumps(result, indent=1, default=str),
        "report.txt": render_report(result, run_path) + "\n",
    }


def wait_for_ranks(run_path: str, timeout_s: float) -> None:
    """Until every rank said its last word (or stopped beating) or ``timeout_s`` passed: the verdict then sees
    each rank's last flush."""
    from ranksight.collectors import rank_is_live, read_rank_meta

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            metas = read_rank_meta(run_path)
        except Exception:
            metas = []
        world = max((int(m.data.get("world_size") or 0) for m in metas), default=0)
        if metas and len(metas) >= world and not any(rank_is_live(m) for m in metas):
            return
        time.sleep(0.2)


def diagnose_run(run_path: str, warmup_steps: int) -> dict:
    """The run's verdict (``ranksight.rules.diagnose``), imported only when asked for."""
    from ranksight.rules import diagnose

    return diagnose(run_path, warmup_steps=warmup_steps)
