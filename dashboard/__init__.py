"""The Streamlit dashboard: per-rank heatmaps, step-time breakdown, diagnosis, run comparison.

Importing this package needs neither Streamlit nor torch: the query functions (``_queries``) and the
rollup (``_rollup``) are plain DuckDB code; only ``app.py``, ``_data``, ``_view`` and ``_pages/`` import Streamlit.
"""

from ._rollup import Rollup
from ._serve import APP_PATH, serve_command, serve_env
from ._source import Source, resolve

__all__ = ["APP_PATH", "Rollup", "Source", "resolve", "serve_command", "serve_env"]
