"""Hugging Face Trainer integration: ``Trainer(..., callbacks=[RanksightCallback()])``.

Through the ``TrainerCallback`` hooks the callback drives the same per-rank agent as ``ranksight.init()``:

- a step is one optimizer step, from ``on_step_begin`` to ``on_step_end`` (with gradient accumulation
  it spans all its micro-batches);
- data wait is the time from the previous step's end (or the epoch's start) to the next step's
  begin: the Trainer fetches all of a step's micro-batches in that gap. Logging, evaluation and
  checkpointing also run there, so the wait restarts at ``on_log`` / ``on_evaluate`` / ``on_save``;
- the optimizer phase runs from ``on_pre_optimizer_step`` to ``on_optimizer_step``;
- the model gets the agent's forward pre-hook and, under DDP, the all-reduce timing hook.

Only this module imports ``transformers``.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "ranksight.integrations.transformers needs transformers: pip install 'ranksight[transformers]'"
    ) from None

from ._common import find_ddp_wrapper, start_monitor

__all__ = ["RanksightCallback"]


class RanksightCallback(TrainerCallback):
    """Record per-rank step telemetry of ``Trainer.train()`` with the ranksight agent.

    Arguments are those of :func:`ranksight.init` (``run_dir``, ``job``, ``run_id``, ...). Pass
    ``trainer=`` (or add the callback with ``trainer.add_callback``, then set ``callback.trainer``) to
    hand over the DDP-wrapped model directly; otherwise it is found once at ``on_train_begin``. With
    ``RANKSIGHT_DISABLED=1`` no agent, thread, file or hook is created and each hook returns at once.
    """

    def __init__(
        self, run_dir: Optional[str] = None, job: Optional[str] = None, *, trainer: Any = None, **init_options: Any
    ) -> None:
        self._init_kwargs = {"run_dir": run_dir, "job": job, **init_options}
        self.trainer = trainer
        self.monitor: Any = None
        """The agent's monitor for the current ``train()`` (a no-op monitor when disabled)."""
        self._m: Any = None  # the live monitor, or None: every hook checks this first
        self._waited_since = 0

    # ------------------------------------------------------------ lifecycle
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._m is not None:
            return
        self.monitor = start_monitor(self._init_kwargs)
        if not self.monitor.enabled:
            return
        m = self._m = self.monitor
        wrapped = getattr(self.trainer, "model_wrapped", None) if self.trainer is not None else None
        if wrapped is None and model is not None:
            wrapped = find_ddp_wrapper(model)
        if wrapped is not None:
            m.watch(wrapped)  # optimizer marks come from the Trainer's own optimizer-step events
        self._waited_since = m.now_ns()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._m is not None:
            self._m.close()
            self._m = None

    # ------------------------------------------------------------ per step (hot path)
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            self._waited_since = m.now_ns()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._m
        if m is not None:
            m.step_begin(self._waited_since)

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
            self._waited_since = m.now_ns()

    def _restart_wait(self, *args: Any, **kwargs: Any) -> None:
        # Logging, evaluation and saving run between steps; they are not data wait.
        m = self._m
        if m is not None:
            self._waited_since = m.now_ns()

    on_log = _restart_wait
    on_evaluate = _restart_wait
    on_save = _restart_wait
