"""Text tables for the terminal (no dependency beyond the standard library)."""

from __future__ import annotations


def pct(x) -> str:
    """Format a 0-1 ratio as a percentage, or '-' when absent."""
    return "-" if x is None else f"{100 * x:5.1f}%"


def ms(x) -> str:
    """Format seconds as milliseconds, or '-' when absent."""
    return "-" if x is None else f"{1000 * x:8.2f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
