"""What every integration shares: starting the agent once the process group is up, and step marks
for loops that have no ``mon.step()`` (a step opens when a batch arrives and closes when the
optimizer steps).

The marks go through the monitor's public mark API (``step_begin``, ``optimizer_begin``, ...: see
``agent/_monitor.py``): integer stores and clock reads only, no I/O, no locks, no device synchronisation.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Optional


def _disabled(init_kwargs: dict) -> bool:
    flag = os.environ.get("RANKSIGHT_DISABLED", "").strip().lower() in ("1", "true", "yes", "on")
    return init_kwargs.get("enabled") is False or flag


def _live_group():
    """torch.distributed when a process group with more than one rank is up, else None."""
    from ranksight.agent import live_process_group

    dist = live_process_group()
    try:
        return dist if dist is not None and dist.get_world_size() > 1 else None
    except Exception:  # a group torn down under us reads as no group
        return None


def _candidate_run_id(world_size: int, job: str) -> str:
    """The run id rank 0 proposes when neither the user nor the environment names one.

    Under torchrun or SLURM the agent's own derivation is shared by all ranks. Elsewhere (Lightning's
    subprocess launcher, where rank 0 *is* the launcher) rank 0's own process is the job's launcher.
    """
    from ranksight.agent import derive_run_id

    env = os.environ
    if env.get("SLURM_JOB_ID") or "TORCHELASTIC_RUN_ID" in env:
        return derive_run_id(world_size, job)
    return derive_run_id(1, job)


def agree_run_id(broadcast: Optional[Callable[[Any], Any]] = None, job: Optional[str] = None) -> Optional[str]:
    """Return one run id for all ranks (rank 0's, sent to the others), or None for a single process.

    ``broadcast(obj)`` sends rank 0's object to every rank and returns it (Lightning's
    ``strategy.broadcast``); without it, ``torch.distributed.broadcast_object_list`` is used. All
    ranks must call this together, as they do from a framework's setup hook.
    """
    if os.environ.get("RANKSIGHT_RUN_ID"):
        return os.environ["RANKSIGHT_RUN_ID"]
    dist = _live_group()
    if dist is None:
        return None
    job = job or os.environ.get("RANKSIGHT_JOB") or "default"
    candidate = _candidate_run_id(dist.get_world_size(), job) if dist.get_rank() == 0 else None
    if broadcast is not None:
        return broadcast(candidate)
    box = [candidate]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def start_monitor(init_kwargs: dict, broadcast: Optional[Callable[[Any], Any]] = None, framework: str = "plain"):
    """Start the agent for a framework run; a no-op monitor (and no collective) when disabled."""
    import ranksight
    from ranksight.agent import NoopMonitor

    if _disabled(init_kwargs):
        return NoopMonitor(None)
    kwargs = {"framework": framework, **init_kwargs}
    if not kwargs.get("run_id"):
        kwargs["run_id"] = agree_run_id(broadcast, kwargs.get("job"))
    return ranksight.init(**kwargs)


class LoaderFetchTimer:
    """Time what a framework's loop spends inside DataLoader iterators' ``__next__``, and nothing else.

    Frameworks fetch the batch inside their own loop (Lightning's prefetching fetcher, the Hugging Face
    Trainer's epoch iterator) and do their own work between batches (logging, moving the batch,
    callbacks). Timing the gap between two batches counted that work as data wait: a healthy Lightning
    run whose ``__next__`` took 0.09 ms read 22 % input-bound. Instead, while armed, every
    ``DataLoader`` iterator's ``__next__`` runs inside ``monitor.data()``. It is installed on the
    iterator base class for the fit and removed at its end; disarmed (validation, evaluation), it is
    one attribute read per batch.
    """

    def __init__(self, monitor: Any, training: Optional[Callable[[], bool]] = None) -> None:
        self._m = monitor
        self.armed = False
        self._training = training  # e.g. ``lambda: model.training``: an eval loop between steps is not input
        self._cls: Any = None
        self._original: Any = None

    def install(self) -> bool:
        """Start timing; False when torch's DataLoader iterator cannot be found (nothing is timed)."""
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter
        except ImportError:
            return False
        if self._cls is not None:
            return True
        original = _BaseDataLoaderIter.__next__
        timer = self

        def timed_next(it):
            if not timer.armed or (timer._training is not None and not timer._training()):
                return original(it)
            with timer._m.data():
                return original(it)

        self._cls, self._original = _BaseDataLoaderIter, original
        _BaseDataLoaderIter.__next__ = timed_next
        self._m.note_data_source("framework")
        return True

    def remove(self) -> None:
        """Put torch's ``__next__`` back."""
        if self._cls is not None:
            self._cls.__next__ = self._original
            self._cls = self._original = None
        self.armed = False


class ImplicitSteps:
    """Step marks for a loop without ``mon.step()``: open at a batch's arrival, close at ``optimizer.step()``.

    With gradient accumulation one step spans several batches and only the first batch's wait is
    counted as data wait. A step opened by a loader that runs out before any optimizer step (an
    evaluation loop) is dropped instead of recorded.
    """

    __slots__ = ("_m", "_opened_by", "loader_driven")

    def __init__(self, monitor: Any) -> None:
        self._m = monitor
        self._opened_by: Any = None
        self.loader_driven = False
        """Whether a step opened by a batch was closed by an optimizer step (``ranksight run`` falls back without)."""

    def fetched(self, source: Any, begin_ns: int) -> None:
        """A batch arrived from ``source`` after waiting since ``begin_ns``."""
        m = self._m
        if m.enabled and not m.in_step:
            m.step_begin(begin_ns)
            self._opened_by = source

    def exhausted(self, source: Any) -> None:
        """``source`` ran out; drop the step it opened if no optimizer step closed it."""
        m = self._m
        if m.in_step and self._opened_by is source:
            m.discard_step()  # not a training step: an evaluation loop or a partial accumulation
            self._opened_by = None

    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._m.optimizer_begin()

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        m = self._m
        if m.optimizer_end():  # the step closes with the optimizer step it saw begin
            m.step_end()
            if self._opened_by is not None:
                self.loader_driven = True
                self._opened_by = None


def _report(steps: Any, component: str, exc: Exception) -> None:
    """Count and report (once) a failure of the step marks through the monitor, never raise."""
    report = getattr(getattr(steps, "_m", None), "report_failure", None)
    if callable(report):
        report(component, exc)
    else:
        logging.getLogger("ranksight").warning("ranksight: %s failed: %s", component, exc)


class TimedIterator:
    """An iterator that reports each batch's wait to :class:`ImplicitSteps`; other attributes pass through."""

    __slots__ = ("_it", "_steps", "_clock")

    def __init__(self, iterator: Any, steps: ImplicitSteps, clock: Callable[[], int]) -> None:
        self._it = iterator
        self._steps = steps
        self._clock = clock

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        m = self._steps._m
        if m.in_step:
            # A micro-batch fetched inside the open step (gradient accumulation): data wait of that step, not
            # the compute it interrupts.
            try:
                with m.data():
                    return next(self._it)
            except StopIteration:
                try:
                    self._steps.exhausted(self)
                except Exception as exc:
                    _report(self._steps, "loader_marks", exc)
                raise
        begin = self._clock()
        try:
            item = next(self._it)
        except StopIteration:
            try:
                self._steps.exhausted(self)
            except Exception as exc:  # the marks must never break the user's loop
                _report(self._steps, "loader_marks", exc)
            raise
        try:
            self._steps.fetched(self, begin)
        except Exception as exc:
            _report(self._steps, "loader_marks", exc)
        return item

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class TimedLoader:
    """A loader whose iterators are :class:`TimedIterator`; attributes (``sampler``, ``dataset``...) pass through."""

    def __init__(self, loader: Any, steps: ImplicitSteps, clock: Callable[[], int]) -> None:
        self._loader = loader
        self._steps = steps
        self._clock = clock
        note = getattr(steps._m, "note_loader", None)
        if note is not None:  # Accelerate's prepared loader: the settings are its base DataLoader's
            try:
                note(getattr(loader, "base_dataloader", None) or loader)
            except Exception as exc:
                _report(steps, "loader_facts", exc)

    def __iter__(self) -> TimedIterator:
        return TimedIterator(iter(self._loader), self._steps, self._clock)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def find_ddp_wrapper(model: Any) -> Any:
    """Return the outermost wrapper the training loop calls: the DistributedDataParallel module that wraps
    ``model`` — or the ``torch.compile`` wrapper around that DDP, when the framework compiled it
    (Accelerate compiles the DDP module itself: hooks on the DDP module then run inside the compiled
    region and are skipped) — else ``model`` itself.

    Used once per run by callbacks that are only handed the inner model (the Hugging Face Trainer);
    it walks the garbage collector's referrers, which costs a scan of the heap, not a per-step cost.
    """
    torch = sys.modules.get("torch")
    if torch is None or _live_group() is None:
        return model
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    ddp = (
        model if isinstance(model, ddp_cls) else _holder(model, lambda h: isinstance(h, ddp_cls) and h.module is model)
    )
    if ddp is None:
        return model
    compiled = _holder(ddp, lambda h: isinstance(h, torch.nn.Module) and getattr(h, "_orig_mod", None) is ddp)
    return compiled if compiled is not None else ddp


def _holder(obj: Any, is_it: Callable[[Any], bool]) -> Any:
    """The object holding ``obj`` as a submodule that ``is_it`` accepts, found through the referrers."""
    import gc

    # obj <- holder._modules (a dict) <- holder.__dict__ (a dict, when materialised) <- holder
    frontier = [obj]
    for _ in range(3):
        dicts = []
        for item in frontier:
            for holder in gc.get_referrers(item):
                if is_it(holder):
                    return holder
                if isinstance(holder, dict):
                    dicts.append(holder)
        frontier = dicts[:64]  # bounded: a module is held by few dicts
    return None


# ----------------------------------------------------------------- experiment trackers (ranksight.exporters)
TRACKER_NAMES = ("wandb", "mlflow", "tensorboard")


def wanted_trackers(trackers: Any) -> frozenset:
    """``"auto"`` (every tracker the framework logs to), ``None`` / ``"none"`` / ``()`` (none), a name or names."""
    if trackers in (None, False, "none", ()):
        return frozenset()
    if trackers in ("auto", True):
        return frozenset(TRACKER_NAMES)
    names = {trackers} if isinstance(trackers, str) else set(trackers)
    unknown = names - set(TRACKER_NAMES)
    if unknown:
        raise ValueError(f"trackers: unknown {sorted(unknown)}; known: {', '.join(TRACKER_NAMES)}, 'auto' or None")
    return frozenset(names)


def follow_trackers(monitor: Any, make_sinks: Callable[[], list], interval_s: float) -> Any:
    """On global rank 0, start a ``ranksight.exporters.Follower`` feeding the sinks ``make_sinks()`` finds (the
    framework's trackers); None elsewhere, when there are none, or when they cannot be reached (one line).

    Rank 0 reads every rank's records from the run folder, so one tracker run holds all ranks, keyed
    ``ranksight/rank<r>/...``: the trackers the frameworks set up exist on rank 0 only. The folder is read by
    a process of the follower's own (``python -m ranksight.exporters._reader``, ended at ``finish``); a thread
    of this process only hands what it sends to the trackers, whose runs live here. Nothing of it runs on the
    training thread.
    """
    if monitor is None or not monitor.enabled or monitor.identity.rank != 0:
        return None
    try:
        sinks = make_sinks()
        if not sinks:
            return None
        from ranksight.exporters import Follower

        return Follower(monitor.run_path, sinks, interval_s=interval_s, process=True).start()
    except Exception as exc:  # a tracker that cannot be reached never stops the job
        logging.getLogger("ranksight").warning("ranksight: trackers not fed: %s: %s", type(exc).__name__, exc)
        return None


def finish_trackers(follower: Any, timeout_s: float = 60.0) -> None:
    """Log the verdict and report (after the agent's last flush) and end the runs the exporter started."""
    if follower is not None:
        try:
            follower.finish(timeout_s)
        except Exception as exc:
            logging.getLogger("ranksight").warning("ranksight: trackers: verdict not logged: %s", exc)
