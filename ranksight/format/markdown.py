"""Markdown tables, one layout for every reader that writes one: a tracker's text panel (TensorBoard renders
it) and the dashboard's landing page (Streamlit's markdown element draws it, where ``st.table`` would have
the browser load Arrow's table code). Each caller says how a cell is written."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def plain_cell(value: object) -> str:
    """A cell as a tracker shows it: a float to four significant digits, None as a dash, on one line, its
    ``|`` escaped (the rest of the text is the caller's: rule ids, figures)."""
    if isinstance(value, float):
        value = f"{value:.4g}"
    return "–" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], cell: Callable[[object], str] = plain_cell
) -> str:
    """A markdown table of ``rows`` (one value per column each) under the ``columns`` headers, each value
    written by ``cell``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
