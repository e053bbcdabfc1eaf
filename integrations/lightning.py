"""PyTorch Lightning integration: ``Trainer(callbacks=[RanksightCallback()])``.

The callback drives the same per-rank agent as ``ranksight.init()``, through Lightning's public hooks:

- a step runs from ``on_train_batch_start`` to ``on_train_batch_end``;
- data wait is the time spent inside the training DataLoader's ``__next__`` between two training
  batches (Lightning's fetcher calls it there), not the whole gap: Lightning's own work between
  batches (logging, moving the batch, callbacks) is not data wait;
- the optimizer phase runs from ``on_before_optimizer_step`` (after Lightning's closure has run
  forward and backward) to the optimizer's own step post-hook;
- the strategy's model (``DistributedDataParallel`` under ``strategy="ddp"``) gets the agent's forward
  pre-hook and all-reduce timing hook, and graph breaks of a compiled module are polled as usual.

Only this module imports Lightning (``lightning`` or, failing that, ``pytorch_lightning``).
"""

from __future__ import annotations

import os
from typing import Any, Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package name
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError:
        raise ImportError(
            "ranksight.integrations.lightning needs Lightning: pip install 'ranksight[lightning]'"
        ) from None

from ._common import LoaderFetchTimer, finish_trackers, follow_trackers, start_monitor, wanted_trackers

__all__ = ["RanksightCallback"]


class RanksightCallback(Callback):
    """Record per-rank step telemetry of ``trainer.fit`` with the ranksight agent.

    Arguments are those of :func:`ranksight.init` (``run_dir``, ``job``, ``run_id``, ...). The agent
    starts in ``setup`` once Lightning has set up the process group, so every rank agrees on one run
    id; with ``RANKSIGHT_DISABLED=1`` no agent, thread, file or hook is created and each hook returns
    at once.

    ``trackers`` (default ``"auto"``): the trainer's loggers (``WandbLogger``, ``MLFlowLogger``,
    ``TensorBoardLogger``) that also get ranksight's per-rank scalars while the fit runs and its verdict
    and report at its end, from a thread on global rank 0 that reads the run folder; a name or names to
    pick some, ``None`` for none. ``tracker_interval_s``: seconds between two samples.
    """

    def __init__(
        self,
        run_dir: Optional[str] = None,
        job: Optional[str] = None,
        *,
        trackers: Any = "auto",
        tracker_interval_s: float = 10.0,
        **init_options: Any,
    ) -> None:
        super().__init__()
        self._init_kwargs = {"run_dir": run_dir, "job": job, **init_options}
        self._trackers = wanted_trackers(trackers)
        self._tracker_interval_s = tracker_interval_s
        self.follower: Any = None
        """The ``ranksight.exporters.Follower`` feeding the trainer's loggers (global rank 0), or None."""
        self.monitor: Any = None
        """The agent's monitor for the current fit (a no-op monitor when disabled), set in ``setup``."""
        self._m: Any = None  # the live monitor, or None: every hook checks this first
        self._fetch: Optional[LoaderFetchTimer] = None
        self._handles: list = []

    # ------------------------------------------------------------ lifecycle
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._m is not None:
            return
        self.monitor = start_monitor(
            self._init_kwargs, broadcast=lambda obj: trainer.strategy.broadcast(obj, src=0), framework="lightning"
        )
        self._m = self.monitor if self.monitor.enabled else None
        if self._m is not None and self._trackers and trainer.is_global_zero:
            self.follower = follow_trackers(
                self._m, lambda: _logger_sinks(trainer, self._trackers), self._tracker_interval_s
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        m = self._m
        if m is None:
            return
        # No optimizer passed to watch(): Lightning runs forward and backward inside optimizer.step(closure),
        # so the optimizer's pre-hook would open the phase too early; on_before_optimizer_step marks it.
        model = trainer.strategy.model
        m.watch(model if model is not None else pl_module)
        for opt in trainer.optimizers:
            if hasattr(opt, "register_step_post_hook"):
                self._handles.append(opt.register_step_post_hook(self._optimizer_done))
        self._fetch = LoaderFetchTimer(m)
        if self._fetch.install():
            self._fetch.armed = True

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._m is None:
            return
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._fetch is not None:
            self._fetch.remove()
        self._m.close()
        self._m = None
        finish_trackers(self.follower)
        self.follower = None

    # ------------------------------------------------------------ per batch (hot path)
    def _arm(self, armed: bool) -> None:
        if self._fetch is not None:
            self._fetch.armed = armed

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._arm(True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        m = self._m
        if m is not None:
            m.step_begin()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        m = self._m
        if m is not None:
            m.optimizer_begin()

    def _optimizer_done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.optimizer_end()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        m = self._m
        if m is not None:
            m.step_end()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._arm(False)  # validation batches are not the training loop's data wait

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._arm(True)


def _logger_sinks(trainer: Any, wanted: frozenset) -> list:
    """A ``ranksight.exporters`` sink for each of the trainer's loggers that is a wanted tracker, logging
    into that logger's own run (TensorBoard: a ``ranksight`` folder in its log dir, a run of its own there)."""
    from ranksight.exporters import MlflowSink, TensorBoardSink, WandbSink

    sinks: list = []
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__
        if kind == "WandbLogger" and "wandb" in wanted:
            sinks.append(WandbSink(logger.experiment))
        elif kind == "MLFlowLogger" and "mlflow" in wanted:
            sinks.append(MlflowSink(logger.run_id, client=logger.experiment))
        elif kind == "TensorBoardLogger" and "tensorboard" in wanted:
            sinks.append(TensorBoardSink(os.path.join(logger.log_dir, "ranksight")))
    return sinks
