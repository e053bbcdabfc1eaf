"""What a ``Run`` knows besides its views: the state its queries read, held by the Run, not by the connection.

Why a module of its own at the bottom of the package: the digests (``_digest_source``) and the reader
(``_spool_reader``) each keep part of it, and the ``Run`` (``_run``) that holds it imports them all. A bare
DuckDB connection has none: queries on it read the rows.
"""

from __future__ import annotations


class RunState:
    """One opening of a run's views: what each query may take instead of reading every row."""

    __slots__ = ("digests", "incremental", "skipped")

    def __init__(self, incremental: bool = False) -> None:
        self.skipped: tuple = ()
        """The ``SkippedFile`` s the last opening left out of the views."""
        self.digests = None
        """The step digests noted for these views (``_digest_source._Noted``), or None."""
        self.incremental = incremental
        """Whether the reading is refreshed again and again (``open_run(incremental=True)``): what a refresh
        can build on is kept in the process rather than read again (``_median_fold``)."""


def state_of(reader) -> RunState | None:
    """The state of a ``Run`` (None for a bare DuckDB connection)."""
    state = getattr(reader, "_run_state", None)
    return state if isinstance(state, RunState) else None
