"""Which steps the figures leave out as warm-up: the one rule the digests, the collectors' queries, the
dashboard's rollup and the CLI share.

Why a rule of its own: a rank's first steps (compilation, allocator growth, DDP's bucket rebuild) are not
its steady state, so every figure leaves them out -- but a short or young run must still say something. So:
a step is *warm* when its number is below the warm-up, and a warm step is left out unless its group (a
rank; for figures that compare ranks step by step, the run) has no more steps than the warm-up, in which
case the group keeps them all. The readers meet the rule on three shapes of data -- step rows, digest rows
that carry a ``warm`` flag and a row count ``n``, and Python counts -- and each shape builds it from the
pieces below, so a change here changes every figure alike.

The SQL pieces take the warm-up as a text: a ``?`` placeholder (the default), ``$warm``, or a literal.
"""

from __future__ import annotations

WARMUP_STEPS = 5
"""Leading steps per rank left out by default; the digests fold their ``warm`` flag at this value."""

WARM_SQL = "step < $warm"
"""A step row's warm flag as the digests fold it (``$warm`` bound to ``WARMUP_STEPS``). Its text is part of
the digests' definition (``digest.digest_key``): changing it retires every digest written before."""


def warm_sql(warmup: str = "?", step: str = "step") -> str:
    """The SQL test that a step row is warm."""
    return f"{step} < {warmup}"


def short_sql(rows: str, warmup: str = "?") -> str:
    """The SQL test that a group with ``rows`` steps is short: it keeps its warm steps."""
    return f"{rows} <= {warmup}"


def kept_sql(warm: str, short: str) -> str:
    """The SQL test that keeps a row: not warm, or of a short group (``warm`` and ``short`` from the above,
    or a digest row's ``warm`` column)."""
    return f"(NOT ({warm}) OR {short})"


def is_short(rows: int, warmup_steps: int = WARMUP_STEPS) -> bool:
    """Whether a group with ``rows`` steps keeps its warm steps (``short_sql`` in Python)."""
    return rows <= warmup_steps
