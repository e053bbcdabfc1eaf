"""A small, safe expression language for rule conditions (no ``eval``).

Expressions are parsed with Python's own grammar (``ast.parse(mode="eval")``) and then walked by
this module, which accepts only: numbers, ``true``/``false``, feature names, ``+ - * /``, comparisons,
``and or not``, and the functions ``min max abs round floor ceil coalesce``. Anything else (attributes,
subscripts, lambdas, other calls) is rejected when the rule file is loaded, so a rule file cannot run code.
Length and nesting are capped (``MAX_EXPRESSION_*``; the built-in rules use under 100 characters and 7
levels): the parser and the evaluator recurse, and a rule file must not exhaust the stack or the memory.

One evaluator, over columns: a ``Frame`` holds the ranks' features as one numpy array per feature, and each
node of the tree is a few array operations over every rank at once; a single rank is a one-row frame. Beside
each value it keeps how its evaluation ended and the type Python gives it (an int stays an int in a finding;
a bool is not a number a rule measures). UNKNOWN (an absent feature: a GPU signal on a CPU job, a figure not
recorded yet; a division by zero) makes the whole expression unknown, so a rule never fires on missing data;
``coalesce(a, b, ...)`` is the one way round it, the first argument that is known. ERROR (``floor`` of an
infinity, ``min`` of one argument, a feature that is not a number) is unknown too, and ``coalesce`` does not
catch it. ``and``/``or`` and comparison chains decide per rank as Python's short circuits do. Integers are
float64 here: exact to 2**53, far past any feature.
"""

from __future__ import annotations

import ast
import contextlib
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

import numpy as np

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal}
_CMPOPS.update({ast.Eq: np.equal, ast.NotEq: np.not_equal})
_FUNCS = ("min", "max", "abs", "round", "floor", "ceil")
_ONE_ARG = ("abs", "round", "floor", "ceil")
_CONSTS = {"true": True, "false": False, "True": True, "False": False}
MAX_EXPRESSION_CHARS = 10_000
"""Longest expression text a rule file may hold."""
MAX_EXPRESSION_DEPTH = 100
"""Deepest nesting of an expression: operators, calls and comparisons inside one another."""


class ExprError(ValueError):
    """An expression uses syntax or names the language does not allow."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression and the feature names it reads."""

    text: str
    tree: ast.AST = field(repr=False, compare=False)
    names: frozenset


def parse(text) -> Expr:
    """Parse and check an expression; raise ExprError naming the first construct that is not allowed."""
    if isinstance(text, bool) or isinstance(text, (int, float)):
        text = str(text).lower() if isinstance(text, bool) else repr(text)
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression")
    text = text.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExprError(f"expression is {len(text):,} characters long; the limit is {MAX_EXPRESSION_CHARS:,}")
    try:  # every failure an ExprError (deep nesting exhausts the parser's stack)
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ExprError(f"syntax error in {shown!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression nests more than {MAX_EXPRESSION_DEPTH} levels deep (the limit)") from None
    except ValueError as exc:  # a NUL character
        raise ExprError(f"not an expression: {exc}") from None
    if _depth(tree) > MAX_EXPRESSION_DEPTH:
        raise ExprError(f"expression nests more than {MAX_EXPRESSION_DEPTH} levels deep (the limit)")
    names: set[str] = set()
    _check(tree, names)
    return Expr(text, tree, frozenset(names))


def _depth(tree: ast.AST) -> int:
    """How deeply the expression nests, walked without recursion; stops counting past the limit."""
    deepest, stack = 0, [(tree, 1)]
    while stack and deepest <= MAX_EXPRESSION_DEPTH:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    return deepest


def _check(node: ast.AST, names: set[str]) -> None:
    """Raise ExprError at the first construct (in reading order) the language does not allow."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExprError(f"only numbers are allowed as constants, got {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in _CONSTS:
            names.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
        raise ExprError(f"operator {type(node.op).__name__} is not allowed (use + - * /)")
    elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.Not)):
        raise ExprError(f"unary operator {type(node.op).__name__} is not allowed")
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise ExprError(f"comparison {type(op).__name__} is not allowed")
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in (*_FUNCS, "coalesce"):
            raise ExprError(f"only the functions {', '.join(sorted((*_FUNCS, 'coalesce')))} may be called")
        if node.keywords or not node.args:
            raise ExprError(f"{node.func.id}() takes one or more positional arguments")
        if node.func.id in _ONE_ARG and len(node.args) != 1:
            raise ExprError(f"{node.func.id}() takes one argument")
    elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp)):
        raise ExprError(f"{type(node).__name__} is not allowed in a rule expression")
    for child in node.args if isinstance(node, ast.Call) else ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            _check(child, names)


OK, UNKNOWN, ERROR = 0, 1, 2
FLOAT, INT, BOOL = 0, 1, 2
_NUMBER_KINDS = {float: (FLOAT, OK), int: (INT, OK), bool: (BOOL, OK), type(None): (FLOAT, UNKNOWN)}


def _one(x) -> np.ndarray:
    return np.array([x], dtype=np.int8)


class Value(NamedTuple):
    """An expression over the rows: ``val`` (float64), ``st`` (OK, UNKNOWN, ERROR) and ``kind`` (FLOAT, INT,
    BOOL: the type Python gives it), each one element (the same on every row) or one per row."""

    val: np.ndarray
    st: np.ndarray
    kind: np.ndarray

    def known(self) -> np.ndarray:
        """Where it is a finite number (a bool is not one)."""
        return (self.st == OK) & (self.kind != BOOL) & np.isfinite(self.val)

    def at(self, i: int):
        """Row ``i``'s value as Python has it (an int stays an int), or None when unknown."""
        value, st, kind = (column[i if column.size > 1 else 0] for column in self)
        if st != OK:
            return None
        return bool(value) if kind == BOOL else int(value) if kind == INT and np.isfinite(value) else float(value)


def _constant(value) -> Value:
    kind = BOOL if isinstance(value, bool) else INT if isinstance(value, int) else FLOAT
    return Value(np.array([float(value)]), _one(OK), _one(kind))


class Frame:
    """Per-rank features (rank -> feature dict) as columns over the ranks (ascending), and each expression's
    value: built the first time a rule names them and kept, so the rules and the checklist read one frame."""

    def __init__(self, features: dict[int, dict]):
        self.rows = [features[r] for r in sorted(features)]
        self.n = len(self.rows)
        self._values: dict[str, Value] = {}

    def value(self, expr: Expr) -> Value:
        """The expression on every row."""
        if expr.text not in self._values:
            with np.errstate(all="ignore"):
                self._values[expr.text] = _eval(expr.tree, self)
        return self._values[expr.text]

    def holds(self, expr: Expr | None) -> np.ndarray:
        """Where the expression is known and true (``bool()`` of its value); everywhere for no expression."""
        v = self.value(expr) if expr is not None else _constant(True)
        return np.broadcast_to((v.st == OK) & (v.val != 0), (self.n,))

    def column(self, name: str) -> Value:
        key = "\0" + name  # apart from expression texts
        if key not in self._values:
            self._values[key] = _column(list(map(dict.get, self.rows, repeat(name))))  # map: C speed at 10,000
        return self._values[key]


def _column(values: list) -> Value:
    """A feature's values as a column; one element when every rank holds the same (a job-level figure)."""
    types = set(map(type, values))
    if len(types) == 1 and values.count(values[0]) == len(values):
        values = values[:1]
    if len(types) <= 1 and types <= _NUMBER_KINDS.keys():  # no rank at all reads as absent
        kind, st = _NUMBER_KINDS[types.pop() if types else type(None)]
        with contextlib.suppress(OverflowError):  # an integer beyond float64: one by one below
            return Value(np.array(values, dtype=np.float64), _one(st), _one(kind))  # None reads NaN
    return Value(*map(np.array, zip(*map(_number, values))))  # mixed types, numpy scalars, strings


def _number(v) -> tuple:
    """(value, status, kind) of one feature value: None is unknown, a value that is not a number an error."""
    if v is None or not isinstance(v, (int, float, np.number, np.bool_)) or (type(v) is int and abs(v) >= 1e308):
        return np.nan, UNKNOWN if v is None else ERROR, FLOAT
    kind = BOOL if isinstance(v, (bool, np.bool_)) else INT if isinstance(v, (int, np.integer)) else FLOAT
    return float(v), OK, kind


def evaluate(expr: Expr, env: dict):
    """The expression's value over one rank's features (name -> number), or None when unknown."""
    return Frame({0: env}).value(expr).at(0)


def _eval(node: ast.AST, frame: Frame) -> Value:
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.Name):
        return _constant(_CONSTS[node.id]) if node.id in _CONSTS else frame.column(node.id)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, frame), _eval(node.right, frame)
        st = np.where(a.st != OK, a.st, b.st)  # the first operand's failure, as Python raises it
        if isinstance(node.op, ast.Div):
            zero = b.val == 0
            return Value(a.val / np.where(zero, 1.0, b.val), np.where(zero & (st == OK), UNKNOWN, st), _one(FLOAT))
        kind = np.where((a.kind != FLOAT) & (b.kind != FLOAT), INT, FLOAT)  # bool + bool is an int
        return Value(_BINOPS[type(node.op)](a.val, b.val), st, kind)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, frame)
        if isinstance(node.op, ast.USub):
            return Value(-v.val, v.st, np.where(v.kind == BOOL, INT, v.kind))
        return Value((v.val == 0).astype(np.float64), v.st, _one(BOOL))
    if isinstance(node, (ast.BoolOp, ast.Compare)):
        return _decided(node, frame)
    return _call(node, frame)


def _decided(node: ast.BoolOp | ast.Compare, frame: Frame) -> Value:
    """``and``/``or`` and comparison chains, operands in order: per row, the first operand that does not end
    OK gives the status, the first false (``or``: true) operand or comparison decides, the rest unread."""
    is_and = not isinstance(node, ast.BoolOp) or isinstance(node.op, ast.And)
    res, st, open_ = np.array([float(is_and)]), _one(OK), np.ones(1, dtype=bool)
    if isinstance(node, ast.BoolOp):
        steps = [(None, value) for value in node.values]
    else:
        steps = [(None, node.left), *zip((_CMPOPS[type(op)] for op in node.ops), node.comparators)]
    prior = None
    for op, operand in steps:
        if not open_.any():
            break  # decided on every row: Python reads no further operand on any
        v = _eval(operand, frame)
        bad = open_ & (v.st != OK)
        st, open_ = np.where(bad, v.st, st), open_ & ~bad
        if isinstance(node, ast.BoolOp):
            stop = open_ & ((v.val == 0) if is_and else (v.val != 0))
        else:
            stop = open_ & ~op(prior.val, v.val) if op is not None else np.zeros(1, dtype=bool)
            prior = v
        res, open_ = np.where(stop, float(not is_and), res), open_ & ~stop
    return Value(res, st, _one(BOOL))


def _call(node: ast.Call, frame: Frame) -> Value:
    name = node.func.id
    if name == "coalesce":  # the first argument that is not unknown (an error stops it too)
        out, pending = Value(np.zeros(1), _one(UNKNOWN), _one(FLOAT)), np.ones(1, dtype=bool)
        for arg in node.args:
            v = _eval(arg, frame)
            take = pending & (v.st != UNKNOWN)
            out, pending = Value(*(np.where(take, new, old) for new, old in zip(v, out))), pending & ~take
            if not pending.any():
                break
        return out
    args = [_eval(a, frame) for a in node.args]
    first, st = args[0], args[0].st
    for a in args[1:]:
        st = np.where(st != OK, st, a.st)
    if name in ("min", "max"):
        if len(args) == 1:  # min(x) of a number: Python's TypeError
            return Value(first.val, np.where(st != OK, st, ERROR), first.kind)
        val, kind = first.val, first.kind
        for a in args[1:]:
            take = (np.less if name == "min" else np.greater)(a.val, val)  # Python's: replaced only when strictly
            val, kind = np.where(take, a.val, val), np.where(take, a.kind, kind)
        return Value(val, st, kind)
    if name == "abs":
        return Value(np.abs(first.val), st, np.where(first.kind == BOOL, INT, first.kind))
    # round, floor, ceil: an int, or Python's ValueError/OverflowError for a NaN or an infinity
    func = {"round": np.rint, "floor": np.floor, "ceil": np.ceil}[name]
    return Value(func(first.val), np.where((st == OK) & ~np.isfinite(first.val), ERROR, st), _one(INT))
