"""Hugging Face Trainer integration: ``Trainer(..., callbacks=[RanksightCallback()])``.

Through the ``TrainerCallback`` hooks the callback drives the same per-rank agent as ``ranksight.init()``:

- a step is one optimizer step, from ``on_step_begin`` to ``on_step_end`` (with gradient accumulation
  it spans all its micro-batches);
- data wait is the time spent inside the DataLoader's ``__next__`` between two steps while the model
  is in training mode (the Trainer fetches a step's micro-batches there): the Trainer's own work in
  that gap (logging, checkpointing) and evaluation batches are not data wait;
- the optimizer phase runs from ``on_pre_optimizer_step`` to ``on_optimizer_step``;
- the model gets the agent's forward pre-hook and, under DDP, the all-reduce timing hook.

Only this module imports ``transformers``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "ranksight.integrations.transformers needs transformers: pip install 'ranksight[transformers]'"
    ) from None

from ._common import (
    LoaderFetchTimer,
    find_ddp_wrapper,
    finish_trackers,
    follow_trackers,
    start_monitor,
    wanted_trackers,
)

__all__ = ["RanksightCallback"]


class RanksightCallback(TrainerCallback):
    """Record per-rank step telemetry of ``Trainer.train()`` with the ranksight agent.

    Arguments are those of :func:`ranksight.init` (``run_dir``, ``job``, ``run_id``, ...). Pass
    ``trainer=`` (or add the callback with ``trainer.add_callback``, then set ``callback.trainer``) to
    hand over the DDP-wrapped model directly; otherwise it is found once at ``on_train_begin``. With
    ``RANKSIGHT_DISABLED=1`` no agent, thread, file or hook is created and each hook returns at once.

    ``trackers`` (default ``"auto"``): of the trackers in ``TrainingArguments.report_to``, those that also get
    ranksight's per-rank scalars while training runs and its verdict and report at the end, in the runs
    the Trainer's own callbacks started (``wandb.run``, ``mlflow.active_run()``, the TensorBoard callback's
    log dir), from a thread on the main process that reads the run folder; ``None`` for none.
    """

    def __init__(
        self,
        run_dir: Optional[str] = None,
        job: Optional[str] = None,
        *,
        trainer: Any = None,
        trackers: Any = "auto",
        tracker_interval_s: float = 10.0,
        **init_options: Any,
    ) -> None:
        self._init_kwargs = {"run_dir": run_dir, "job": job, **init_options}
        self.trainer = trainer
        self._trackers = wanted_trackers(trackers)
        self._tracker_interval_s = tracker_interval_s
        self.follower: Any = None
        """The ``ranksight.exporters.Follower`` feeding the ``report_to`` trackers (main process), or None."""
        self.monitor: Any = None
        """The agent's monitor for the current ``train()`` (a no-op monitor when disabled)."""
        self._m: Any = None  # the live monitor, or None: every hook checks this first
        self._fetch: Optional[LoaderFetchTimer] = None

    # ------------------------------------------------------------ lifecycle
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._m is not None:
            return
        self.monitor = start_monitor(self._init_kwargs, framework="transformers")
        if not self.monitor.enabled:
            return
        m = self._m = self.monitor
        wrapped = getattr(self.trainer, "model_wrapped", None) if self.trainer is not None else None
        if wrapped is None and model is not None:
            wrapped = find_ddp_wrapper(model)
        if wrapped is not None:
            m.watch(wrapped)  # optimizer marks come from the Trainer's own optimizer-step events
        inner = model if model is not None else wrapped
        training = (lambda: inner.training) if inner is not None and hasattr(inner, "training") else None
        self._fetch = LoaderFetchTimer(m, training)
        self._fetch.armed = self._fetch.install()
        if self._trackers and getattr(state, "is_world_process_zero", True):
            # The report_to callbacks come before the user's, so their runs exist by now.
            wanted = self._trackers & set(getattr(args, "report_to", None) or ())
            self.follower = follow_trackers(m, lambda: _report_to_sinks(self.trainer, wanted), self._tracker_interval_s)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._m is not None:
            if self._fetch is not None:
                self._fetch.remove()
            self._m.close()
            self._m = None
            finish_trackers(self.follower)
            self.follower = None

    # ------------------------------------------------------------ per step (hot path)
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.step_begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.optimizer_begin()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.optimizer_end()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.step_end()


def _report_to_sinks(trainer: Any, wanted: set) -> list:
    """A ``ranksight.exporters`` sink for each wanted ``report_to`` tracker whose run the Trainer's callback started."""
    from ranksight.exporters import MlflowSink, TensorBoardSink, WandbSink

    sinks: list = []
    wandb = sys.modules.get("wandb")
    if "wandb" in wanted and wandb is not None and getattr(wandb, "run", None) is not None:
        sinks.append(WandbSink(wandb.run))
    mlflow = sys.modules.get("mlflow")
    if "mlflow" in wanted and mlflow is not None and mlflow.active_run() is not None:
        sinks.append(MlflowSink(mlflow.active_run().info.run_id, tracking_uri=mlflow.get_tracking_uri()))
    if "tensorboard" in wanted:
        handler = getattr(trainer, "callback_handler", None)
        for cb in getattr(handler, "callbacks", None) or []:
            writer = getattr(cb, "tb_writer", None)
            log_dir = getattr(writer, "log_dir", None) or getattr(writer, "logdir", None)
            if log_dir:
                sinks.append(TensorBoardSink(os.path.join(log_dir, "ranksight")))
                break
    return sinks
