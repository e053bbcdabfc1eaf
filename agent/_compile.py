"""Graph breaks and recompiles from torch.compile, polled from dynamo's own counters on the agent thread.

Dynamo keys ``counters["graph_break"]`` by reason; some breaks (data-dependent branches, for one)
land in ``counters["unimplemented"]`` instead, so both are read. Recompiles come from dynamo's
compilation metrics, whose entries carry a ``recompile_reason``. Nothing here imports dynamo: if the
user never compiles, there is nothing to poll.
"""

from __future__ import annotations

import sys

_BREAK_COUNTERS = ("graph_break", "unimplemented")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text and text.strip() else ""
    return line[:300]


class CompilePoller:
    """Report new graph breaks and recompiles since the previous poll as compile rows."""

    def __init__(self) -> None:
        self._break_seen: dict[tuple[str, str], int] = {}
        self._metrics_seen: set[int] = set()
        self.graph_breaks_total = 0
        self.recompiles_total = 0

    def poll(self) -> list[dict]:
        """Return compile rows (kind, reason, detail, count) for what is new; [] when dynamo is unused."""
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return []
        rows: list[dict] = []
        counters = getattr(utils, "counters", {})
        for name in _BREAK_COUNTERS:
            try:
                snapshot = dict(counters.get(name, {}))
            except RuntimeError:  # mutated while copying on the training thread: next poll
                continue
            for reason, total in snapshot.items():
                key = (name, str(reason))
                new = int(total) - self._break_seen.get(key, 0)
                if new > 0:
                    self._break_seen[key] = int(total)
                    self.graph_breaks_total += new
                    rows.append(
                        {"kind": "graph_break", "reason": _first_line(str(reason)), "detail": str(reason), "count": new}
                    )
        get_metrics = getattr(utils, "get_compilation_metrics", None)
        if get_metrics is not None:
            try:
                metrics = list(get_metrics())
            except RuntimeError:
                return rows
            current = {id(m) for m in metrics}
            for metric in metrics:
                if id(metric) in self._metrics_seen:
                    continue
                reason = getattr(metric, "recompile_reason", None)
                if reason:
                    self.recompiles_total += 1
                    rows.append({"kind": "recompile", "reason": _first_line(reason), "detail": reason, "count": 1})
            # Entries stay referenced by dynamo while listed, so their ids are unique among them.
            self._metrics_seen = current
        return rows
