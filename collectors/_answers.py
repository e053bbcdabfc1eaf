"""Answers to the verdict's queries over a finished run's store, computed once and read back by its readers.

Why: the verdict's feature queries read every step row -- several seconds at 1,024 ranks x 10,000 steps
on 2 cores, against a 1 s target -- and a finished run's store does not change between readers. So the
first reader whose views are that store alone (``open_run``: no pending segment, no node store, no rank
still writing) runs those queries over the store's rows and keeps each result (``_answers_due``), keyed by
the query's SQL text and parameters, in a file named by the store's generation (``_answer_file``); the
readers after it take a result from there instead of running the query: the same query over the same
rows, so the same answer. ``ingest`` only copies rows (``ranksight ingest`` then asks for the answers, as a
reader). A query that differs in anything -- new code, another warm-up, a recent window, other ranks --
finds no key and runs as before, as does every query on a live spool. Stores written before generations
keep their answers in their own ``_answers`` table, read the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math

from ._run_state import state_of
from ._tables import fetch_rows

ANSWERS_TABLE = "_answers"
"""Store table: ``key`` (a hash of a query's SQL and parameters) -> ``answer`` (its column names and rows, JSON)."""


def query(con, sql: str, params: list | tuple = ()) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of ``sql``: from the store's answers when ``open_run`` found them valid for
    ``con``'s views (``con`` a ``Run``), else from DuckDB (and kept, while ``recording``)."""
    key = _key(sql, params)
    state = state_of(con)
    if state is not None and state.answers_due is not None and state.recording is None:
        due, state.answers_due = state.answers_due, None
        state.make_answers(con, due)
    kept_at = state.answers_from if state is not None else None
    if kept_at is not None:
        found = _kept_answer(con, kept_at, key)
        if found is not None:
            names, rows = json.loads(found)
            return names, [tuple(r) for r in rows]
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    rows = fetch_rows(cur)
    kept = state.recording if state is not None else None
    if kept is not None:
        text = _encode(names, rows)
        if text is not None:
            kept[key] = text
    return names, rows


def _kept_answer(con, kept_at: str | dict[str, str], key: str) -> str | None:
    if isinstance(kept_at, dict):
        return kept_at.get(key)
    found = con.execute(f"SELECT answer FROM {kept_at}.{ANSWERS_TABLE} WHERE key = ?", [key]).fetchone()
    return None if found is None else found[0]


def answering(con) -> bool:
    """Whether the verdict's queries on ``con`` are answered exactly, from kept answers (``open_run`` found
    them valid, or they are due and the next query computes them) or from the rows while they are computed:
    the digests' approximate medians then stay out of it."""
    state = state_of(con)
    return state is not None and (
        state.answers_from is not None or state.answers_due is not None or state.recording is not None
    )


def answer_from(con, kept_at: str | dict[str, str] | None, due: str | None = None) -> None:
    """Let ``query`` on the ``Run`` ``con`` take answers from ``kept_at`` (the store attached under that name,
    or the answers themselves; None: never), or compute the answers of generation ``due`` at its first query."""
    state = state_of(con)
    if state is not None:
        state.answers_from = kept_at
        state.answers_due = due if state.make_answers is not None else None


@contextlib.contextmanager
def recording(con):
    """Within the block, ``query`` on the ``Run`` ``con`` runs every query and keeps its answer in the yielded
    dict."""
    state = state_of(con)
    if state is None:
        raise TypeError("recording answers needs a Run (ranksight.collectors.open_run), not a bare connection")
    kept: dict[str, str] = {}
    state.recording = kept
    try:
        yield kept
    finally:
        state.recording = None


def _key(sql: str, params) -> str:
    return hashlib.sha256(json.dumps([sql, list(params)], default=str).encode()).hexdigest()


def _encode(names: list[str], rows: list[tuple]) -> str | None:
    """JSON that reads back as the same values (floats print exactly); None for a value it cannot hold
    (not a number, string, bool or list of them), so that query is simply not kept."""
    for row in rows:
        for value in row:
            if not _plain(value):
                return None
    return json.dumps([names, rows])


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return not math.isnan(value)  # NaN reads back, but never compares equal: keep it out
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return False
