"""Which steps record their CUDA events, and how many steps apart: pure functions, no torch.

Why sample: each CUDA event costs the training thread a driver call (about 5 µs on an H200
host) and the agent thread two more to read it, six or more per step; on a 3 ms step that
is over 1 %. A phase share is a ratio of sums over steps, so a share read from one step in N is an unbiased
estimate of the every-step share as long as the sampled steps do not lock onto a pattern of the loop (an
eval or a logging ``.item()`` every 10 or 100 steps).

The schedule: step ``s`` is sampled at rate ``1/N`` when the 32-bit Fibonacci hash of ``s`` falls below
``2**32 // N``. Consecutive hashes are spread evenly over the range (the golden-ratio sequence), so
sampled steps come about N apart but never in a strict stride that a periodic step could align with. It is
a function of the step index alone, so every rank samples the same steps (readers compare ranks step by
step), and the sets are nested: a rank that settled on a larger N samples a subset of a rank with a smaller
one, so any two ranks share the sparser rank's steps.
"""

from __future__ import annotations

import math

_GOLDEN = 0x9E3779B1  # 2**32 / golden ratio, odd
_MASK = 0xFFFFFFFF
MAX_EVERY = 64
"""Sparsest automatic sampling: one step in 64 still gives a 10,000-step job about 150 sampled steps."""


def threshold(every: int) -> int:
    """The hash bound of sampling one step in ``every`` (``every`` <= 1: every step)."""
    return (_MASK + 1) // max(1, int(every))


def is_sampled(step: int, bound: int) -> bool:
    """Whether ``step`` records its events under the hash bound ``bound`` (``threshold``)."""
    return ((step * _GOLDEN) & _MASK) < bound


def choose_every(step_s: float, cost_per_sampled_s: float, budget: float) -> int:
    """How many steps apart to sample so events cost at most ``budget`` of a step: the cost of one sampled
    step's events over what the budget allows per step, at least 1, at most ``MAX_EVERY``."""
    if not step_s > 0 or not cost_per_sampled_s > 0:
        return 1
    return max(1, min(MAX_EVERY, math.ceil(cost_per_sampled_s / (budget * step_s))))
