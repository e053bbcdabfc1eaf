"""The window reduction lives in ``ranksight.trace_reduce`` (torch-free), shared with the trace importer; this
module re-exports it for the agent and runs it in a child process (``reduce_file_in_child``), so that the
reduction never holds the training process's GIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

from ranksight.trace_reduce import (  # noqa: F401
    ACTIVITY_KIND,
    AFTER_MARK,
    LOADER_MARK,
    METADATA_OPS,
    SYNC_CALLS,
    WINDOW_MARK,
    Ev,
    WindowReduction,
    events_from_chrome,
    is_comm_kernel,
    reduce_window,
)

# The child imports ranksight.trace_reduce alone (no torch), at a lower priority than the training process:
# on a host whose cores the ranks take, it waits for them rather than they for it.
_CHILD = """\
import json, os, sys
try:
    os.nice(10)
except OSError:
    pass
from ranksight.trace_reduce import events_from_chrome, reduce_window
with open(sys.argv[1]) as f:
    trace = json.load(f)
red = reduce_window(events_from_chrome(trace), model_on_gpu=sys.argv[2] == "1")
json.dump(None if red is None else red._asdict(), sys.stdout)
"""


def reduce_file_in_child(path: str, model_on_gpu: bool, timeout_s: float = 300.0) -> Optional[WindowReduction]:
    """Reduce the Chrome trace at ``path`` (a profiler result's ``save()``) in a fresh Python process and return
    its :class:`WindowReduction` (None: no traced step in it). This thread waits with the GIL released.

    Raises ``OSError``/``subprocess.SubprocessError``/``ValueError`` when the child cannot run or fails."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["ranksight"].__file__ or ".")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, path, "1" if model_on_gpu else "0"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise subprocess.SubprocessError(f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    out = json.loads(proc.stdout)
    if out is None:
        return None
    out["cpu_ops_top"] = [tuple(x) for x in out["cpu_ops_top"]]
    out["sync_sources"] = [tuple(x) for x in out["sync_sources"]]
    return WindowReduction(**out)
