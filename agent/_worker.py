"""The agent thread: drains the hot path's marks, builds records, and hands them to the sinks.

Shaped like OpenTelemetry's periodic reader: loop on ``Event.wait(interval)``, catch and count every
error, never let one sink's failure stop the others, and flush once more at close. All I/O of the
agent happens here, never on the training thread.
"""

from __future__ import annotations

import logging
import platform
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from ranksight import __version__
from ranksight.schema import SCHEMA_VERSION

from ._assemble import Assembler
from ._compile import CompilePoller
from ._monitor import EV_GPU, EV_INFO, EV_STEP, Monitor

if TYPE_CHECKING:
    from ._gpu_hooks import GpuResolver

log = logging.getLogger("ranksight")

# Only step marks are counted for drop accounting: they are appended by the training thread alone,
# so the producer's counter needs no lock (bucket marks come from autograd / communication threads).
_COUNTED = (EV_STEP,)


class Worker(threading.Thread):
    """Daemon thread that turns marks into rows every ``flush_interval_s`` and at close."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__(name="ranksight-agent", daemon=True)
        self.m = monitor
        self._stop_event = threading.Event()
        self._assembler = Assembler(monitor._wall_offset_ns)
        self._compile = CompilePoller() if monitor.config.compile_poll else None
        self._consumed = 0
        self.records_dropped_total = 0
        self.sinks: list = []  # objects with write(kind, rows) and close(); see _make_sinks
        self.samplers: list[Callable[[], list[dict]]] = []  # agent-thread samplers returning sample rows
        self.gpu_resolver: Optional[GpuResolver] = None  # set by attach_gpu on a GPU rank
        self._backlog: dict[str, list[dict]] = {}
        self._spool = None
        self._spool_failed = False
        self._started_ns = time.time_ns()
        self._info: dict = {}
        self._finished = False
        self._flush_lock = threading.Lock()  # agent thread vs close() on a dead thread; never the hot path

    # ------------------------------------------------------------ thread
    def run(self) -> None:
        interval = self.m.config.flush_interval_s
        while not self._stop_event.wait(interval):
            self._safe_flush(final=False)
        self._safe_flush(final=True)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread for its final flush and wait for it (bounded)."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)
        if not self._finished:  # thread never started or died: flush from here
            self._safe_flush(final=True)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                log.warning("ranksight: closing %s failed: %s", type(sink).__name__, exc)

    def _safe_flush(self, final: bool) -> None:
        try:
            with self._flush_lock:
                if self._finished:
                    return
                self.flush(final)
                if final:
                    self._finished = True
        except Exception as exc:
            self.m._fail("agent_thread", exc)

    # ------------------------------------------------------------ flush
    def flush(self, final: bool) -> None:
        """Drain marks, build rows, write every sink, refresh this rank's metadata."""
        m = self.m
        if not m._settle_identity():
            if not final and m._step == 0:
                return  # no process group yet and nothing recorded: wait to learn the rank
            m._settle_identity(force=True)
            m._identity_settled = True
        if self._spool is None and not self._spool_failed:
            self._open_spool()

        rows: dict[str, list[dict]] = {"steps": [], "buckets": [], "compile": [], "samples": [], "events": []}
        gpu_marks: list = []
        events = m._events
        for _ in range(len(events)):
            try:
                ev = events.popleft()
            except IndexError:
                break
            tag = ev[0]
            if tag in _COUNTED:
                self._consumed += 1
            if tag == EV_INFO:
                self._on_info(ev[1], ev[2], rows)
            elif tag == EV_GPU:
                gpu_marks.append(ev)
            else:
                self._assembler.add(ev)
        # What the bounded deque pushed out before we got to it.
        dropped = m._produced - self._consumed - sum(1 for e in events if e[0] in _COUNTED)
        if dropped > self.records_dropped_total:
            self.records_dropped_total = dropped

        steps, buckets = self._assembler.drain(final=final)
        rows["steps"], rows["buckets"] = steps, buckets
        resolver = self.gpu_resolver
        if resolver is not None:
            try:
                # Rows whose GPU events are not complete yet are held back by the resolver, not dropped.
                rows["steps"] = resolver(gpu_marks, steps, final)
            except Exception as exc:
                m._fail("gpu_events", exc)
                self.gpu_resolver = None  # off from now on; the rows it held go out as they are
                rows["steps"] = resolver.salvage(steps)
        if self._compile is not None:
            try:
                for r in self._compile.poll():
                    r["time_ns"], r["step"] = time.time_ns(), self._assembler.last_step
                    rows["compile"].append(r)
            except Exception as exc:
                m._fail("compile_poll", exc)
        for sampler in list(self.samplers):
            try:
                rows["samples"].extend(sampler())
            except Exception as exc:
                m._fail(getattr(sampler, "__name__", "sampler"), exc)
                self.samplers.remove(sampler)

        self._write(rows)
        self._write_meta(final)

    def _on_info(self, name: str, payload, rows: dict) -> None:
        if name in ("warning", "error", "info"):
            component, message = payload
            rows["events"].append(
                {"time_ns": time.time_ns(), "level": name, "component": component, "message": str(message)[:2000]}
            )
        else:
            self._info[name] = payload

    def _open_spool(self) -> None:
        from ._spool import SpoolWriter

        try:
            self._spool = SpoolWriter(self.m.run_path, self.m.identity)
            self._make_sinks()
        except Exception as exc:
            self._spool_failed = True
            self.m._warn_once(
                "spool", f"cannot write the run directory {self.m.run_path!r} ({exc}); records are not spooled"
            )

    def _make_sinks(self) -> None:
        """Start the optional exporters (Prometheus, OTLP) configured for this rank."""
        from ._sinks import make_sinks

        self.sinks.extend(make_sinks(self.m))

    def _write(self, rows: dict[str, list[dict]]) -> None:
        for sink in self.sinks:
            for kind, batch in rows.items():
                if batch:
                    try:
                        sink.write(kind, batch)
                    except Exception as exc:
                        self.m._fail(type(sink).__name__, exc)
        if self._spool is None:
            return
        limit = self.m.config.max_buffered_events
        for kind, batch in rows.items():
            pending = self._backlog.pop(kind, []) + batch
            if not pending:
                continue
            try:
                self._spool.write(kind, pending)
            except Exception as exc:
                # Disk full, directory gone...: keep the rows (bounded) and try again next flush.
                self.m._warn_once("spool_write", f"writing the spool failed ({exc}); retrying, rows kept in memory")
                if len(pending) > limit:
                    self.records_dropped_total += len(pending) - limit
                    pending = pending[-limit:]
                self._backlog[kind] = pending

    def _write_meta(self, final: bool) -> None:
        if self._spool is None:
            return
        m = self.m
        torch = sys.modules.get("torch")
        meta = {
            "schema_version": SCHEMA_VERSION,
            "ranksight_version": __version__,
            **m.identity.labels(),
            "node_rank": m.identity.node_rank,
            "status": "finished" if final else "running",
            "started_ns": self._started_ns,
            "heartbeat_ns": time.time_ns(),
            "flush_interval_s": m.config.flush_interval_s,
            "steps": m._step,
            "torch_version": getattr(torch, "__version__", None),
            "python_version": platform.python_version(),
            "hostname": platform.node(),
            "argv": sys.argv[:20],
            "counters": {
                "agent_errors_total": sum(m.errors.values()),
                "agent_errors": dict(m.errors),
                "records_dropped_total": self.records_dropped_total,
                "graph_breaks_total": self._compile.graph_breaks_total if self._compile else 0,
                "recompiles_total": self._compile.recompiles_total if self._compile else 0,
                "rows_spooled_total": self._spool.rows_written,
            },
            **{k: v for k, v in self._info.items()},
        }
        try:
            self._spool.write_meta(meta)
        except Exception as exc:
            m._warn_once("meta_write", f"writing rank metadata failed ({exc})")
