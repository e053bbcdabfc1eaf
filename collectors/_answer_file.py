"""Where a finished run's answers are kept: a file beside its store, named by the store's generation.

Why not in the store: ``ingest`` would compute them inside its own transaction (1.5-2.1 s of its 6.6-8 s at
1,024 ranks x 10,000 steps), and no reader can add them to the store afterwards (a DuckDB file open for
writing locks every other reader out; the store is only ever replaced by rename). So ``ingest`` stamps a
store whose rows it changed with a new generation (``_store_meta``), and the answers of that store live in
``<run>/.answers-<generation>.json``, written by whoever computes them first (``_answers_due``): a temporary
file renamed into place, so a crash leaves no half file, and a file of another generation is never read.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets

from ranksight.format.schema import TMP_PREFIX

GENERATION_KEY = "generation"
"""``_store_meta`` key: a new random name each time ``ingest`` changes the store's rows."""
_PREFIX = ".answers-"
_SUFFIX = ".json"


def new_generation() -> str:
    """A name for a store's rows that no earlier store of the run had."""
    return secrets.token_hex(8)


def generation_of(con, catalog: str) -> str | None:
    """The generation of the store attached as ``catalog``; None for a store written before generations."""
    import duckdb

    try:
        found = con.execute(f"SELECT value FROM {catalog}._store_meta WHERE key = ?", [GENERATION_KEY]).fetchone()
    except duckdb.Error:
        return None
    return None if found is None else str(found[0])


def answers_path(run_path: str, generation: str) -> str:
    return os.path.join(run_path, f"{_PREFIX}{generation}{_SUFFIX}")


def load_answers(run_path: str, generation: str) -> dict[str, str] | None:
    """{query key: answer JSON} kept for this generation of the store, or None (none kept, or unreadable)."""
    try:
        with open(answers_path(run_path, generation), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def save_answers(run_path: str, generation: str, answers: dict[str, str]) -> bool:
    """Keep ``answers`` for this generation (False where the run folder cannot be written: the next reader
    computes them again, with the same result)."""
    target = answers_path(run_path, generation)
    tmp = os.path.join(run_path, f"{TMP_PREFIX}answers-{generation}.{os.getpid()}{_SUFFIX}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(answers, f)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return False
    return True


def remove_other_answers(run_path: str, keep: str | None) -> None:
    """Delete the answers files of every generation but ``keep`` (``ingest``, under its lock)."""
    try:
        names = os.listdir(run_path)
    except OSError:
        return
    kept = os.path.basename(answers_path(run_path, keep)) if keep is not None else None
    for name in names:
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX) and name != kept:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(run_path, name))
