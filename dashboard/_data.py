"""Streamlit caching around the plain loaders: one Rollup per run (``cache_resource``), pulls in ``cache_data``.

A pull is keyed by the run and the rollup's version, which changes only when new step segments
arrive: a live refresh with nothing new re-runs no query, and one with new data reads only the new
segments (see ``ranksight.collectors.Rollup``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import streamlit as st

from ranksight.collectors import Rollup, RunDirError, list_runs, open_run, spool_signature

from . import _warm

PULL_TTL_S = 30


@st.cache_resource(max_entries=8, show_spinner=False)
def _rollup(run_path: str) -> Rollup:
    return _warm.take_rollup(run_path) or open_run(run_path).rollup()


def rollup(run_path: str) -> Rollup:
    """The run's rollup, brought up to date with the segments written since the last call."""
    _warm.release(run_path)  # a page needs it: the warm-up builds it now, not after the landing page
    r = _rollup(run_path)
    r.refresh()
    return r


_prefetching: set[str] = set()
_prefetch_lock = threading.Lock()


def prefetch(run_path: str) -> None:
    """Build the run's rollup on a background thread while the landing page waits for the rules.

    The Verdict page needs only ``diagnose``; the other pages need the rollup, so starting it early
    makes the second page quick. ``st.cache_resource`` holds the result whichever thread built it.
    """
    with _prefetch_lock:
        if run_path in _prefetching:
            return
        _prefetching.add(run_path)

    def build() -> None:
        try:
            _warm.wait_released(run_path)  # not while the landing page draws (see _warm.release)
            if not _warm.stopping():  # released by the server's exit: nothing to build for
                _rollup(run_path)
        except Exception:  # the page that needs it reports the problem in one line
            pass

    _warm.background(build, (), "ranksight-rollup-prefetch")


@st.cache_data(ttl=PULL_TTL_S, max_entries=256, show_spinner=False)
def _pull(run_path: str, version: int, query: str, args: tuple, _fn: Callable[..., Any], _rollup_obj: Rollup):
    # Keyed by the query's qualified name: the function itself is left out of the hash (leading underscore).
    return _fn(_rollup_obj.cursor(), *args)


def pull(run_path: str, fn: Callable[..., Any], *args):
    """Run ``fn(cursor, *args)`` (a function of ``_queries``) on the run, cached until new records arrive."""
    r = rollup(run_path)
    return _pull(run_path, r.version, f"{fn.__module__}.{fn.__qualname__}", args, fn, r)


def landing_drawn(run_path: str) -> None:
    """The Verdict page's script has run: background work held back for it may start once the browser has
    drawn it (``_warm.LANDING_GRACE_S``)."""
    _warm.release(run_path, after_s=_warm.LANDING_GRACE_S)


def skipped(run_path: str) -> list[str]:
    """'path: reason' of each file the run's reader left out (a damaged or foreign segment); empty when none."""
    return [str(f) for f in rollup(run_path).run.skipped]


@st.cache_data(ttl=2, show_spinner=False)
def runs(root: str) -> list[dict]:
    """The runs under ``root`` with their live status (re-read every 2 s)."""
    return list_runs(root)


@st.cache_data(ttl=PULL_TTL_S, max_entries=64, show_spinner=False)
def _diagnosis(run_path: str, signature: tuple) -> dict:
    warm = _warm.take_diagnosis(run_path, signature)  # made while the server started
    if warm is not None:
        return warm
    from ranksight.rules import diagnose

    return diagnose(run_path)


DIAGNOSE_EVERY_S = 10.0
"""A live run gets new segments every flush; re-diagnose it at most this often (a big job's verdict takes seconds)."""
_last_signature: dict[str, tuple[tuple, float]] = {}


def diagnosis(run_path: str) -> dict:
    """The rules' verdict on the run (``ranksight.rules.diagnose``).

    Keyed by the spool's signature, not the rollup, so the landing page needs no rollup; while
    segments keep arriving the previous verdict is reused for up to ``DIAGNOSE_EVERY_S``.
    """
    if run_path not in _last_signature:
        warm = _warm.finished(run_path)  # waits for the server's warm-up rather than diagnosing twice
        if warm is not None:
            _last_signature[run_path] = warm
    sig, now = spool_signature(run_path), time.monotonic()
    last = _last_signature.get(run_path)
    if last and last[0] != sig and now - last[1] < DIAGNOSE_EVERY_S:
        sig = last[0]
    elif not last or last[0] != sig:
        _last_signature[run_path] = (sig, now)
    return _diagnosis(run_path, sig)


def prometheus_snapshot(url: str) -> dict:
    """Runs and the latest per-rank values from a Prometheus server (multi-node jobs)."""
    from ranksight.collectors import PrometheusReader

    reader = PrometheusReader(url, timeout_s=5.0)
    runs_ = reader.runs()
    return {"runs": runs_, "ranks": {r: reader.rank_snapshot(r) for r in runs_[:5]}, "at": time.time()}


__all__ = [
    "RunDirError",
    "diagnosis",
    "prometheus_snapshot",
    "pull",
    "rollup",
    "runs",
    "skipped",
]
