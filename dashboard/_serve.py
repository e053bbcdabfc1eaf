"""Build the ``streamlit run`` command line that serves the dashboard (used by the CLI, tests and benchmark)."""

from __future__ import annotations

import os
import sys

APP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "app.py")


def serve_env(path: str | None, prometheus: str | None = None, refresh_s: float = 2.0) -> dict[str, str]:
    """Environment for the server process: where to read runs from."""
    from ._source import ENV_PATH, ENV_PROMETHEUS, ENV_REFRESH

    env = dict(os.environ)
    env[ENV_PATH] = os.path.abspath(path or "ranksight-runs")
    env[ENV_REFRESH] = str(refresh_s)
    if prometheus:
        env[ENV_PROMETHEUS] = prometheus
    else:
        env.pop(ENV_PROMETHEUS, None)
    return env


def serve_command(port: int = 8501, host: str = "127.0.0.1") -> list[str]:
    """``streamlit run`` on the app (through ``_launch``, which first starts the warm-up of the run the
    landing page opens): headless, bound to ``host`` (loopback by default), usage stats off."""
    return [
        sys.executable,
        "-m",
        "ranksight.dashboard._launch",
        "--server.headless",
        "true",
        "--server.address",
        host,
        "--server.port",
        str(int(port)),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--global.developmentMode",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--theme.base",
        "light",
        # Streamlit runs a full gc.collect(2) after every script run, a live page's clock ticks included: over
        # the heap pandas, DuckDB and Altair make, the largest part of a watched run's server CPU (py-spy).
        "--runner.postScriptGC",
        "false",
    ]
