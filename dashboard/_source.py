"""Where the dashboard reads from: a folder of runs, one run, or a Prometheus server.

The ``ranksight dashboard`` command passes its arguments through environment variables, so the
app script, ``AppTest`` and a plain ``streamlit run`` all read them the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ranksight.format.schema import RANKS_DIR

ENV_PATH = "RANKSIGHT_DASHBOARD_PATH"
ENV_PROMETHEUS = "RANKSIGHT_DASHBOARD_PROMETHEUS"
ENV_REFRESH = "RANKSIGHT_DASHBOARD_REFRESH_S"
DEFAULT_ROOT = "ranksight-runs"


@dataclass(frozen=True)
class Source:
    """The runs root, the run to open first (a folder name under it, or None) and an optional Prometheus."""

    root: str
    run: str | None = None
    prometheus: str | None = None
    refresh_s: float = 2.0


def resolve(path: str | None, prometheus: str | None = None, refresh_s: float = 2.0) -> Source:
    """Turn a run folder or a runs root into a Source (a run folder opens that run first)."""
    path = os.path.abspath(path or DEFAULT_ROOT)
    if os.path.isdir(os.path.join(path, RANKS_DIR)):
        return Source(os.path.dirname(path), os.path.basename(path), prometheus or None, refresh_s)
    return Source(path, None, prometheus or None, refresh_s)


def from_env() -> Source:
    """The Source the command line asked for (default: ./ranksight-runs)."""
    try:
        refresh_s = max(0.5, float(os.environ.get(ENV_REFRESH, "2")))
    except ValueError:
        refresh_s = 2.0
    return resolve(os.environ.get(ENV_PATH), os.environ.get(ENV_PROMETHEUS), refresh_s)
