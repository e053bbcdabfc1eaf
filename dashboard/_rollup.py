"""``Rollup(path)``: the rollup of a run folder for callers that hold a path (``open_run(path).rollup()``).

The rollup itself belongs to the run's reading (``ranksight.collectors.Rollup``, made by ``Run.rollup``); this
name keeps ``ranksight.dashboard.Rollup(path)`` for scripts and measurements that start from a folder.
"""

from __future__ import annotations

from ranksight import collectors


class Rollup(collectors.Rollup):
    """The rollup of the run at ``run_path`` on a reading of its own."""

    def __init__(self, run_path: str, chunk_steps: int | None = None) -> None:
        super().__init__(collectors.open_run(run_path), chunk_steps)
