"""Feeding trackers from the run folder: once after a run (``export_run``), or live while it runs (``Follower``:
a thread that logs, and the reading done by a process of its own, ``_reader``, or by the thread). Neither runs
on the training thread, and a tracker that fails never fails the job, the agent or the other trackers: each
failure is one warning line saying what was not logged."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any, Optional

from ranksight.format.warmup import WARMUP_STEPS

from ._points import Point, SpoolCursor, run_points
from ._sinks import TrackerSink
from ._verdict import diagnose_run, report_files, wait_for_ranks

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


class Follower:
    """Log a run's scalars to trackers while it runs, and its verdict and report when it ends.

    A daemon thread logs, every ``interval_s``, one point per rank for the steps written since the last poll
    (``SpoolCursor``). ``finish()`` waits (at most ``wait_for_ranks_s``) until every rank has closed, logs the
    last points, diagnoses the run and logs the verdict and report, then ends the runs the sinks started.
    Sinks are opened on the caller's thread (see ``TrackerSink.open``) and log from the thread: the tracker
    objects live in this process (``wandb.run``, the active MLflow run, a ``SummaryWriter``'s log dir).

    ``process=True`` (what the framework callbacks and ``follow()`` use inside a training process) has a child
    process (``python -m ranksight.exporters._reader``, in the job's process group) do the reading, the
    diagnosis and the report, and send the points and the verdict back through a pipe: the thread then only
    waits on the pipe and hands a few numbers to the trackers, and DuckDB is never loaded into the training
    process. If the child cannot start or dies, the thread reads the folder itself (one line says so).
    """

    def __init__(self, run_path: str, sinks: Sequence[TrackerSink], *, interval_s: float = 10.0,
                 warmup_steps: int = WARMUP_STEPS, wait_for_ranks_s: float = 30.0,
                 process: bool = False) -> None:  # fmt: skip
        self.run_path = run_path
        self.sinks = [Guarded(s) for s in sinks]
        self.interval_s = interval_s
        self.warmup_steps = warmup_steps
        self.wait_for_ranks_s = wait_for_ranks_s
        self.process = process
        self.last_step = 0
        self.result: Optional[dict] = None
        """The diagnosis logged at the end (None until ``finish`` has run)."""
        self._cursor = SpoolCursor(run_path)
        self._proc: Optional[subprocess.Popen] = None
        self._abandoned = False  # finish() gave up waiting: no reading in this process after that
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # one poll at a time: the thread's and finish()'s last one

    def start(self) -> Follower:
        """Open the sinks here (the caller's thread) and start polling."""
        run_id = os.path.basename(os.path.normpath(self.run_path))
        self.sinks = [g for g in self.sinks if g.open(run_id)]
        if self.process:
            self._proc = self._spawn()
        self._thread = threading.Thread(target=self._loop, name="ranksight-export", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        return self

    def _spawn(self) -> Optional[subprocess.Popen]:
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "ranksight.exporters._reader", self.run_path, str(self.warmup_steps)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=False,  # the job's process group: a Ctrl-C or a scheduler's kill reaches it
                close_fds=True,
            )
        except Exception as exc:
            log.warning("ranksight: trackers: reader process not started (%s); reading from a thread", _first_line(exc))
            return None

    def _ask(self, command: str) -> Optional[dict]:
        """The reader process's answer to ``command``; None (and the thread reads from now on) when it is gone."""
        proc = self._proc
        if proc is None:
            return None
        from ._reader import read_frame

        try:
            proc.stdin.write(command.encode() + b"\n")
            proc.stdin.flush()
            return read_frame(proc.stdout)
        except Exception as exc:
            if not self._abandoned:
                log.warning("ranksight: trackers: reader process ended (%s); reading from a thread", _first_line(exc))
            self._end_proc()
            return None

    def _end_proc(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # end of its commands: it exits
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait()

    def _read_here(self) -> list[Point]:
        try:
            return self._cursor.new_points()
        except Exception as exc:  # a run folder not there yet, a segment pruned under us: next poll
            log.debug("ranksight: export poll: %s", _first_line(exc))
            return []

    def poll(self) -> int:
        """Log the points of the segments written since the last poll; returns how many."""
        with self._lock:
            if self._abandoned:
                return 0
            answer = self._ask("poll")
            if answer is None:
                points = [] if self._abandoned else self._read_here()
            else:
                points = answer["points"]
                if answer.get("error"):
                    log.debug("ranksight: export poll: %s", answer["error"])
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
            with self._lock:
                answer = self._ask(f"final {self.wait_for_ranks_s}")
            if self._abandoned:
                return
            if answer is not None:
                self._log_points(answer["points"])
                self.result, files = answer["result"], answer["files"]
                if answer.get("verdict_error"):
                    log.warning("ranksight: export: no verdict for %s (%s)", self.run_path, answer["verdict_error"])
            else:
                self.result, files = self._verdict_here()
            for g in self.sinks:
                if self.result is not None:
                    g.call("verdict", "the verdict", g.sink.log_verdict, self.result, self.last_step)
                if files is not None:
                    g.call("report", "the report", g.sink.log_report, files)
                g.call("close", "the run's end", g.sink.close)
        finally:
            self._end_proc()
            self._done.set()

    def _verdict_here(self) -> tuple[Optional[dict], Any]:
        wait_for_ranks(self.run_path, self.wait_for_ranks_s)
        self.poll()
        try:
            result = diagnose_run(self.run_path, self.warmup_steps)
            return result, report_files(result, self.run_path)
        except Exception as exc:
            log.warning("ranksight: export: no verdict for %s (%s)", self.run_path, _first_line(exc))
            return None, None

    def finish(self, timeout_s: float = 60.0) -> bool:
        """Stop polling and log the verdict; returns whether that was done within ``timeout_s``."""
        if self._thread is None:
            return True
        self._stop.set()
        done = self._done.wait(timeout_s)
        if not done:
            self._abandoned = True
            proc = self._proc
            if proc is not None:
                proc.kill()  # the thread's read ends; nothing more is read or logged
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


def export_run(
    run_path: str, sinks: Sequence[TrackerSink], *, max_points: int = 500, warmup_steps: int = WARMUP_STEPS
) -> dict:
    """Log a run's scalars (at most ``max_points`` per rank), verdict and report to each sink, and end the
    runs the sinks started. Returns ``{"result": diagnosis, "failed": {tracker: {part: count}}, "where": [...]}``;
    a sink that fails costs nothing but its own records (one warning line each)."""
    run_id = os.path.basename(os.path.normpath(run_path))
    guarded = [Guarded(s) for s in sinks]
    opened = [g for g in guarded if g.open(run_id)]
    points = run_points(run_path, max_points)
    last = max((p.step for p in points), default=0)
    result = diagnose_run(run_path, warmup_steps)
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
