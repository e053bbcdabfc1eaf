"""The Streamlit dashboard: per-rank heatmaps, step-time breakdown, diagnosis, run comparison.

Importing this package needs neither Streamlit nor torch: the query functions (``_queries``) and the
rollup (``_rollup``) are plain DuckDB code; only ``app.py``, ``_data``, ``_view`` and ``_pages/`` import Streamlit.
"""

from ._compare import compare, speedup_sentence
from ._queries import fix_gain_text
from ._rollup import Rollup
from ._serve import APP_PATH, serve_command, serve_env
from ._source import Source, resolve
from ._verdict_rows import split_checklist

__all__ = [
    "APP_PATH",
    "Rollup",
    "Source",
    "compare",
    "fix_gain_text",
    "resolve",
    "serve_command",
    "serve_env",
    "speedup_sentence",
    "split_checklist",
]
