"""The Streamlit dashboard: per-rank heatmaps, step-time breakdown, diagnosis, run comparison."""

__all__: list[str] = []
