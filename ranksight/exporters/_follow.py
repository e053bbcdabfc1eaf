"""Feeding trackers from the run folder: once after a run (``export_run``), or live from a thread that polls
the folder (``Follower``). Neither runs on the training thread, and a tracker that fails never fails the job,
the agent or the other trackers: each failure is one warning line saying what was not logged."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Optional

from ._points import Point, SpoolCursor, run_points
from ._sinks import TrackerSink
from ._verdict import report_files

log = logging.getLogger("ranksight")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


class Guarded:
    """A sink whose every call is caught: the first failure of each part is one line, the rest are counted."""

    def __init__(self, sink: TrackerSink) -> None:
        self.sink = sink
        self.failed: dict[str, int] = {}
        """Part -> how many calls failed (``points``, ``verdict``, ``report``, ``open``, ``close``)."""
        self.opened = False

    def call(self, part: str, what: str, fn, *args) -> bool:
        """Run ``fn(*args)``; on an exception say once per part what was not logged, and return False."""
        if part != "open" and not self.opened:
            self.failed[part] = self.failed.get(part, 0) + 1
            return False
        try:
            fn(*args)
            return True
        except Exception as exc:
            if part not in self.failed:
                log.warning(
                    "ranksight: %s: %s (%s); the run folder keeps it",
                    self.sink.name,
                    f"{what} not logged" if part != "open" else "nothing logged, its run could not be started",
                    _first_line(exc),
                )
            self.failed[part] = self.failed.get(part, 0) + 1
            return False

    def open(self, run_id: str) -> bool:
        """Settle the sink's run; False (one line said why) when it could not."""
        self.opened = self.call("open", "", self.sink.open, run_id)
        return self.opened


def _wait_for_ranks(run_path: str, timeout_s: float) -> None:
    """Until every rank said its last word (or stopped beating) or ``timeout_s`` passed: the verdict then sees
    each rank's last flush."""
    from ranksight.collectors import rank_is_live, read_rank_meta

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            metas = read_rank_meta(run_path)
        except Exception:
            metas = []
        world = max((int(m.data.get("world_size") or 0) for m in metas), default=0)
        if metas and len(metas) >= world and not any(rank_is_live(m) for m in metas):
            return
        time.sleep(0.2)


def _diagnose(run_path: str, warmup_steps: int) -> dict:
    from ranksight.rules import diagnose

    return diagnose(run_path, warmup_steps=warmup_steps)


class Follower:
    """Log a run's scalars to trackers while it runs, and its verdict and report when it ends.

    A daemon thread polls the run folder every ``interval_s`` and logs one point per rank for the steps
    written since the last poll (``SpoolCursor``). ``finish()`` waits (at most ``wait_for_ranks_s``) until
    every rank has closed, logs the last points, diagnoses the run and logs the verdict and report, then
    ends the runs the sinks started. Sinks are opened on the caller's thread (see ``TrackerSink.open``).
    """

    def __init__(self, run_path: str, sinks: Sequence[TrackerSink], *, interval_s: float = 10.0,
                 warmup_steps: int = 5, wait_for_ranks_s: float = 30.0) -> None:  # fmt: skip
        self.run_path = run_path
        self.sinks = [Guarded(s) for s in sinks]
        self.interval_s = interval_s
        self.warmup_steps = warmup_steps
        self.wait_for_ranks_s = wait_for_ranks_s
        self.last_step = 0
        self.result: Optional[dict] = None
        """The diagnosis logged at the end (None until ``finish`` has run)."""
        self._cursor = SpoolCursor(run_path)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # one poll at a time: the thread's and finish()'s last one

    def start(self) -> Follower:
        """Open the sinks here (the caller's thread) and start polling."""
        run_id = os.path.basename(os.path.normpath(self.run_path))
        self.sinks = [g for g in self.sinks if g.open(run_id)]
        self._thread = threading.Thread(target=self._loop, name="ranksight-export", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        return self

    def poll(self) -> int:
        """Log the points of the segments written since the last poll; returns how many."""
        with self._lock:
            try:
                points = self._cursor.new_points()
            except Exception as exc:  # a run folder not there yet, a segment pruned under us: next poll
                log.debug("ranksight: export poll: %s", _first_line(exc))
                return 0
            self._log_points(points)
            return len(points)

    def _log_points(self, points: list[Point]) -> None:
        if not points:
            return
        self.last_step = max(self.last_step, max(p.step for p in points))
        for g in self.sinks:
            g.call("points", f"scalars up to step {self.last_step}", g.sink.log_points, points)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
        self._final()

    def _final(self) -> None:
        try:
            _wait_for_ranks(self.run_path, self.wait_for_ranks_s)
            self.poll()
            try:
                self.result = _diagnose(self.run_path, self.warmup_steps)
                files = report_files(self.result, self.run_path)
            except Exception as exc:
                log.warning("ranksight: export: no verdict for %s (%s)", self.run_path, _first_line(exc))
                files = None
            for g in self.sinks:
                if self.result is not None:
                    g.call("verdict", "the verdict", g.sink.log_verdict, self.result, self.last_step)
                if files is not None:
                    g.call("report", "the report", g.sink.log_report, files)
                g.call("close", "the run's end", g.sink.close)
        finally:
            self._done.set()

    def finish(self, timeout_s: float = 60.0) -> bool:
        """Stop polling and log the verdict; returns whether that was done within ``timeout_s``."""
        if self._thread is None:
            return True
        self._stop.set()
        done = self._done.wait(timeout_s)
        if not done:
            names = ", ".join(g.sink.name for g in self.sinks) or "trackers"
            log.warning(
                "ranksight: %s: the verdict was not logged within %.0f s; `ranksight export` logs it later",
                names,
                timeout_s,
            )
        return done

    def _at_exit(self) -> None:
        # A job that never called finish(): its own agent closes after this hook, so do not wait for it long.
        if self._thread is not None and not self._done.is_set():
            self.wait_for_ranks_s = min(self.wait_for_ranks_s, 5.0)
            self.finish(timeout_s=30.0)

    @property
    def failed(self) -> dict[str, dict[str, int]]:
        """Tracker name -> part -> failed calls (empty when everything was logged)."""
        return {g.sink.name: dict(g.failed) for g in self.sinks if g.failed}


def export_run(run_path: str, sinks: Sequence[TrackerSink], *, max_points: int = 500, warmup_steps: int = 5) -> dict:
    """Log a run's scalars (at most ``max_points`` per rank), verdict and report to each sink, and end the
    runs the sinks started. Returns ``{"result": diagnosis, "failed": {tracker: {part: count}}, "where": [...]}``;
    a sink that fails costs nothing but its own records (one warning line each)."""
    run_id = os.path.basename(os.path.normpath(run_path))
    guarded = [Guarded(s) for s in sinks]
    opened = [g for g in guarded if g.open(run_id)]
    points = run_points(run_path, max_points)
    last = max((p.step for p in points), default=0)
    result = _diagnose(run_path, warmup_steps)
    files = report_files(result, run_path)
    for g in opened:
        if points:
            g.call("points", f"{len(points)} scalar points", g.sink.log_points, points)
        g.call("verdict", "the verdict", g.sink.log_verdict, result, last)
        g.call("report", "the report", g.sink.log_report, files)
        g.call("close", "the run's end", g.sink.close)
    return {
        "result": result,
        "points": len(points),
        "failed": {g.sink.name: dict(g.failed) for g in guarded if g.failed},
        "where": [g.sink.where() for g in opened],
    }
