"""The monitor returned when ranksight is disabled: same API, no thread, no files, no hooks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class _NullStep:
    __slots__ = ()

    def __enter__(self) -> _NullStep:
        return self

    def __exit__(self, *exc) -> bool:
        return False


_NULL_STEP = _NullStep()


class NoopMonitor:
    """Every call does nothing: ``loader()`` returns the loader itself, ``step()`` an empty context."""

    enabled = False
    steps_recorded = 0
    errors: dict = {}

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def step(self) -> _NullStep:
        return _NULL_STEP

    def step_begin(self, waited_since_ns: int = 0) -> None:
        return None

    def step_end(self) -> None:
        return None

    def loader(self, iterable: Iterable) -> Iterable:
        return iterable

    def data(self) -> _NullStep:
        return _NULL_STEP

    def note_data_source(self, source: str) -> None:
        return None

    def add_sampler(self, sampler: Any) -> None:
        return None

    def report_failure(self, component: str, exc: BaseException) -> None:
        return None

    def warn(self, key: str, message: str) -> None:
        return None

    @property
    def identity(self) -> None:
        """No identity: nothing is recorded."""
        return None

    @property
    def run_path(self) -> None:
        """No run folder: nothing is written."""
        return None

    now_ns = staticmethod(time.perf_counter_ns)
    in_step = False

    def forward_begin(self) -> None:
        return None

    def optimizer_begin(self) -> None:
        return None

    def optimizer_end(self) -> bool:
        return False

    def discard_step(self) -> None:
        return None

    def watch(self, model: Any, optimizer: Any = None) -> NoopMonitor:
        return self

    def close(self) -> None:
        return None
