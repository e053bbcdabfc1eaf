"""What a ``Run`` knows besides its views: the state its queries read, held by the Run, not by the connection.

Why a module of its own at the bottom of the package: the answers (``_answers``), the digests (``_digest_source``)
and the reader (``_spool_reader``) each keep part of it, and the ``Run`` (``_run``) that holds it imports them
all. A bare DuckDB connection has none: queries on it read the rows.
"""

from __future__ import annotations


class RunState:
    """One opening of a run's views: what each query may take instead of reading every row."""

    __slots__ = ("answers_due", "answers_from", "digests", "make_answers", "recording", "skipped")

    def __init__(self, make_answers=None) -> None:
        self.skipped: tuple = ()
        """The ``SkippedFile`` s the last opening left out of the views."""
        self.answers_from: str | dict[str, str] | None = None
        """Where the answers that hold for these views are (``_answers``): the attached store that keeps them
        (a store written before generations), the answers themselves (``_answer_file``), or None."""
        self.answers_due: str | None = None
        """The generation of a finished store read alone whose answers no one kept yet: the first query
        computes them all (``make_answers``) before it is answered."""
        self.make_answers = make_answers
        """``(reader, generation) -> None``: computes and keeps the answers that are due (``_answers_due``)."""
        self.recording: dict[str, str] | None = None
        """While the answers are computed: query key -> answer JSON, kept as queries run."""
        self.digests = None
        """The step digests noted for these views (``_digest_source._Noted``), or None."""


def state_of(reader) -> RunState | None:
    """The state of a ``Run`` (None for a bare DuckDB connection)."""
    state = getattr(reader, "_run_state", None)
    return state if isinstance(state, RunState) else None
