"""Ground truth the corpus keeps beside the agent (not part of a user's script).

Each workload calls ``truth.step_end()`` after every optimizer step and wraps the code its planted
fault adds in ``with truth.fault():``. When ``CORPUS_TRUTH_DIR`` is set, every rank writes
``<dir>/truth-rank<r>.json`` at exit: the step-end times and the seconds each step spent in the
planted code, so the benchmark can say how large the fault really was (e.g. 34 % of the step),
independently of ranksight. It also records whether the run had the fix applied (``--fix``) and how many
samples a step trains on, so a fix that changes the batch (launch-bound's) is compared per sample.
Without the variable every call is a no-op.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from contextlib import contextmanager


class Truth:
    def __init__(self, rank: int, fault: str, fixed: bool = False) -> None:
        self.dir = os.environ.get("CORPUS_TRUTH_DIR", "")
        self.rank, self.fault_name, self.fixed = rank, fault, fixed
        self.samples_per_step = None  # rows (sequences, samples) one optimizer step trains on, this rank
        self.step_ends: list = []
        self.fault_s: list = []
        self.facts: dict = {}  # what the workload saw of its fault beside the time (e.g. allocator retries)
        self._pending = 0.0
        self._written = False
        if self.dir:
            atexit.register(self.write)

    @contextmanager
    def fault(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._pending += time.perf_counter() - t0

    def add_fault(self, seconds: float) -> None:
        self._pending += seconds

    def step_end(self) -> None:
        self.step_ends.append(time.perf_counter())
        self.fault_s.append(self._pending)
        self._pending = 0.0

    def write(self) -> None:
        if not self.dir or self._written:
            return
        self._written = True
        os.makedirs(self.dir, exist_ok=True)
        record = {"rank": self.rank, "fault": self.fault_name, "fixed": self.fixed, "facts": self.facts,
                  "samples_per_step": self.samples_per_step, "step_ends": self.step_ends,
                  "fault_s": self.fault_s}  # fmt: skip
        with open(os.path.join(self.dir, f"truth-rank{self.rank}.json"), "w") as f:
            json.dump(record, f)
