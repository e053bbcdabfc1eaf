"""What a path on the command line means: one resolver for every subcommand that takes a run or a folder of runs.

A user types whatever they have at hand: a run folder, the folder of runs (``ranksight-runs``), or the
run id that ``ranksight runs`` printed. Each command resolves it here, so they all accept the same
things and fail with the same one-line errors (``UserError``: exit 2).
"""

from __future__ import annotations

import os
import sys

from ranksight.collectors import list_runs
from ranksight.format.schema import RANKS_DIR

from ._errors import UserError

DEFAULT_ROOT = "ranksight-runs"


def default_root() -> str:
    """The folder of runs when none is given: ``RANKSIGHT_RUN_DIR`` (as the agent uses it), else ./ranksight-runs."""
    return os.environ.get("RANKSIGHT_RUN_DIR") or DEFAULT_ROOT


def is_run(path: str) -> bool:
    """A run folder: the agent wrote rank metadata into it."""
    return os.path.isdir(os.path.join(path, RANKS_DIR))


def resolve_root(path: str | None) -> str:
    """A folder of runs (or a run) that must exist; a missing path or a file is a one-line error."""
    path = path or default_root()
    if not os.path.exists(path):
        raise UserError(f"{path}: no such folder (a job calling ranksight.init() creates it, or `ranksight demo`)")
    if not os.path.isdir(path):
        raise UserError(f"{path}: not a directory")
    return path


def resolve_run(path: str | None, announce: bool = True) -> str:
    """The run folder that ``path`` names: a run folder as is; the latest run of a folder of runs (said on
    stderr when ``announce``); a bare run id under the default root. Anything else is a UserError."""
    if not path:
        return _latest(resolve_root(None), announce)
    if os.path.isdir(path):
        return path if is_run(path) else _latest(path, announce)
    if os.path.exists(path):
        raise UserError(f"{path}: not a directory")
    root = default_root()
    if os.sep not in path and (os.altsep is None or os.altsep not in path):
        candidate = os.path.join(root, path)
        if is_run(candidate):
            return candidate
    raise UserError(f"{path}: no such run folder, and no run of that id under {root} (see `ranksight runs`)")


def latest_run(root: str) -> dict | None:
    """The run the dashboard opens first and commands pick in a folder of runs: ``list_runs``' newest."""
    runs = list_runs(root)
    return runs[0] if runs else None


def _latest(root: str, announce: bool) -> str:
    run = latest_run(root)
    if run is None:
        raise UserError(f"no runs under {root}: add ranksight.init() to your loop, or run `ranksight demo`")
    if announce:
        print(f"ranksight: using the latest run under {root}: {run['run']} ({run['status']})", file=sys.stderr)
    return run["path"]
