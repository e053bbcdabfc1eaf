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
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional

from . import _exit_watch
from ._config import Config
from ._events import EV_INFO, EV_STEP
from ._host import HostSampler
from ._identity import Identity, IdentityHolder
from ._report import Reporter
from ._stack_window import StackWindow
from ._worker import Worker

log = logging.getLogger("ranksight")

_thread_cpu_ns = time.thread_time_ns  # ~0.4 µs a read: this thread's CPU clock, read at step open and close


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
                if not m._train_thread:
                    m._train_thread = threading.get_ident()  # whose stack the sampled window reads
                m._fwd_ns = 0
                m._opt_begin_ns = 0
                m._opt_end_ns = 0
                m._step_begin_ns = m._clock()
                m._step_cpu_ns = _thread_cpu_ns()
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
                cpu_ns = _thread_cpu_ns() - m._step_cpu_ns
                m._in_step = False
                fb, fe = m._fetch_begin_ns, m._fetch_end_ns
                m._fetch_begin_ns = m._fetch_end_ns = 0
                data_ns = m._data_ns if m._data_measured else -1
                pre_ns, pre_begin, in_compute = m._pre_data_ns, m._pre_data_begin_ns, m._data_in_compute_ns
                m._data_ns = m._pre_data_ns = m._pre_data_begin_ns = m._data_in_compute_ns = 0
                step = m._step
                if m._gpu is not None:
                    try:
                        m._gpu.step_end(step)
                    except Exception as exc:
                        m._gpu = None
                        m._fail("gpu", exc)
                m._append(
                    (EV_STEP, step, m._step_begin_ns, end, fb, fe, m._fwd_ns, m._opt_begin_ns, m._opt_end_ns, data_ns,
                     pre_ns, pre_begin, in_compute, cpu_ns)
                )  # fmt: skip
                m._produced += 1
                m._step = step + 1
                # DDP samples its runtime stats on its first iterations and then every 100: step 2 is the
                # first read that knows the rebuilt buckets, step 10 the first that knows about unused
                # parameters; then every ddp_stats_every_steps.
                if m._ddp_stats is not None and (step in (2, 10) or (step and step % m._ddp_stats_every == 0)):
                    m._append((EV_INFO, "ddp_logging", m._ddp_stats()))
            except Exception as exc:
                m._fail("step", exc)
        return False  # the user's exception, if any, goes on


class _DataContext:
    """The reusable context manager that ``Monitor.data()`` returns: time inside it is data wait.

    Inside a step it adds to that step's data wait; before a step opens (a fetch at the top of the
    loop) it also moves the step's start back to the fetch, as a wrapped loader's wait does. On a GPU
    rank a block inside a step is also bracketed with two CUDA events: the stream's time between them
    is what the fetch cost the GPU (``gpu_data_idle_s``).
    """

    __slots__ = ("_m", "_begin_ns", "_gpu_begin", "_gpu_step", "_depth")

    def __init__(self, monitor: Monitor) -> None:
        self._m = monitor
        self._begin_ns = 0
        self._gpu_begin = None  # on a GPU rank, inside a step: the event the block's GPU idle is timed from
        self._gpu_step = 0
        self._depth = 0  # blocks open: one nested in another (a marked get_batch in a marked loop) is the outer's

    def __enter__(self) -> _DataContext:
        m = self._m
        self._depth += 1
        if self._depth == 1 and m._active:
            self._begin_ns = m._clock()
            if m._in_step and m._gpu is not None:
                try:
                    self._gpu_begin = m._gpu.data_begin()
                    self._gpu_step = m._step
                except Exception as exc:
                    m._gpu = None
                    m._fail("gpu", exc)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        m = self._m
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return False  # an inner block: the outer one times the whole fetch
        begin = self._begin_ns
        gpu_begin, self._gpu_begin = self._gpu_begin, None
        if gpu_begin is not None and m._gpu is not None:
            try:
                m._gpu.data_end(self._gpu_step, gpu_begin)
            except Exception as exc:
                m._gpu = None
                m._fail("gpu", exc)
        if begin and m._active:
            self._begin_ns = 0
            if not m._data_measured:
                m._data_measured = True
                m._append((EV_INFO, "data_source", "marks"))
            if m._in_step:
                elapsed = m._clock() - begin
                m._data_ns += elapsed
                if m._fwd_ns and not m._opt_begin_ns:  # a prefetch between forward and optimizer
                    m._data_in_compute_ns += elapsed
            else:
                m._pre_data_ns += m._clock() - begin
                if not m._pre_data_begin_ns:
                    m._pre_data_begin_ns = begin
        return False


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
        m._data_measured = True
        if not m._loader_described:
            m._loader_described = True
            m._append((EV_INFO, "loader", describe_loader(self._loader)))
            m._append((EV_INFO, "data_source", "loader"))
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


def describe_loader(loader: Any) -> dict:
    """The DataLoader settings a fix is fitted to (None for what this loader does not have)."""
    facts: dict = {"class": type(loader).__name__}
    for name in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"):
        value = getattr(loader, name, None)
        facts[name] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
    return facts


def _host_facts(config: Config) -> dict:
    """Cores this rank may use and what shares them: the numbers the oversubscription check reads."""
    facts: dict = {"cpu_count": os.cpu_count()}
    try:
        facts["cpus_allowed"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        facts["cpus_allowed"] = os.cpu_count()
    local_ws = os.environ.get("LOCAL_WORLD_SIZE", "")
    facts["local_world_size"] = int(local_ws) if local_ws.isdigit() else None
    torch = sys.modules.get("torch")
    try:
        facts["torch_threads"] = torch.get_num_threads() if torch is not None else None
    except Exception:
        facts["torch_threads"] = None
    facts["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    try:
        facts["load_avg_1m"] = os.getloadavg()[0]
    except (AttributeError, OSError):
        facts["load_avg_1m"] = None
    return facts


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
        self._step_cpu_ns = 0
        self._fetch_begin_ns = 0
        self._fetch_end_ns = 0
        self._data_ns = 0  # time inside mon.data() blocks in the open step
        self._pre_data_ns = 0  # time inside mon.data() blocks between the last step and this one
        self._pre_data_begin_ns = 0  # start of the first of those
        self._data_in_compute_ns = 0  # the part of _data_ns between the first forward and the optimizer
        self._data_measured = False  # a wrapped loader or a mon.data() block was seen: data wait is known
        self._loader_described = False
        self._fwd_ns = 0
        self._opt_begin_ns = 0
        self._opt_end_ns = 0
        self._gpu = None  # GPU marks (CUDA events), attached by watch() when the model is on a GPU
        self._ddp_stats = None
        self._ddp_stats_every = max(1, config.ddp_stats_every_steps)
        self._is_compiling = _is_compiling_fn()
        self._step_ctx = _StepContext(self)
        self._data_ctx = _DataContext(self)
        self._hook_handles: list = []
        self._closers: list = []  # undo what watch() installed beyond hook handles (patched functions)
        self._identity_holder = IdentityHolder(config.job, config.run_id)
        self._reporter = Reporter(self._append, self._stop_recording)
        self.errors = self._reporter.errors
        self.exit_status: Optional[str] = None  # "crashed" / "terminated", set by _exit_watch as the process ends
        self._worker = Worker(
            config,
            events=self._events,
            produced=lambda: self._produced,
            steps=lambda: self._step,
            identity=self._identity_holder,
            reporter=self._reporter,
            wall_offset_ns=self._wall_offset_ns,
            status=lambda: self.exit_status,
        )
        self._append((EV_INFO, "host", _host_facts(config)))
        self._append((EV_INFO, "framework", config.framework))
        self._collectives_on = False
        self._time_collectives()
        self._worker.add_sampler(HostSampler(lambda: self._step))
        self._train_thread = 0
        if config.stack_window:
            self._worker.add_sampler(StackWindow(self))
        self._worker.start()
        atexit.register(self.close)
        _exit_watch.install(self)
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
            self._data_measured = True
        self._step_ctx.__enter__()

    def step_end(self) -> None:
        """Close the step opened by :meth:`step_begin`."""
        self._step_ctx.__exit__(None, None, None)

    def loader(self, iterable: Iterable) -> LoaderWrapper:
        """Wrap a data loader so the time blocked waiting for each batch is measured."""
        return LoaderWrapper(self, iterable)

    def data(self) -> _DataContext:
        """Mark a data fetch that is not a loader: ``with mon.data(): x, y = get_batch()``.

        Use it before the step or inside it (a prefetch after forward); the time counts as data wait.
        A rank that neither wraps a loader nor marks fetches reports its data wait as not measured.
        """
        return self._data_ctx

    def note_loader(self, loader: Any) -> None:
        """Record the settings of the loader this rank trains from (``num_workers``, ``pin_memory``...), which
        the input-bound fix is fitted to; for integrations that time a loader without :meth:`loader`."""
        if self._active and not self._loader_described:
            self._loader_described = True
            self._append((EV_INFO, "loader", describe_loader(loader)))

    def note_data_source(self, source: str) -> None:
        """Say how this rank's input is measured (``"framework"`` for an integration that times its loop's
        fetches): data wait then reads 0 for a step that waited for nothing, not "not measured"."""
        self._data_measured = True
        self._append((EV_INFO, "data_source", source))

    def warn(self, key: str, message: str) -> None:
        """For integrations: a degradation the user should know about, logged once per ``key`` and kept
        as an event record."""
        self._reporter.warn_once(key, message)

    def report_failure(self, component: str, exc: BaseException) -> None:
        """For integrations: a part of theirs failed; count it and report it once (never raises)."""
        self._reporter.count(component, exc)

    def add_sampler(self, sampler: Callable[[], list]) -> None:
        """Run ``sampler()`` on the agent thread at every flush; it returns ``samples`` rows
        (``{"time_ns", "step", "name", "value"}``). A sampler that raises is counted and removed."""
        self._worker.add_sampler(sampler)

    # Marks for framework callbacks that cannot wrap the loop in ``mon.step()`` or hook the optimizer
    # themselves (what ranksight.integrations use). Each is a clock read and an integer store.
    now_ns = staticmethod(time.perf_counter_ns)
    """The agent's clock: take it where a batch wait starts and pass it to :meth:`step_begin`."""

    @property
    def in_step(self) -> bool:
        """Whether a step is open (between step begin and end)."""
        return self._in_step

    def forward_begin(self) -> None:
        """Mark the first forward of the open step (``watch()`` does this with a forward pre-hook); on a GPU
        rank it marks the stream too. A framework whose step may never call the watched module's ``forward``
        (a LightningModule whose ``training_step`` calls a submodule) marks compute's start with this."""
        if self._in_step and self._fwd_ns == 0:
            self._fwd_ns = self._clock()
            if self._gpu is not None:
                try:
                    self._gpu.forward()
                except Exception as exc:
                    self._gpu = None
                    self._fail("gpu", exc)

    def optimizer_begin(self) -> None:
        """Mark ``optimizer.step()`` starting in the open step (``watch(optimizer=)`` does this itself).

        On a GPU rank it marks the stream too: a framework that runs forward and backward inside
        ``optimizer.step(closure)`` (Lightning) calls this after the closure, where the optimizer's own
        pre-hook fired before forward and was not taken as the optimizer's start."""
        if self._in_step:
            self._opt_begin_ns = self._clock()
            if self._gpu is not None:
                try:
                    self._gpu.optimizer(framework=True)
                except Exception as exc:
                    self._gpu = None
                    self._fail("gpu", exc)

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

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush what is pending to the spool and stop the agent thread; also runs at exit.

        ``timeout_s`` bounds the wait for the final flush (a signal handler passes a short one)."""
        if self._closed:
            return
        self._closed = True
        self._active = False
        for handle in [*self._hook_handles, *self._closers]:
            try:
                handle.remove()
            except Exception as exc:  # a hook torch already dropped (its module is gone): nothing to undo
                log.debug("ranksight: removing a hook failed: %s", exc)
        self._hook_handles.clear()
        self._closers.clear()
        window = getattr(self._gpu, "window", None)
        if window is not None:  # never leave a sampled profiler window running after close
            window.abort()
        try:
            self._worker.stop(timeout_s)
        except Exception as exc:
            log.warning("ranksight: final flush failed: %s", exc)
        atexit.unregister(self.close)
        _exit_watch.forget(self)

    @property
    def identity(self) -> Identity:
        """This rank's identity (job, run, node, rank, ...), resolved on first use."""
        return self._identity_holder.get()

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
    def _wire_gpu(self, marks: Any, resolver: Any, samplers: list) -> None:
        """Install the GPU parts ``attach_gpu`` built: marks on the hot path, resolver and samplers on the
        agent thread. The one place GPU parts meet the monitor."""
        for sampler in samplers:
            self._worker.add_sampler(sampler)
        self._worker.gpu_resolver = resolver
        self._gpu = marks

    def _time_collectives(self) -> None:
        """Time torch.distributed's collectives for this monitor (once torch is imported; idempotent)."""
        if self._collectives_on or "torch" not in sys.modules or not self.config.time_collectives:
            return
        from . import _collectives

        try:
            if _collectives.install(self):
                self._collectives_on = True
                self._closers.append(_collectives.handle(self))
                self._worker.collectives_timed()
        except Exception as exc:
            self._fail("collectives", exc)

    def _stop_recording(self) -> None:
        self._active = False

    def _fail(self, component: str, exc: BaseException) -> None:
        """Count an agent error, report it once per component, and keep training going."""
        self._reporter.fail(component, exc)

    def _warn_once(self, key: str, message: str) -> None:
        """Log a degradation warning once and keep it as an event record."""
        self._reporter.warn_once(key, message)

    def _after_fork_in_child(self) -> None:
        # A forked child (e.g. a DataLoader worker) has no agent thread and must not write the spool.
        self._active = False
        self._closed = True
