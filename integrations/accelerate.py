"""Accelerate integration: two lines after ``accelerator.prepare``, none inside the training loop.

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    tracker = ranksight.integrations.accelerate.attach(accelerator, model, optimizer)
    for batch in tracker.loader(loader):          # the prepared loader, timed
        ...                                       # unchanged: accelerator.backward(loss); optimizer.step()

A step opens when a batch arrives from the timed loader and closes when the wrapped optimizer really
steps (its step hooks fire only on synchronising steps under ``accelerator.accumulate``), so a step
is one optimizer step. The prepared model (``DistributedDataParallel`` under multi-process launch)
gets the agent's forward pre-hook and all-reduce timing hook.

Only this module imports ``accelerate``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Optional

try:
    import accelerate  # noqa: F401
except ImportError:
    raise ImportError(
        "ranksight.integrations.accelerate needs accelerate: pip install 'ranksight[accelerate]'"
    ) from None

from ._common import ImplicitSteps, TimedLoader, finish_trackers, follow_trackers, start_monitor, wanted_trackers

__all__ = ["AccelerateTracker", "attach"]


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (whose own step hooks never fire)."""
    inner = optimizer
    for _ in range(3):
        nested = getattr(inner, "optimizer", None)
        if nested is None or nested is inner:
            break
        inner = nested
    return inner


class AccelerateTracker:
    """The agent attached to one Accelerate training run; see :func:`attach`."""

    def __init__(
        self,
        accelerator: Any,
        model: Any,
        optimizer: Any,
        *,
        trackers: Any = "auto",
        tracker_interval_s: float = 10.0,
        **init_kwargs: Any,
    ) -> None:
        self.accelerator = accelerator
        self.monitor = start_monitor(init_kwargs, framework="accelerate")
        """The agent's monitor (a no-op monitor when disabled)."""
        self._steps: Optional[ImplicitSteps] = None
        self._handles: list = []
        self._trackers = wanted_trackers(trackers)
        self._tracker_interval_s = tracker_interval_s
        self.follower: Any = None
        """The ``ranksight.exporters.Follower`` feeding ``accelerator.trackers`` (main process), or None."""
        m = self.monitor
        if not m.enabled:
            return
        self._follow()
        self._steps = ImplicitSteps(m)
        m.watch(model)
        inner = _inner_optimizer(optimizer)
        if hasattr(inner, "register_step_pre_hook"):
            self._handles.append(inner.register_step_pre_hook(self._steps.optimizer_pre))
            self._handles.append(inner.register_step_post_hook(self._steps.optimizer_post))
        else:
            m.warn("optimizer", "optimizer has no step hooks (torch < 2.0?): no step marks from Accelerate")

    def loader(self, loader: Iterable) -> Iterable:
        """Return ``loader`` timed (the loader itself when ranksight is disabled)."""
        if self._steps is None:
            return loader
        self._follow()  # init_trackers() may have come after attach()
        return TimedLoader(loader, self._steps, self.monitor.now_ns)

    def close(self) -> None:
        """Remove the hooks and flush the agent's records; also runs at exit."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.monitor.close()
        finish_trackers(self.follower)
        self.follower = None

    def _follow(self) -> None:
        """Feed the accelerator's trackers (``log_with`` + ``init_trackers``) once they exist, on the main process."""
        if self.follower is None and self._trackers and getattr(self.accelerator, "is_main_process", True):
            if _tracker_sinks(self.accelerator, self._trackers, probe=True):
                self.follower = follow_trackers(
                    self.monitor, lambda: _tracker_sinks(self.accelerator, self._trackers), self._tracker_interval_s
                )


def attach(accelerator: Any, model: Any, optimizer: Any, **init_kwargs: Any) -> AccelerateTracker:
    """Start the agent for an Accelerate run; call on every process after ``accelerator.prepare``.

    ``init_kwargs`` are those of :func:`ranksight.init` (``run_dir``, ``job``, ``run_id``, ...), and
    ``trackers`` (default ``"auto"``): which of ``accelerator.trackers`` (W&B, MLflow, TensorBoard) also get
    ranksight's per-rank scalars and, at ``close()``, its verdict and report; ``None`` for none.
    """
    return AccelerateTracker(accelerator, model, optimizer, **init_kwargs)


def _tracker_sinks(accelerator: Any, wanted: frozenset, probe: bool = False) -> list:
    """A ``ranksight.exporters`` sink per wanted tracker of the accelerator, logging into its run (with
    ``probe``: just whether there is one, importing nothing)."""
    found = [t for t in getattr(accelerator, "trackers", None) or [] if getattr(t, "name", None) in wanted]
    if probe or not found:
        return found
    from ranksight.exporters import MlflowSink, TensorBoardSink, WandbSink

    sinks: list = []
    for t in found:
        if t.name == "wandb":
            sinks.append(WandbSink(t.tracker))
        elif t.name == "mlflow":
            import mlflow

            sinks.append(MlflowSink(t.tracker.info.run_id, tracking_uri=mlflow.get_tracking_uri()))
        else:
            log_dir = getattr(t.tracker, "log_dir", None) or getattr(t, "logging_dir", None)
            sinks.append(TensorBoardSink(os.path.join(str(log_dir), "ranksight")))
    return sinks
