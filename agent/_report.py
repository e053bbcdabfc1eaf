"""How the agent reports its own trouble: count it, warn once, keep it as an event, never raise.

Every part of the agent (hooks, samplers, sinks, the agent thread) reports through one ``Reporter``,
so the counters a user sees (``ranksight_agent_errors_total``, the rank file's ``counters``) and the
``events`` records always agree.
"""

from __future__ import annotations

import logging
from typing import Callable

from ._events import EV_INFO

log = logging.getLogger("ranksight")


class Reporter:
    """Counts errors per component, logs each component's first one, and records it as an event."""

    def __init__(self, append: Callable[[tuple], None], on_step_failure: Callable[[], None]) -> None:
        self._append = append
        self._on_step_failure = on_step_failure
        self.errors: dict[str, int] = {}
        self._reported: set[str] = set()

    def fail(self, component: str, exc: BaseException) -> None:
        """A part of the agent failed: count it, report it once; the caller switches that part off."""
        self._count(component, exc, "failed and is switched off")
        if component == "step":
            self._on_step_failure()

    def count(self, component: str, exc: BaseException) -> None:
        """A part failed once but keeps running (e.g. one lost completion mark): count, report once."""
        self._count(component, exc, "failed once; measuring goes on")

    def _count(self, component: str, exc: BaseException, outcome: str) -> None:
        self.errors[component] = self.errors.get(component, 0) + 1
        if component not in self._reported:
            self._reported.add(component)
            log.warning("ranksight: %s %s (%s: %s)", component, outcome, type(exc).__name__, exc)
            self._record("error", component, f"{type(exc).__name__}: {exc}")

    def warn_once(self, key: str, message: str) -> None:
        """A degradation the user should know about, logged once and kept as an event record."""
        if key in self._reported:
            return
        self._reported.add(key)
        log.warning("ranksight: %s", message)
        self._record("warning", key, message)

    def info(self, component: str, message: str) -> None:
        """A fact worth keeping in the run's events (what the agent attached to, for instance)."""
        self._record("info", component, message)

    @property
    def reported(self) -> frozenset:
        """Components and warning keys reported so far (each is logged once)."""
        return frozenset(self._reported)

    @property
    def errors_total(self) -> int:
        return sum(list(self.errors.values()))

    def _record(self, level: str, component: str, message: str) -> None:
        try:
            self._append((EV_INFO, level, (component, message)))
        except Exception as exc:  # the deque append cannot fail short of memory; logging is all we have left
            log.warning("ranksight: cannot record an agent event (%s)", exc)
