"""Work the dashboard server starts before anyone opens a page: the diagnosis and rollup of the run
it will open first.

Why: the landing page shows ``diagnose(run)``, which reads every step row (about 2 s at 1,024 ranks x
10,000 steps on 2 cores), and the first script run also pays for importing the rules and pandas.
Done on a thread while the server starts, a user who opens the browser a few seconds later
finds the verdict ready. Each result is handed over once; the page's own caching takes it from there.
This module needs no Streamlit: the launcher fills it before Streamlit's runtime exists.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ranksight.collectors import spool_signature

WAIT_S = 120.0
"""How long a page waits for a warm-up still running, rather than starting the same work twice."""

HOLD_S = 20.0
"""How long the rollup waits for the landing page to be drawn (or for a page that needs the rollup)."""


@dataclass
class _Job:
    done: threading.Event = field(default_factory=threading.Event)
    signature: Optional[tuple] = None
    finished: float = 0.0
    diagnosis: Optional[dict] = None
    rollup: Any = None
    rollup_done: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    release_timer: Optional[threading.Timer] = None


EXIT_WAIT_S = 8.0
"""At exit, how long a warm-up may take to finish its query (under the CLI's 10 s from SIGTERM to SIGKILL)."""

_jobs: dict[str, _Job] = {}
_lock = threading.Lock()
_threads: list[threading.Thread] = []
_stopping = threading.Event()


def start(run_path: str, with_rollup: bool = True) -> None:
    """Diagnose ``run_path`` (then build its rollup) on a daemon thread."""
    with _lock:
        if run_path in _jobs:
            return
        _jobs[run_path] = job = _Job()
    background(_work, (run_path, job, with_rollup), "ranksight-warm")


def background(target, args: tuple, name: str) -> None:
    """Run ``target(*args)`` on a daemon thread that the interpreter's exit waits for while it is in a query
    (``_leave_duckdb_before_exit``): the dashboard's work that no page waits for."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        if not _threads:
            atexit.register(_leave_duckdb_before_exit)
        _threads.append(thread)
    thread.start()


def stopping() -> bool:
    """Whether the interpreter is exiting: background work not started yet is not started."""
    return _stopping.is_set()


def _leave_duckdb_before_exit() -> None:
    """At interpreter exit, let a warm-up still in a DuckDB query finish it before the interpreter stops it.

    Why: the interpreter stops a daemon thread when it next takes the GIL, by unwinding its stack; a thread
    inside a DuckDB call unwinds through C++ that may not be unwound, and the process aborts ("terminate
    called ...", code -6): a server that was only told to stop (Ctrl-C, SIGTERM) would read as crashed. So
    no new work starts, and the threads get ``EXIT_WAIT_S``; one still running then is left by ``os._exit``
    (the stop was asked for: code 0).
    """
    _stopping.set()
    for job in list(_jobs.values()):
        job.released.set()  # a rollup build waiting for the landing page: it sees _stopping and skips
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_threads):
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in _threads):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _work(run_path: str, job: _Job, with_rollup: bool) -> None:
    try:
        job.signature = spool_signature(run_path)
        from ranksight.rules import diagnose

        job.diagnosis = diagnose(run_path)
        job.finished = time.monotonic()
    except Exception:  # the page diagnoses again and reports the problem in one line
        job.diagnosis = None
    finally:
        job.done.set()
    # After the diagnosis, not beside it, and once the landing page is drawn: on a small machine the two
    # would only slow each other down. At 1,024 ranks x 10,000 steps the rollup scans 10 M rows (1.3 s)
    # while the Verdict page's first render draws, unless the node spool's step digests serve it (0.2-0.3 s);
    # see release(). The other pages' imports first: pandas (their tables: most of a second
    # on 2 busy cores) and altair (their charts); the landing page needs neither (markdown tables, SVG).
    job.released.wait(HOLD_S)
    for module in ("pandas", "altair"):
        try:
            __import__(module)
        except Exception:
            pass
    try:
        if with_rollup and not _stopping.is_set():
            job.rollup = build_rollup(run_path)
    except Exception:
        job.rollup = None
    finally:
        job.rollup_done.set()


def build_rollup(run_path: str) -> Any:
    """The run's rollup (``Run.rollup``) on a reading whose DuckDB keeps no Parquet footers between queries.

    Why: the rollup's reading binds its views over every spool file once, and the pages read the rollup's
    tables, not the files; kept, the footers held ~50 KB a step file of the server's memory (370 MB at 7,300
    files) and left the C heap so cut up that the server's later work cost up to 3x the CPU it does in a fresh
    process (benchmarks/results/cpu_dashboard_live_history.md)."""
    import duckdb

    from ranksight.collectors import open_run

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # as every reading's connection (``quiet_connection``)
    con.execute("SET parquet_metadata_cache = false")
    return open_run(run_path, con=con).rollup()


def finished(run_path: str) -> Optional[tuple[tuple, float]]:
    """(signature, when) of the warm diagnosis of ``run_path``, waiting for it if it is running."""
    job = _jobs.get(run_path)
    if job is None or not job.done.wait(WAIT_S) or job.diagnosis is None:
        return None
    return job.signature, job.finished


def take_diagnosis(run_path: str, signature: tuple) -> Optional[dict]:
    """The warm diagnosis if it was made from exactly these segments; handed over once."""
    job = _jobs.get(run_path)
    if job is None or not job.done.is_set() or job.signature != signature or job.diagnosis is None:
        return None
    result, job.diagnosis = job.diagnosis, None
    return result


LANDING_GRACE_S = 2.0
"""How long after the landing page's script has run the warm-up still holds back its other work (pandas' and
altair's imports, the rollup): the browser draws what the script sent after the script ends, and on 2 cores
that work beside it made the first render of a 1,024-rank store's Verdict page 1.5-1.8 s instead of 1.3-1.7
s. A page that needs the rollup releases it at once (``release`` without a
delay)."""


def release(run_path: str, after_s: float = 0.0) -> None:
    """Let the warm-up build the rollup: now (a page needs it), or ``after_s`` from now (the landing page's
    script has run: ``LANDING_GRACE_S``)."""
    job = _jobs.get(run_path)
    if job is None or job.released.is_set():
        return
    if after_s <= 0:
        job.released.set()
        return
    with _lock:
        if job.release_timer is None:  # the first drawing starts the wait; a redraw does not restart it
            job.release_timer = threading.Timer(after_s, job.released.set)
            job.release_timer.daemon = True
            job.release_timer.start()


def wait_released(run_path: str, timeout: float = HOLD_S) -> None:
    """Wait until ``release`` (or ``timeout``): a background build of the rollup starts no earlier."""
    job = _jobs.get(run_path)
    if job is not None:
        job.released.wait(timeout)


def take_rollup(run_path: str) -> Any:
    """The warm rollup of ``run_path``, waiting for it if it is being built (None without a warm-up);
    handed over once."""
    job = _jobs.get(run_path)
    if job is None or not job.rollup_done.wait(WAIT_S) or job.rollup is None:
        return None
    result, job.rollup = job.rollup, None
    return result
