"""How a rank's process ends, for its status: finished, crashed (an uncaught exception) or terminated
(SIGTERM, what SLURM and Kubernetes send first).

On SIGTERM each live monitor flushes (bounded by ``SIGNAL_FLUSH_S``) and marks its rank terminated,
then the signal does what it did before: the previous handler runs, or the default action kills the
process. The signal is never swallowed. Handlers can only be set from the main thread; elsewhere the
rank still records crashes through ``sys.excepthook``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import weakref
from typing import Any

log = logging.getLogger("ranksight")

SIGNAL_FLUSH_S = 1.0
"""Longest a SIGTERM waits for the final flush before the signal goes on."""

_monitors: weakref.WeakSet = weakref.WeakSet()
_previous_excepthook: Any = None
_previous_sigterm: Any = None
_installed = False


def install(monitor: Any) -> None:
    """Watch the process's end for ``monitor`` (hooks installed once per process)."""
    global _installed, _previous_excepthook, _previous_sigterm
    _monitors.add(monitor)
    if _installed:
        return
    _installed = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _on_uncaught
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return  # the job chose to ignore SIGTERM: so do we
        _previous_sigterm = previous
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError) as exc:  # not the main interpreter, or signals unavailable
        log.debug("ranksight: no SIGTERM handler (%s)", exc)


def forget(monitor: Any) -> None:
    """A closed monitor has nothing left to flush."""
    _monitors.discard(monitor)


def _on_uncaught(exc_type, exc, tb) -> None:
    for monitor in list(_monitors):
        if monitor.exit_status is None:
            monitor.exit_status = "terminated" if issubclass(exc_type, KeyboardInterrupt) else "crashed"
    hook = _previous_excepthook or sys.__excepthook__
    hook(exc_type, exc, tb)


def _on_sigterm(signum, frame) -> None:
    for monitor in list(_monitors):
        try:
            monitor.exit_status = "terminated"
            monitor.close(timeout_s=SIGNAL_FLUSH_S)
        except Exception as exc:  # the signal must go on whatever happened to the flush
            log.warning("ranksight: flush on SIGTERM failed: %s", exc)
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    # Default action: restore it and deliver the signal again, so the exit status says SIGTERM.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
