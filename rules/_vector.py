"""Rule expressions over all ranks at once: features as columns (one numpy array per feature, ranks as rows).

The per-rank evaluator (``_expr.evaluate`` over one rank's dict) stays the specification. This module
finds, per rule, the ranks on which it can fire -- its ``when`` true and, for a rule with levels, its value
known and past its lowest level after the noise -- with one pass of numpy operations per expression node
instead of one walk of the expression per rank. ``_evaluate`` then computes those ranks' figures (value,
severity, cost, confidence) over the same columns to choose the worst rank, and runs the per-rank code on
that rank alone for what the finding reports; at 10,000 ranks most checks are false and most read only
job-level features.

A feature that holds one value on every rank (a job-level figure, or absent everywhere) is kept as a
one-element array, so an expression over job-level names is evaluated once and broadcast, and an ``and``
whose job-level part is false stops before its per-rank parts.

What each element keeps beside its value is how its evaluation ended, as the per-rank evaluator would
have: OK, UNKNOWN (an absent feature, a division by zero: ``coalesce`` tries its next argument) or ERROR
(``floor``/``round``/``ceil`` of a NaN or an infinity, ``min``/``max`` of one argument: the whole
expression is unknown, ``coalesce`` does not catch it). Where the columns cannot reproduce Python's
arithmetic exactly -- a feature that is not a number (a string), an integer beyond 2**53 (Python's
integers are exact, float64 is not) -- ``NotVectorised`` is raised, and the caller evaluates that rule
rank by rank: correctness never depends on what this module covers.
"""

from __future__ import annotations

import ast
import operator

import numpy as np

from ._expr import _BINOPS, _CMPOPS, _CONSTS, Expr

OK, UNKNOWN, ERROR = 0, 1, 2
_EXACT_INT = 2**53  # float64 holds every integer up to here exactly
_NUMBER_TYPES = frozenset({int, float, bool, type(None)})
_NP_CMP = {
    operator.lt: np.less,
    operator.le: np.less_equal,
    operator.gt: np.greater,
    operator.ge: np.greater_equal,
    operator.eq: np.equal,
    operator.ne: np.not_equal,
}


class NotVectorised(Exception):
    """This expression cannot be evaluated over columns with the per-rank evaluator's exact results."""


class _V:
    """A value over ranks: ``val`` (float64, one element or one per rank), ``st`` (int8 status alike, or
    None when OK everywhere), ``ints`` (may hold Python ints: exactness is checked) and ``bools`` (may hold
    Python bools, which ``_known`` does not count as numbers)."""

    __slots__ = ("val", "st", "ints", "bools")

    def __init__(self, val, st=None, ints=False, bools=False):
        self.val, self.st, self.ints, self.bools = val, st, ints, bools


class Frame:
    """Per-rank features (rank -> dict, as ``compute_features`` makes them) and their columns.

    Columns are built the first time an expression names them, and kept: the rules and the checklist
    read the same frame. ``fallbacks`` lists what was evaluated rank by rank instead (rule ids and
    checklist items), for tests and benchmarks."""

    def __init__(self, features: dict[int, dict]):
        self.features = features
        self.ranks = sorted(features)
        self.rows = [features[r] for r in self.ranks]
        self.n = len(self.ranks)
        self.fallbacks: list[str] = []
        self._columns: dict[str, _V | None] = {}

    def __len__(self) -> int:
        return self.n

    def column(self, name: str) -> _V:
        if name not in self._columns:
            self._columns[name] = self._build(name)
        col = self._columns[name]
        if col is None:
            raise NotVectorised(name)
        return col

    def _build(self, name: str) -> _V | None:
        try:
            values = list(map(operator.itemgetter(name), self.rows))  # compute_features gives every name
        except KeyError:
            values = [row.get(name) for row in self.rows]
        n = self.n
        # Absent on every rank (a GPU figure of a CPU job) or one value on every rank (a job-level figure,
        # the same object in each rank's dict): told apart by list.count, without an array of every rank.
        if n and values.count(None) == n:
            return _V(np.array([np.nan]), np.array([UNKNOWN], np.int8))
        kinds = set(map(type, values))
        if not kinds <= _NUMBER_TYPES:
            return None  # a string, a numpy scalar...: the per-rank evaluator's arithmetic is Python's
        first = values[0] if n else None
        if first is not None and values.count(first) == n:  # equal as Python compares: as float64 compares too
            if int in kinds and abs(first) > _EXACT_INT:
                return None  # Python's integers are exact beyond float64's
            return _V(np.array([first], dtype=np.float64), None, int in kinds, bool in kinds)
        try:
            val = np.array(values, dtype=np.float64)  # None reads NaN; absent is kept in the status
        except (OverflowError, TypeError, ValueError):
            return None
        st = None
        if type(None) in kinds:
            nan = np.isnan(val)
            if float in kinds and int(nan.sum()) != values.count(None):  # a NaN beside the Nones
                nan = np.fromiter((v is None for v in values), dtype=bool, count=self.n)
            st = nan.astype(np.int8)  # 1: UNKNOWN
        if int in kinds and not np.nanmax(np.abs(val), initial=0.0) <= _EXACT_INT:
            if max(abs(v) for v in values if type(v) is int) > _EXACT_INT:
                return None  # Python's integers are exact beyond float64's
        ints, bools = int in kinds, bool in kinds
        # One value on every rank (or absent on every rank): a job-level figure, evaluated once.
        if self.n and (st is None or st.all()):
            if st is not None:
                return _V(np.array([np.nan]), np.array([UNKNOWN], np.int8), ints, bools)
            first = val[0]
            if (val == first).all() if first == first else np.isnan(val).all():
                return _V(val[:1].copy(), None, ints, bools)
        return _V(val, st, ints, bools)


def truthy(val: np.ndarray) -> np.ndarray:
    """Python's ``bool()`` of each value: nonzero (NaN too)."""
    return val != 0


def when_mask(expr: Expr | None, frame: Frame) -> np.ndarray:
    """Ranks (in ``frame.ranks`` order) where ``expr`` holds: known and true, as ``not evaluate(...)`` reads it."""
    if expr is None:
        return np.ones(frame.n, dtype=bool)
    v = evaluate(expr, frame)
    mask = truthy(v.val)
    if v.st is not None:
        mask = mask & (v.st == OK)
    return np.broadcast_to(mask, (frame.n,))


def evaluate(expr: Expr, frame: Frame) -> _V:
    """The expression over every rank of ``frame``; raises NotVectorised where it cannot be exact."""
    with np.errstate(all="ignore"):
        return _vec(expr.tree, frame)


def known(v: _V) -> np.ndarray:
    """Where the value is a finite number with an OK status (``_known`` of the per-rank evaluator); the
    caller checks ``v.bools`` (a bool is not a number there)."""
    ok = np.isfinite(v.val)
    return ok if v.st is None else ok & (v.st == OK)


def _first(a, b):
    """The status of evaluating a, then b (the first that did not end OK)."""
    if a is None:
        return b
    if b is None:
        return a
    return np.where(a != OK, a, b)


def _exact(v: _V) -> _V:
    """Checks that a result that may hold Python ints is within float64's exact integers."""
    if v.ints:
        ok = np.isfinite(v.val) if v.st is None else (v.st == OK) & np.isfinite(v.val)
        if np.any(np.abs(np.broadcast_to(v.val, ok.shape)[ok]) > _EXACT_INT):
            raise NotVectorised("integer beyond 2**53")
    return v


def _vec(node: ast.AST, frame: Frame) -> _V:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, int) and abs(value) > _EXACT_INT:
            raise NotVectorised("integer constant beyond 2**53")
        return _V(np.array([float(value)]), None, isinstance(value, int), False)
    if isinstance(node, ast.Name):
        if node.id in _CONSTS:
            return _V(np.array([float(_CONSTS[node.id])]), None, False, True)
        return frame.column(node.id)
    if isinstance(node, ast.BinOp):
        left, right = _vec(node.left, frame), _vec(node.right, frame)
        st = _first(left.st, right.st)
        if isinstance(node.op, ast.Div):
            zero = right.val == 0
            if zero.any():  # a division by zero: unknown where both sides were known
                prior = np.zeros(1, np.int8) if st is None else st
                st = np.where(zero & (prior == OK), UNKNOWN, prior).astype(np.int8)
            return _V(left.val / np.where(zero, 1.0, right.val), st)
        ints = (left.ints or left.bools) and (right.ints or right.bools)
        return _exact(_V(_BINOPS[type(node.op)](left.val, right.val), st, ints))
    if isinstance(node, ast.UnaryOp):
        operand = _vec(node.operand, frame)
        if isinstance(node.op, ast.USub):
            return _V(-operand.val, operand.st, operand.ints or operand.bools)
        return _V((~truthy(operand.val)).astype(np.float64), operand.st, False, True)
    if isinstance(node, ast.BoolOp):
        return _boolop(node, frame)
    if isinstance(node, ast.Compare):
        return _compare(node, frame)
    if isinstance(node, ast.Call):
        return _call(node, frame)
    raise NotVectorised(type(node).__name__)


def _boolop(node: ast.BoolOp, frame: Frame) -> _V:
    """``and``/``or`` as the per-rank evaluator does them: operands in order, each as ``bool()``, the first
    false (true) one decides, and an operand that does not end OK before that decides its status."""
    is_and = isinstance(node.op, ast.And)
    res = np.array([1.0 if is_and else 0.0])
    st = np.zeros(1, np.int8)
    open_ = np.ones(1, dtype=bool)
    for value in node.values:
        v = _vec(value, frame)
        if v.st is not None:
            bad = open_ & (v.st != OK)
            st = np.where(bad, v.st, st)
            open_ = open_ & ~bad
        t = truthy(v.val)
        stop = open_ & (~t if is_and else t)
        res = np.where(stop, 0.0 if is_and else 1.0, res)
        open_ = open_ & ~stop
        if not open_.any():
            break  # decided everywhere: Python would not evaluate the rest on any rank
    return _V(res, st.astype(np.int8) if st.any() else None, False, True)


def _compare(node: ast.Compare, frame: Frame) -> _V:
    """A comparison chain: the first comparison that is false decides, later operands unread."""
    cur = _vec(node.left, frame)
    st = np.zeros(1, np.int8) if cur.st is None else cur.st
    open_ = st == OK
    res = np.ones(1)
    for op, comparator in zip(node.ops, node.comparators):
        if not open_.any():
            break
        c = _vec(comparator, frame)
        if c.st is not None:
            bad = open_ & (c.st != OK)
            st = np.where(bad, c.st, st)
            open_ = open_ & ~bad
        fail = open_ & ~_NP_CMP[_CMPOPS[type(op)]](cur.val, c.val)
        res = np.where(fail, 0.0, res)
        open_ = open_ & ~fail
        cur = c
    return _V(res, st.astype(np.int8) if st.any() else None, False, True)


def _call(node: ast.Call, frame: Frame) -> _V:
    name = node.func.id
    if name == "coalesce":
        res, st = np.zeros(1), np.full(1, UNKNOWN, np.int8)
        pending = np.ones(1, dtype=bool)
        ints = bools = False
        for arg in node.args:
            v = _vec(arg, frame)
            ints, bools = ints or v.ints, bools or v.bools
            take = pending if v.st is None else pending & (v.st != UNKNOWN)  # OK or ERROR: coalesce stops there
            res = np.where(take, v.val, res)
            st = np.where(take, OK if v.st is None else v.st, st)
            pending = pending & ~take
            if not pending.any():
                break
        return _V(res, st.astype(np.int8) if st.any() else None, ints, bools)
    args = [_vec(a, frame) for a in node.args]
    st = None
    for a in args:
        st = _first(st, a.st)
    if name in ("min", "max"):
        if len(args) == 1:  # min(x) of a number: Python's TypeError, the expression unknown
            st = np.full(1, ERROR, np.int8) if st is None else np.where(st != OK, st, ERROR).astype(np.int8)
            return _V(args[0].val, st)
        cur = args[0].val
        better = np.less if name == "min" else np.greater
        for a in args[1:]:
            cur = np.where(better(a.val, cur), a.val, cur)  # Python's min/max: replaced only when strictly better
        return _V(cur, st, any(a.ints for a in args), any(a.bools for a in args))
    (a,) = args
    if name == "abs":
        return _V(np.abs(a.val), st, a.ints or a.bools)
    # round, floor, ceil: an int, or a ValueError/OverflowError for a NaN or an infinity
    func = {"round": np.rint, "floor": np.floor, "ceil": np.ceil}[name]
    bad = ~np.isfinite(a.val)
    if bad.any():
        st = np.where(bad, np.int8(ERROR), np.int8(OK)) if st is None else np.where((st == OK) & bad, ERROR, st)
        st = st.astype(np.int8)
    return _exact(_V(func(a.val), st, True))
