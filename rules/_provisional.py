"""When a verdict is provisional: judged from too few steps after warm-up for its figures to have settled.

One constant, read by ``ranksight diagnose`` and the dashboard alike, so both call the same verdict provisional.
Why a floor at all: a live run is judged from its first flushed steps, and medians and shares of a handful of
steps swing with one slow batch (a healthy 2-rank demo read ``input-bound``, critical, from 3 steps after
warm-up). The findings are shown as computed; the label says how many steps they rest on.
"""

from __future__ import annotations

PROVISIONAL_BELOW_STEPS = 50
"""A verdict that rests on fewer steps after warm-up than this (on its least-measured rank) is provisional."""


def provisional(diagnosis: dict, minimum: int = PROVISIONAL_BELOW_STEPS) -> int | None:
    """The steps after warm-up the verdict rests on when they are fewer than ``minimum`` (it is provisional),
    else None: the recent window's, or the fewest any rank contributed (0 before any)."""
    window = diagnosis.get("window")
    if isinstance(window, dict) and isinstance(window.get("steps"), int):
        steps = window["steps"]
    else:
        ranks = (diagnosis.get("breakdown") or {}).get("ranks") or []
        steps = min((r["steps"] for r in ranks if isinstance(r.get("steps"), int)), default=0)
    return steps if steps < minimum else None


def provisional_text(steps: int, minimum: int = PROVISIONAL_BELOW_STEPS) -> str:
    """The one line both the CLI and the dashboard print above a provisional verdict."""
    unit = "step" if steps == 1 else "steps"
    return f"provisional: rests on {steps} {unit} after warm-up (a verdict settles from {minimum})"
