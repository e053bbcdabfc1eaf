"""Computing a finished store's answers where they are first needed: by its first reader, not by ``ingest``.

Why here: ``ingest`` copies rows at DuckDB's own pace, and the answers (the verdict's queries over every row,
a quarter of ``ingest``'s time when it computed them) are computed once, by the first ``Run`` whose first
query finds them due, and kept for every later reader (``_answer_file``). Until then nothing is answered
from the digests' approximate medians, so every reader of the store gets the same exact answers.
"""

from __future__ import annotations

from ranksight.format.warmup import WARMUP_STEPS

from ._answer_file import save_answers
from ._answers import answer_from, recording
from ._features import compute_context, compute_features
from ._queries import step_breakdown


def make_answers(run, generation: str) -> None:
    """Run the queries ``diagnose`` runs over the whole of ``run``'s store, keep their answers for its
    ``generation``, and let ``run`` read them. A query that fails leaves none: ``run`` reads the rows."""
    import duckdb

    try:
        with recording(run) as kept:
            verdict_queries(run)
    except duckdb.Error:
        return
    save_answers(run.path, generation, kept)
    answer_from(run, kept)


def verdict_queries(run) -> None:
    """The same calls as ``diagnose``'s judgement (breakdown, features, context), so the same SQL text and
    parameters: every key a reader of the store will ask for with the default warm-up."""
    breakdown = step_breakdown(run, WARMUP_STEPS)
    features = compute_features(run, run.ranks, WARMUP_STEPS, breakdown)
    compute_context(run, run.ranks, features, WARMUP_STEPS)
