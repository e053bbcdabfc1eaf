"""What every integration shares: starting the agent once the process group is up, and step marks
for loops that have no ``mon.step()`` (a step opens when a batch arrives and closes when the
optimizer steps).

The marks go through the monitor's public mark API (``step_begin``, ``optimizer_begin``, ...: see
``agent/_monitor.py``): integer stores and clock reads only, no I/O, no locks, no device synchronisation.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional


def _disabled(init_kwargs: dict) -> bool:
    from ranksight.agent._config import _env_flag

    return init_kwargs.get("enabled") is False or _env_flag("RANKSIGHT_DISABLED")


def _live_group():
    """torch.distributed when a process group with more than one rank is up, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
    except Exception:
        return None
    return None


def _candidate_run_id(world_size: int) -> str:
    """The run id rank 0 proposes when neither the user nor the environment names one.

    Under torchrun or SLURM the agent's own derivation is shared by all ranks. Elsewhere (Lightning's
    subprocess launcher, where rank 0 *is* the launcher) rank 0's own process is the job's launcher.
    """
    from ranksight.agent._identity import derive_run_id

    env = os.environ
    if env.get("SLURM_JOB_ID") or "TORCHELASTIC_RUN_ID" in env:
        return derive_run_id(world_size)
    return derive_run_id(1)


def agree_run_id(broadcast: Optional[Callable[[Any], Any]] = None) -> Optional[str]:
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
    candidate = _candidate_run_id(dist.get_world_size()) if dist.get_rank() == 0 else None
    if broadcast is not None:
        return broadcast(candidate)
    box = [candidate]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def start_monitor(init_kwargs: dict, broadcast: Optional[Callable[[Any], Any]] = None):
    """Start the agent for a framework run; a no-op monitor (and no collective) when disabled."""
    import ranksight
    from ranksight.agent import NoopMonitor

    if _disabled(init_kwargs):
        return NoopMonitor(None)
    kwargs = dict(init_kwargs)
    if not kwargs.get("run_id"):
        kwargs["run_id"] = agree_run_id(broadcast)
    return ranksight.init(**kwargs)


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
        begin = self._clock()
        try:
            item = next(self._it)
        except StopIteration:
            try:
                self._steps.exhausted(self)
            except Exception:
                pass
            raise
        try:
            self._steps.fetched(self, begin)
        except Exception:
            pass
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

    def __iter__(self) -> TimedIterator:
        return TimedIterator(iter(self._loader), self._steps, self._clock)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def find_ddp_wrapper(model: Any) -> Any:
    """Return the DistributedDataParallel module that wraps ``model``, or ``model`` itself.

    Used once per run by callbacks that are only handed the inner model (the Hugging Face Trainer);
    it walks the garbage collector's referrers, which costs a scan of the heap, not a per-step cost.
    """
    import gc

    torch = sys.modules.get("torch")
    if torch is None or _live_group() is None:
        return model
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    if isinstance(model, ddp_cls):
        return model
    # model <- DDP._modules (a dict) <- DDP.__dict__ (a dict, when materialised) <- DDP
    frontier = [model]
    for _ in range(3):
        dicts = []
        for obj in frontier:
            for holder in gc.get_referrers(obj):
                if isinstance(holder, ddp_cls) and holder.module is model:
                    return holder
                if isinstance(holder, dict):
                    dicts.append(holder)
        frontier = dicts[:64]  # bounded: a module is held by few dicts
    return model
