"""The dashboard server's entry point: start the warm-up of the run it opens first, then Streamlit.

``python -m ranksight.dashboard._launch <streamlit run options>`` is what ``serve_command`` starts;
it is ``streamlit run app.py`` plus :mod:`._warm` running in the same process beforehand.
"""

from __future__ import annotations

import os
import sys

from ranksight.collectors import list_runs

from ._serve import APP_PATH
from ._source import from_env


def first_run_path() -> str | None:
    """The run the landing page will open: the one named on the command line, else the newest."""
    source = from_env()
    if source.prometheus and not os.path.isdir(source.root):
        return None
    if source.run:
        return os.path.join(source.root, source.run)
    runs = list_runs(source.root)
    return runs[0]["path"] if runs else None


def main(argv: list[str]) -> int:
    try:
        path = first_run_path()
        if path:
            from . import _warm

            _warm.start(path)
    except Exception:  # a warm-up is an optimisation: the pages do the same work and report problems
        pass
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", APP_PATH, *argv]
    return cli.main(prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
