"""Text tables for the terminal (no dependency beyond the standard library)."""

from __future__ import annotations

ABSENT = "–"
"""How a figure the run could not measure prints (never as 0)."""


def pct(x) -> str:
    """Format a 0-1 ratio as a percentage, or '–' when absent (not measured)."""
    return ABSENT if x is None else f"{100 * x:5.1f}%"


def ms(x) -> str:
    """Format seconds as milliseconds, or '–' when absent."""
    return ABSENT if x is None else f"{1000 * x:8.2f}"


def speedup(cost_share) -> str:
    """'fixing this could make steps up to 1.4× faster' for a cost share (0-1); '' when unknown."""
    if cost_share is None or cost_share <= 0:
        return ""
    times = 1 / (1 - cost_share)
    return (
        f"fixing this could make steps up to {times:.2f}× faster"
        if times < 1.1
        else (f"fixing this could make steps up to {times:.1f}× faster")
    )


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
