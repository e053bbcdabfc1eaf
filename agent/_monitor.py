"""The per-rank monitor: the hot path that runs on the training thread.

Everything here is a handful of clock reads, integer stores and one ``deque.append`` per step: no
I/O, no locks, no device synchronisation, no ``.item()``. The agent thread (``_worker``) turns the
raw marks into records. Anything that fails is counted, reported once, and switched off.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from ._config import Config
from ._identity import Identity, is_settled, resolve

log = logging.getLogger("ranksight")

# Tags of the raw events the hot path appends; the worker decodes them.
EV_STEP = "S"  # (tag, step, begin_ns, end_ns, fetch_begin_ns, fetch_end_ns, fwd_ns, opt_begin_ns, opt_end_ns)
EV_BUCKET_READY = "B"  # (tag, step, bucket, bytes, ready_ns, is_last)
EV_BUCKET_DONE = "D"  # (tag, step, bucket, done_ns)
EV_INFO = "I"  # (tag, name, payload): rare structured facts (DDP config, model size, ...)
EV_GPU = "G"  # (tag, step, payload): GPU-side marks, resolved later by the GPU sampler


def _is_compiling_fn():
    """Return torch's 'am I being traced by dynamo' check, or a constant False on old torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return lambda: False
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if fn is None:
        fn = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return fn or (lambda: False)


class _StepContext:
    """The reusable context manager that ``Monitor.step()`` returns (no allocation per step)."""

    __slots__ = ("_m",)

    def __init__(self, monitor: Monitor) -> None:
        self._m = monitor

    def __enter__(self) -> _StepContext:
        m = self._m
        if m._active:
            try:
                if m._is_compiling():
                    return self
                m._in_step = True
                m._fwd_ns = 0
                m._opt_begin_ns = 0
                m._opt_end_ns = 0
                m._step_begin_ns = m._clock()
            except Exception as exc:  # never raise into the training loop
                m._fail("step", exc)
            if m._gpu is not None:
                try:
                    m._gpu.step_begin(m._step)
                except Exception as exc:  # the GPU part turns itself off; step marks go on
                    m._gpu = None
                    m._fail("gpu", exc)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        m = self._m
        if m._active and m._in_step:
            try:
                end = m._clock()
                m._in_step = False
                fb, fe = m._fetch_begin_ns, m._fetch_end_ns
                m._fetch_begin_ns = m._fetch_end_ns = 0
                step = m._step
                if m._gpu is not None:
                    try:
                        m._gpu.step_end(step)
                    except Exception as exc:
                        m._gpu = None
                        m._fail("gpu", exc)
                m._append((EV_STEP, step, m._step_begin_ns, end, fb, fe, m._fwd_ns, m._opt_begin_ns, m._opt_end_ns))
                m._produced += 1
                m._step = step + 1
                # DDP samples its runtime stats on its first iterations and then every 100: step 10 is the
                # first read that knows about unused parameters; then every ddp_stats_every_steps.
                if m._ddp_stats is not None and (step == 10 or (step and step % m._ddp_stats_every == 0)):
                    m._append((EV_INFO, "ddp_logging", m._ddp_stats()))
            except Exception as exc:
                m._fail("step", exc)
        return False  # the user's exception, if any, goes on


class LoaderWrapper:
    """Iterate the user's loader and time how long each ``next()`` blocks (the data wait).

    Attributes the loader has (``sampler``, ``dataset``, ``batch_size``...) pass through, so code
    like ``loader.sampler.set_epoch(e)`` keeps working on the wrapper.
    """

    def __init__(self, monitor: Monitor, loader: Iterable) -> None:
        self._monitor = monitor
        self._loader = loader

    def __iter__(self) -> Iterator:
        m = self._monitor
        clock = m._clock
        it = iter(self._loader)
        while True:
            begin = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            m._fetch_begin_ns = begin
            m._fetch_end_ns = clock()
            yield item

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class Monitor:
    """One rank's telemetry agent. Create it with :func:`ranksight.init`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._active = True
        self._closed = False
        self._clock = time.perf_counter_ns
        # Offset turning perf_counter_ns into Unix ns: sampled once, so the hot path reads one clock.
        self._wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._events: deque = deque(maxlen=config.max_buffered_events)
        self._append = self._events.append
        self._produced = 0  # step marks appended; only the training thread writes it (drop accounting)
        self._step = 0
        self._in_step = False
        self._step_begin_ns = 0
        self._fetch_begin_ns = 0
        self._fetch_end_ns = 0
        self._fwd_ns = 0
        self._opt_begin_ns = 0
        self._opt_end_ns = 0
        self._gpu = None  # GPU marks (CUDA events), attached by watch() when the model is on a GPU
        self._ddp_stats = None
        self._ddp_stats_every = max(1, config.ddp_stats_every_steps)
        self._is_compiling = _is_compiling_fn()
        self._step_ctx = _StepContext(self)
        self._hook_handles: list = []
        self._identity: Optional[Identity] = None
        self.errors: dict[str, int] = {}
        self._reported: set[str] = set()
        from ._worker import Worker

        self._worker = Worker(self)
        self._worker.start()
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    # ---------------------------------------------------------------- public API
    def step(self) -> _StepContext:
        """Mark one training step: ``with mon.step(): ...``."""
        return self._step_ctx

    def step_begin(self, waited_since_ns: int = 0) -> None:
        """Open a step from a framework callback; ``waited_since_ns`` (perf_counter_ns) starts its data wait."""
        if waited_since_ns and self._active:
            self._fetch_begin_ns, self._fetch_end_ns = waited_since_ns, self._clock()
        self._step_ctx.__enter__()

    def step_end(self) -> None:
        """Close the step opened by :meth:`step_begin`."""
        self._step_ctx.__exit__(None, None, None)

    def loader(self, iterable: Iterable) -> LoaderWrapper:
        """Wrap a data loader so the time blocked waiting for each batch is measured."""
        return LoaderWrapper(self, iterable)

    # Marks for framework callbacks that cannot wrap the loop in ``mon.step()`` or hook the optimizer
    # themselves (what ranksight.integrations use). Each is a clock read and an integer store.
    now_ns = staticmethod(time.perf_counter_ns)
    """The agent's clock: take it where a batch wait starts and pass it to :meth:`step_begin`."""

    @property
    def in_step(self) -> bool:
        """Whether a step is open (between step begin and end)."""
        return self._in_step

    def forward_begin(self) -> None:
        """Mark the first forward of the open step (``watch()`` does this with a forward pre-hook)."""
        if self._in_step and self._fwd_ns == 0:
            self._fwd_ns = self._clock()

    def optimizer_begin(self) -> None:
        """Mark ``optimizer.step()`` starting in the open step (``watch(optimizer=)`` does this itself)."""
        if self._in_step:
            self._opt_begin_ns = self._clock()

    def optimizer_end(self) -> bool:
        """Mark ``optimizer.step()`` done; False (and ignored) without a matching :meth:`optimizer_begin`."""
        if self._in_step and self._opt_begin_ns:
            self._opt_end_ns = self._clock()
            return True
        return False

    def discard_step(self) -> None:
        """Drop the open step without recording it (e.g. an evaluation loop opened it)."""
        self._in_step = False

    def watch(self, model: Any, optimizer: Any = None) -> Monitor:
        """Attach to a model (plain, DDP-wrapped or compiled) and optionally its optimizer."""
        if not self._active:
            return self
        try:
            from ._attach import attach_model, attach_optimizer

            attach_model(self, model)
            if optimizer is not None:
                attach_optimizer(self, optimizer)
        except Exception as exc:
            self._fail("watch", exc)
        return self

    def close(self) -> None:
        """Flush what is pending to the spool and stop the agent thread; also runs at exit."""
        if self._closed:
            return
        self._closed = True
        self._active = False
        for handle in self._hook_handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._hook_handles.clear()
        window = getattr(self._gpu, "window", None)
        if window is not None:  # never leave a sampled profiler window running after close
            window.abort()
        try:
            self._worker.stop()
        except Exception as exc:
            log.warning("ranksight: final flush failed: %s", exc)
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    @property
    def identity(self) -> Identity:
        """This rank's identity (job, run, node, rank, ...), resolved on first use."""
        if self._identity is None or not self._identity_settled:
            self._settle_identity(force=True)
        return self._identity  # type: ignore[return-value]

    @property
    def run_path(self) -> str:
        """The folder this run's records go to: ``<run_dir>/<run_id>``."""
        return os.path.join(self.config.run_dir, self.identity.run)

    @property
    def enabled(self) -> bool:
        """Whether the monitor is recording."""
        return self._active

    @property
    def steps_recorded(self) -> int:
        """Steps marked on this rank so far."""
        return self._step

    # ---------------------------------------------------------------- internals
    _identity_settled = False

    def _settle_identity(self, force: bool = False) -> bool:
        """Fix rank, node and run id once the launcher or process group tells them for sure."""
        if self._identity_settled:
            return True
        settled = is_settled()
        if settled or force:
            self._identity = resolve(self.config.job, self.config.run_id)
            self._identity_settled = settled
        return settled

    def _fail(self, component: str, exc: BaseException) -> None:
        """Count an agent error, report it once per component, and keep training going."""
        self.errors[component] = self.errors.get(component, 0) + 1
        if component not in self._reported:
            self._reported.add(component)
            log.warning("ranksight: %s failed and is switched off (%s: %s)", component, type(exc).__name__, exc)
            try:
                self._append((EV_INFO, "error", (component, f"{type(exc).__name__}: {exc}")))
            except Exception:
                pass
        if component == "step":
            self._active = False

    def _warn_once(self, key: str, message: str) -> None:
        """Log a degradation warning once and keep it as an event record."""
        if key in self._reported:
            return
        self._reported.add(key)
        log.warning("ranksight: %s", message)
        self._append((EV_INFO, "warning", (key, message)))

    def _after_fork_in_child(self) -> None:
        # A forked child (e.g. a DataLoader worker) has no agent thread and must not write the spool.
        self._active = False
        self._closed = True
