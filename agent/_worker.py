"""The agent thread: drains the hot path's marks, builds records, and hands them to the sinks.

Shaped like OpenTelemetry's periodic reader: loop on ``Event.wait(interval)``, catch and count every
error, never let one sink's failure stop the others, and flush once more at close. All I/O of the
agent happens here, never on the training thread.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from ranksight._version import __version__
from ranksight.format.schema import SCHEMA_VERSION

from ._assemble import Assembler
from ._attach import ddp_bucket_count
from ._compile import CompilePoller
from ._config import Config
from ._events import EV_GPU, EV_INFO, STEP_MARKS
from ._identity import IdentityHolder
from ._report import Reporter

if TYPE_CHECKING:
    from collections import deque

    from ._gpu_resolver import GpuResolver

log = logging.getLogger("ranksight")

# Only step marks are counted for drop accounting: they are appended by the training thread alone,
# so the producer's counter needs no lock (bucket marks come from autograd / communication threads).
_COUNTED = STEP_MARKS
_KINDS = ("steps", "buckets", "collectives", "compile", "samples", "events")


class Worker(threading.Thread):
    """Daemon thread that turns marks into rows every ``flush_interval_s`` and at close."""

    def __init__(
        self,
        config: Config,
        *,
        events: deque,
        produced: Callable[[], int],
        steps: Callable[[], int],
        identity: IdentityHolder,
        reporter: Reporter,
        wall_offset_ns: int,
        status: Callable[[], Optional[str]],
    ) -> None:
        super().__init__(name="ranksight-agent", daemon=True)
        self.config = config
        self._events = events
        self._produced = produced
        self._steps = steps
        self._identity = identity
        self.reporter = reporter
        self._exit_status = status
        self._stop_event = threading.Event()
        self._assembler = Assembler(wall_offset_ns)
        self._compile = CompilePoller() if config.compile_poll else None
        self._consumed = 0
        self.records_dropped_total = 0
        self.sinks: list = []  # objects with write(kind, rows) and close(); see _make_sinks
        self.samplers: list[Callable[[], list[dict]]] = []  # agent-thread samplers returning sample rows
        self.gpu_resolver: Optional[GpuResolver] = None  # set by attach_gpu on a GPU rank
        self._backlog: dict[str, list[dict]] = {}
        self._late_gpu_marks: list = []
        self.flush_seconds_total = 0.0
        self.flushes_total = 0
        self._spool = None
        self._sinks_made = False
        self._started_ns = time.time_ns()
        self._info: dict = {}
        self._finished = False
        self._flush_lock = threading.Lock()  # agent thread vs close() on a dead thread; never the hot path

    # ------------------------------------------------------------ thread
    def collectives_timed(self) -> None:
        """Collective timing is on: a step without collectives reads 0 blocked time, not unknown."""
        self._assembler.collectives_on = True

    def add_sampler(self, sampler: Callable[[], list[dict]]) -> None:
        """Register an agent-thread sampler (see ``Monitor.add_sampler``)."""
        self.samplers.append(sampler)

    @property
    def identity(self):
        return self._identity.get()

    @property
    def run_path(self) -> str:
        return os.path.join(self.config.run_dir, self._identity.get().run)

    def run(self) -> None:
        self._warm_imports()
        interval = self.config.flush_interval_s
        while not self._stop_event.wait(interval):
            self._safe_flush(final=False)
        self._safe_flush(final=True)

    @staticmethod
    def _warm_imports() -> None:
        """Import what the first flush writes with (pyarrow, the spool) now, while the job sets up, not inside
        its first steps: 0.03-0.2 s of this thread's CPU, which a job whose ranks take every core pays in
        step time."""
        try:
            import pyarrow.parquet  # noqa: F401

            from . import _arrow_columns, _spool  # noqa: F401
        except Exception as exc:  # the flush reports what is missing
            log.debug("ranksight: warming imports failed: %s", exc)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread for its final flush and wait for it (bounded)."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)
        if not self._finished:  # thread never started, died, or is still flushing (bounded wait)
            self._safe_flush(final=True, wait_s=timeout_s)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                log.warning("ranksight: closing %s failed: %s", type(sink).__name__, exc)

    def _safe_flush(self, final: bool, wait_s: float = -1) -> None:
        if not self._flush_lock.acquire(timeout=wait_s):
            self.reporter.warn_once("final_flush", f"the final flush did not get its turn within {wait_s:.1f} s")
            return
        try:
            if self._finished:
                return
            t0 = time.perf_counter()
            self.flush(final)
            # The agent thread's own time, most of it holding the GIL the training thread also needs.
            self.flush_seconds_total += time.perf_counter() - t0
            self.flushes_total += 1
            if final:
                self._finished = True
        except Exception as exc:
            self.reporter.fail("agent_thread", exc)
        finally:
            self._flush_lock.release()

    # ------------------------------------------------------------ flush
    def flush(self, final: bool) -> None:
        """Drain marks, build rows, write every sink, refresh this rank's metadata."""
        if not self._identity.settle():
            if not final and self._steps() == 0:
                return  # no process group yet and nothing recorded: wait to learn the rank
            self._identity.settle(force=True)
        if self._spool is None:
            self._open_spool()

        rows: dict[str, list[dict]] = {kind: [] for kind in _KINDS}
        gpu_marks = self._drain_events(rows)
        steps, buckets, collectives = self._assembler.drain(final=final)
        rows["buckets"], rows["collectives"] = buckets, collectives
        rows["steps"] = self._resolve_gpu(gpu_marks, steps, final)
        if self._compile is not None:
            try:
                for r in self._compile.poll():
                    r["time_ns"], r["step"] = time.time_ns(), self._assembler.last_step
                    rows["compile"].append(r)
            except Exception as exc:
                self.reporter.fail("compile_poll", exc)
                self._compile = None
        for sampler in list(self.samplers):
            try:
                rows["samples"].extend(sampler())
            except Exception as exc:
                self.reporter.fail(getattr(sampler, "__name__", "sampler"), exc)
                self.samplers.remove(sampler)
        # Facts and warnings reported while this flush ran (by the resolver, a sampler) go out with it.
        self._drain_events(rows, late=True)
        self._write(rows)
        self._write_meta(final)

    def _drain_events(self, rows: dict[str, list[dict]], late: bool = False) -> list:
        """Move the hot path's events into the assembler / rows; return the GPU marks. A ``late`` drain (after
        the samplers, to write what they reported) keeps its GPU marks for the next flush's resolver."""
        gpu_marks: list = []
        events = self._events
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
        dropped = self._produced() - self._consumed - sum(1 for e in list(events) if e[0] in _COUNTED)
        if dropped > self.records_dropped_total:
            self.records_dropped_total = dropped
        if late and gpu_marks:
            self._late_gpu_marks.extend(gpu_marks)
            return []
        if self._late_gpu_marks:
            gpu_marks = self._late_gpu_marks + gpu_marks
            self._late_gpu_marks = []
        return gpu_marks

    def _resolve_gpu(self, gpu_marks: list, steps: list[dict], final: bool) -> list[dict]:
        resolver = self.gpu_resolver
        if resolver is None:
            return steps
        try:
            # Rows whose GPU events are not complete yet are held back by the resolver, not dropped.
            return resolver(gpu_marks, steps, final)
        except Exception as exc:
            self.reporter.fail("gpu_events", exc)
            self.gpu_resolver = None  # off from now on; the rows it held go out as they are
            return resolver.salvage(steps)

    def _on_info(self, name: str, payload, rows: dict) -> None:
        if name in ("warning", "error", "info"):
            component, message = payload
            rows["events"].append(
                {"time_ns": time.time_ns(), "level": name, "component": component, "message": str(message)[:2000]}
            )
        else:
            self._info[name] = payload
            if name == "ddp" and not payload.get("comm_hook", True):
                self._assembler.grad_bytes = payload.get("grad_bytes")
                if payload.get("backend") != "nccl":  # gloo without the hook: DDP's own bucket count
                    self._assembler.bucket_count = payload.get("buckets")
            elif name == "ddp_logging" and self._assembler.bucket_count is not None and isinstance(payload, dict):
                self._assembler.bucket_count = ddp_bucket_count(payload) or self._assembler.bucket_count

    def _open_spool(self) -> None:
        """Open the spool, retried at every flush until it works (a run directory that becomes writable
        later loses nothing the in-memory bound kept); the exporters start either way, once."""
        from ._spool import SpoolWriter

        if not self._sinks_made:
            self._sinks_made = True
            self._make_sinks()
        try:
            cfg = self.config
            self._spool = SpoolWriter(
                self.run_path,
                self.identity,
                node_spool_dir=cfg.node_spool_dir,
                flush_interval_s=cfg.flush_interval_s,
                max_job_files_per_s=cfg.max_job_files_per_s,
            )
        except Exception as exc:
            self.reporter.warn_once(
                "spool",
                f"cannot write the run directory {self.run_path!r} ({exc}); rows are kept in memory (bounded) "
                "and the spool is retried at every flush",
            )

    def _make_sinks(self) -> None:
        """Start the optional exporters (Prometheus, OTLP) configured for this rank."""
        from ._sinks import make_sinks

        try:
            self.sinks.extend(make_sinks(self.config, self.identity, self.reporter, lambda: self.records_dropped_total))
        except Exception as exc:
            self.reporter.fail("exporters", exc)

    def _write(self, rows: dict[str, list[dict]]) -> None:
        for sink in self.sinks:
            for kind, batch in rows.items():
                if batch:
                    try:
                        sink.write(kind, batch)
                    except Exception as exc:
                        self.reporter.fail(type(sink).__name__, exc)
        limit = self.config.max_buffered_events
        for kind, batch in rows.items():
            pending = self._backlog.pop(kind, []) + batch
            if not pending:
                continue
            try:
                if self._spool is None:
                    raise OSError("the run directory is not writable yet")
                self._spool.write(kind, pending)
            except Exception as exc:
                # Disk full, directory gone...: keep the rows (bounded) and try again next flush.
                if self._spool is not None:
                    self.reporter.warn_once(
                        "spool_write", f"writing the spool failed ({exc}); retrying, rows kept in memory"
                    )
                if len(pending) > limit:
                    self.records_dropped_total += len(pending) - limit
                    pending = pending[-limit:]
                self._backlog[kind] = pending

    def _write_meta(self, final: bool) -> None:
        if self._spool is None:
            return
        identity = self.identity
        errors = dict(self.reporter.errors)
        torch = sys.modules.get("torch")
        meta = {
            "schema_version": SCHEMA_VERSION,
            "ranksight_version": __version__,
            **identity.labels(),
            "node_rank": identity.node_rank,
            "status": (self._exit_status() or "finished") if final else "running",
            "started_ns": self._started_ns,
            "heartbeat_ns": time.time_ns(),
            "flush_interval_s": self.config.flush_interval_s,
            "steps": self._steps(),
            "torch_version": getattr(torch, "__version__", None),
            "python_version": platform.python_version(),
            "hostname": platform.node(),
            "argv": sys.argv[:20],
            "counters": {
                "agent_errors_total": sum(errors.values()),
                "agent_errors": errors,
                "records_dropped_total": self.records_dropped_total,
                "graph_breaks_total": self._compile.graph_breaks_total if self._compile else 0,
                "recompiles_total": self._compile.recompiles_total if self._compile else 0,
                "rows_spooled_total": self._spool.rows_written,
                "agent_flush_seconds_total": round(self.flush_seconds_total, 6),
                "agent_flushes_total": self.flushes_total,
            },
            **{k: v for k, v in self._info.items()},
        }
        try:
            self._spool.write_meta(meta)
        except Exception as exc:
            self.reporter.warn_once("meta_write", f"writing rank metadata failed ({exc})")
