"""PyTorch Lightning integration: ``Trainer(callbacks=[RanksightCallback()])``.

The callback drives the same per-rank agent as ``ranksight.init()``, from Lightning's own hooks, so the
phases do not depend on how the user's ``training_step`` calls the model (``self(x)``, ``self.net(x)``,
manual optimization):

- a step is one optimizer step: it opens when the strategy moves the first batch to the device (else at
  ``on_train_batch_start``) and closes at the ``on_train_batch_end`` of the batch whose optimizer
  stepped; with ``accumulate_grad_batches=N`` it spans N batches;
- data wait is the time spent inside the training DataLoader's ``__next__`` (Lightning's fetcher calls it
  there), before the step or, with accumulation, between its micro-batches; Lightning's own work between
  batches (logging, callbacks) is not data wait;
- moving the batch to the device runs from the step's start to ``on_train_batch_start`` (on a GPU rank
  that is ``h2d_s``, read from CUDA events);
- compute runs from ``on_train_batch_start`` (the training step starts) to the last DDP bucket ready or,
  without DDP, to the optimizer's start; the other collectives and the in-step fetches come out of it;
- the optimizer phase runs from the step's first ``on_before_optimizer_step`` (after Lightning's closure
  has run forward and backward) to the optimizer's own step post-hook;
- the strategy's model (``DistributedDataParallel`` under ``strategy="ddp"``) gets the agent's all-reduce
  timing hook, and graph breaks of a compiled module are polled as usual.

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
        self._accumulates = False  # automatic optimization over several batches: a step spans them
        self._stepped = False  # an optimizer stepped in the open step
        self._opt_open = False  # the open step's optimizer phase has begun

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
        self._accumulates = bool(pl_module.automatic_optimization) and int(trainer.accumulate_grad_batches or 1) > 1
        self._wrap_batch_transfer(trainer)
        self._fetch = LoaderFetchTimer(m)
        if self._fetch.install():
            self._fetch.armed = True
        loader = trainer.train_dataloader
        if isinstance(loader, (list, tuple)):
            loader = loader[0] if loader else None
        elif isinstance(loader, dict):
            loader = next(iter(loader.values()), None)
        if loader is not None:
            m.note_loader(loader)

    def _wrap_batch_transfer(self, trainer: Any) -> None:
        """Open the step where the strategy moves a training batch to the device, so the copy is the step's
        (``h2d_s`` on a GPU rank). An instance attribute over the strategy's method, removed at teardown."""
        strategy = trainer.strategy
        original = getattr(strategy, "batch_to_device", None)
        if original is None:
            return

        def batch_to_device(batch: Any, *args: Any, **kwargs: Any) -> Any:
            m = self._m
            if m is not None and not m.in_step and trainer.training:
                m.step_begin()
                self._stepped = self._opt_open = False
            return original(batch, *args, **kwargs)

        strategy.batch_to_device = batch_to_device
        self._handles.append(_Restore(strategy, "batch_to_device"))

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
            if not m.in_step:
                m.step_begin()
                self._stepped = self._opt_open = False
            m.forward_begin()  # the training step starts here, whatever it calls (first micro-batch only)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        m = self._m
        if m is not None and not self._opt_open:  # the step's first optimizer (manual: several may step)
            self._opt_open = True
            m.optimizer_begin()

    def _optimizer_done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.optimizer_end()
            self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        m = self._m
        # With gradient accumulation a batch that did not step the optimizer leaves the step open; so does
        # nothing else (manual optimization, a step the AMP scaler skipped): one batch, one step.
        if m is not None and (self._stepped or not self._accumulates):
            m.step_end()
            self._stepped = self._opt_open = False

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._arm(False)  # validation batches are not the training loop's data wait

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._arm(True)


class _Restore:
    """Undo an instance attribute set over a method (a hook handle's ``remove``)."""

    def __init__(self, obj: Any, name: str) -> None:
        self._obj, self._name = obj, name

    def remove(self) -> None:
        self._obj.__dict__.pop(self._name, None)


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
