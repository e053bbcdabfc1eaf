"""Zero-edit attach, used by ``ranksight run``: the agent measures an unmodified script.

``ranksight run`` puts a ``sitecustomize`` module on ``PYTHONPATH`` (Python imports it at start-up,
see the ``site`` module's documentation) that calls :func:`install`. Nothing else happens until the
script imports torch; then, through public torch APIs only:

- ``torch.utils.data.DataLoader.__iter__`` returns an iterator that times each ``next()`` (data wait);
- global optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``_post_hook``)
  time ``optimizer.step()`` and close a step there; a step opens when the next batch arrives;
- after the first optimizer step, a one-off global forward pre-hook finds the outermost module that
  holds the optimizer's parameters (the DDP wrapper, if any), calls ``watch()`` on it and removes
  itself: from then on forward start and per-bucket all-reduce times are measured.

The agent itself starts lazily, at the first loader iteration or optimizer step, so launcher
processes (``torchrun``'s agent) and DataLoader workers that import torch start nothing.
"""

from __future__ import annotations

import importlib.abc
import itertools
import logging
import os
import sys
from typing import Any, Optional

from ._common import ImplicitSteps, TimedIterator

log = logging.getLogger("ranksight")

ATTACH_ENV = "RANKSIGHT_ATTACH"
"""Set to 1 by ``ranksight run``; the bootstrap does nothing without it."""
COMM_HOOK_ENV = "RANKSIGHT_ATTACH_COMM_HOOK"
"""Set to 1 to register the per-bucket DDP communication hook on gloo (``Config.comm_hook``); unset or 0 leaves
DDP's hook alone."""
_FIND_MODEL_STEPS = 3  # optimizer steps to look for the model before giving up on forward marks

#: The ``sitecustomize.py`` that ``ranksight run`` writes into a private folder on ``PYTHONPATH``.
#: It chains to any other ``sitecustomize`` on the path, so a site's own start-up code still runs.
BOOTSTRAP_SOURCE = '''\
"""Written by `ranksight run`: attach the ranksight agent, then run any other sitecustomize on the path."""
import os as _os
import sys as _sys


def _ranksight_bootstrap():
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        from ranksight.integrations._autoattach import install

        install()
    except Exception as exc:  # never stop the user's program
        _sys.stderr.write("ranksight run: agent not attached in this process (%s: %s)\\n" % (type(exc).__name__, exc))
    import importlib.machinery
    import importlib.util

    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_ranksight_bootstrap()
'''


class _ZeroEdit:
    """Process-wide state of the zero-edit attach: the lazily started monitor and its step marks."""

    def __init__(self) -> None:
        self.m: Any = None
        self.steps: Optional[ImplicitSteps] = None
        self.off = False  # disabled, failed, or the script runs its own ranksight.init()
        self._param_ids: Optional[set] = None
        self._find_handle: Any = None
        self._find_steps_left = _FIND_MODEL_STEPS

    def monitor(self) -> Any:
        """The live monitor, started on first use; None when off or closed (e.g. by the script's own init)."""
        m = self.m
        if m is not None:
            return m if m.enabled else None
        if self.off:
            return None
        try:
            import ranksight

            user = ranksight.current()
            if user is not None and user.enabled:  # the script is instrumented already: step aside
                self.off = True
                return None
            m = ranksight.init(comm_hook=os.environ.get(COMM_HOOK_ENV, "0") == "1", framework="run")
        except Exception as exc:
            self.off = True
            log.warning("ranksight run: agent not started (%s: %s)", type(exc).__name__, exc)
            return None
        if not m.enabled:
            self.off = True
            return None
        self.m, self.steps = m, ImplicitSteps(m)
        return m

    # ------------------------------------------------------------ patched torch entry points
    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.monitor() is not None:
                self.steps.optimizer_pre(optimizer, args, kwargs)  # type: ignore[union-attr]
        except Exception as exc:
            self._fail(exc)

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        m = self.m
        if m is None or not m.enabled:
            return
        try:
            steps = self.steps
            steps.optimizer_post(optimizer, args, kwargs)  # type: ignore[union-attr]
            if not steps.loader_driven and not m.in_step:  # type: ignore[union-attr]
                m.step_begin()  # no DataLoader in this loop: a step runs from one optimizer step to the next
            if self._find_steps_left > 0:
                self._look_for_model(optimizer)
        except Exception as exc:
            self._fail(exc)

    def _look_for_model(self, optimizer: Any) -> None:
        """Arm (once) a global forward pre-hook that finds the model of the next step; give up after a few steps."""
        import torch

        self._find_steps_left -= 1
        if self._param_ids is None:
            self._param_ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
            hooks = torch.nn.modules.module
            self._find_handle = hooks.register_module_forward_pre_hook(self._on_any_forward)
        elif self._find_steps_left == 0:
            self._stop_looking()

    def _stop_looking(self) -> None:
        self._find_steps_left = 0
        if self._find_handle is not None:
            self._find_handle.remove()
            self._find_handle = None

    def _on_any_forward(self, module: Any, args: Any) -> None:
        # Runs for every module call while armed (one step at most): the first module called inside a
        # step that holds the optimizer's parameters is the outermost model (pre-hooks run parent first).
        m = self.m
        try:
            if m is None or not m.in_step or not self._param_ids:
                return
            ids = self._param_ids
            if not any(id(p) in ids for p in itertools.islice(module.parameters(), 16)):
                return
            self._stop_looking()
            m.forward_begin()
            m.watch(module)
        except Exception as exc:
            self._stop_looking()
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.m is not None:
            self.m.report_failure("zero_edit_attach", exc)


_STATE = _ZeroEdit()


def _patch_torch(torch: Any) -> None:
    """Install the DataLoader and optimizer patches (idempotent)."""
    from torch.utils.data import DataLoader

    if getattr(DataLoader.__iter__, "_ranksight", False):
        return
    state = _STATE
    original_iter = DataLoader.__iter__

    def __iter__(self):  # noqa: N807 -- replaces DataLoader.__iter__
        it = original_iter(self)
        try:
            m = state.monitor()
            if m is None:
                return it
            return TimedIterator(it, state.steps, m.now_ns)
        except Exception:
            return it

    __iter__._ranksight = True  # type: ignore[attr-defined]
    __iter__.__wrapped__ = original_iter  # type: ignore[attr-defined]
    DataLoader.__iter__ = __iter__
    import torch.optim.optimizer as optim  # a lazily loaded submodule on recent torch

    if hasattr(optim, "register_optimizer_step_pre_hook"):
        optim.register_optimizer_step_pre_hook(state.optimizer_pre)
        optim.register_optimizer_step_post_hook(state.optimizer_post)
    else:
        log.warning("ranksight run: this torch has no global optimizer hooks (needs 2.0+); no step marks")


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Find ``torch`` with the other finders and run the patches right after its module has executed."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _AfterTorchImport) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Put the real loader back first: torch and importlib.resources look at module.__loader__.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            sys.meta_path.remove(self._finder)
        except ValueError:
            pass
        try:
            _patch_torch(module)
        except Exception as exc:
            log.warning("ranksight run: could not attach to torch (%s: %s)", type(exc).__name__, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def install() -> None:
    """Arm the zero-edit attach in this interpreter when ``RANKSIGHT_ATTACH=1`` (no-op otherwise)."""
    if os.environ.get(ATTACH_ENV) != "1":
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        _patch_torch(torch)
        return
    if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())
