"""A small, safe expression language for rule conditions (no ``eval``).

Expressions are parsed with Python's own grammar (``ast.parse(mode="eval")``) and then walked by
this module, which accepts only: numbers, ``true``/``false``, feature names, ``+ - * /``, comparisons,
``and or not``, and the functions ``min max abs round floor ceil coalesce``. Anything else (attributes,
subscripts, lambdas, other calls) is rejected when the rule file is loaded, so a rule file cannot run code.

A feature that is absent (None: a GPU signal on a CPU job, a figure not recorded yet) makes the
whole expression unknown, so a rule never fires on missing data. Division by zero is unknown too, and
so is a function given a value it cannot take (``floor`` of an infinity). ``coalesce(a, b, ...)`` is
the one way round that: the first of its arguments that is known.

An expression is at most ``MAX_EXPRESSION_CHARS`` characters and nests at most ``MAX_EXPRESSION_DEPTH``
levels (the built-in rules use under 100 characters and 7 levels): the parser and the evaluator walk
the tree recursively, and a rule file must not be able to exhaust the stack or the memory.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCS = {"min": min, "max": max, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil}
_ONE_ARG = ("abs", "round", "floor", "ceil")
_CONSTS = {"true": True, "false": False, "True": True, "False": False}
MAX_EXPRESSION_CHARS = 10_000
"""Longest expression text a rule file may hold."""
MAX_EXPRESSION_DEPTH = 100
"""Deepest nesting of an expression: operators, calls and comparisons inside one another."""


class ExprError(ValueError):
    """An expression uses syntax or names the language does not allow."""


class Unknown(Exception):
    """Raised inside evaluation when a referenced feature is absent; the result is unknown."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression, the feature names it reads, and the tree compiled to nested closures: a
    diagnosis evaluates every rule on every rank, and closures skip the tree walk's per-node dispatch
    (``_eval`` stays the specification they are tested against)."""

    text: str
    tree: ast.AST = field(repr=False, compare=False)
    names: frozenset
    fn: object = field(repr=False, compare=False)


def parse(text) -> Expr:
    """Parse and check an expression; raise ExprError naming the first construct that is not allowed."""
    if isinstance(text, bool) or isinstance(text, (int, float)):
        text = str(text).lower() if isinstance(text, bool) else repr(text)
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression")
    text = text.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExprError(f"expression is {len(text):,} characters long; the limit is {MAX_EXPRESSION_CHARS:,}")
    tree = _syntax_tree(text)
    depth = _depth(tree.body)
    if depth > MAX_EXPRESSION_DEPTH:
        raise ExprError(f"expression nests more than {MAX_EXPRESSION_DEPTH} levels deep (the limit)")
    names: set[str] = set()
    _check(tree.body, names)
    return Expr(text, tree.body, frozenset(names), _compile(tree.body))


def _syntax_tree(text: str) -> ast.Expression:
    """Python's parse of the text, every failure an ExprError (deep nesting exhausts the parser's stack)."""
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError as exc:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ExprError(f"syntax error in {shown!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression nests more than {MAX_EXPRESSION_DEPTH} levels deep (the limit)") from None
    except ValueError as exc:  # a NUL character
        raise ExprError(f"not an expression: {exc}") from None


def _depth(tree: ast.AST) -> int:
    """How deeply the expression nests, walked without recursion; stops counting past the limit."""
    deepest, stack = 0, [(tree, 1)]
    while stack and deepest <= MAX_EXPRESSION_DEPTH:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    return deepest


def _check(node: ast.AST, names: set[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExprError(f"only numbers are allowed as constants, got {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in _CONSTS:
            names.add(node.id)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed (use + - * /)")
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.Not)):
            raise ExprError(f"unary operator {type(node.op).__name__} is not allowed")
        _check(node.operand, names)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, names)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise ExprError(f"comparison {type(op).__name__} is not allowed")
        _check(node.left, names)
        for comparator in node.comparators:
            _check(comparator, names)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in (*_FUNCS, "coalesce"):
            raise ExprError(f"only the functions {', '.join(sorted((*_FUNCS, 'coalesce')))} may be called")
        if node.keywords or not node.args:
            raise ExprError(f"{node.func.id}() takes one or more positional arguments")
        if node.func.id in _ONE_ARG and len(node.args) != 1:
            raise ExprError(f"{node.func.id}() takes one argument")
        for arg in node.args:
            _check(arg, names)
    else:
        raise ExprError(f"{type(node).__name__} is not allowed in a rule expression")


def evaluate(expr: Expr, env: dict):
    """Return the expression's value over ``env`` (feature name -> number), or None when unknown.

    A value a function cannot take (``floor`` of an infinity or a NaN) is unknown too, like a division by
    zero: a figure the run could not give must not stop the diagnosis.
    """
    try:
        return expr.fn(env)
    except (Unknown, ArithmeticError, ValueError, TypeError):
        return None


def _compile(node: ast.AST):
    """A function of ``env`` that gives what ``_eval(node, env)`` gives (raising alike), built once."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        if name in _CONSTS:
            const = _CONSTS[name]
            return lambda env: const

        def feature(env):
            value = env.get(name)
            if value is None:
                raise Unknown(name)
            return value

        return feature
    if isinstance(node, ast.BinOp):
        left, right, op = _compile(node.left), _compile(node.right), _BINOPS[type(node.op)]
        if isinstance(node.op, ast.Div):

            def divide(env):
                a, b = left(env), right(env)
                if b == 0:
                    raise Unknown("division by zero")
                return op(a, b)

            return divide
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        return lambda env: not operand(env)
    if isinstance(node, ast.BoolOp):
        values = [_compile(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(bool(v(env)) for v in values)  # stops at the first false, like Python
        return lambda env: any(bool(v(env)) for v in values)
    if isinstance(node, ast.Compare):
        first = _compile(node.left)
        rest = [(_CMPOPS[type(op)], _compile(c)) for op, c in zip(node.ops, node.comparators)]

        def compare(env):
            left = first(env)
            for op, comparator in rest:
                right = comparator(env)
                if not op(left, right):
                    return False
                left = right
            return True

        return compare
    if isinstance(node, ast.Call):
        args = [_compile(a) for a in node.args]
        if node.func.id == "coalesce":

            def coalesce(env):
                for arg in args:
                    try:
                        return arg(env)
                    except Unknown:
                        continue
                raise Unknown("coalesce")

            return coalesce
        func = _FUNCS[node.func.id]
        return lambda env: func(*(a(env) for a in args))

    def unknown(env):
        raise Unknown(type(node).__name__)

    return unknown


def _eval(node: ast.AST, env: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _CONSTS:
            return _CONSTS[node.id]
        value = env.get(node.id)
        if value is None:
            raise Unknown(node.id)
        return value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Div) and right == 0:
            raise Unknown("division by zero")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BoolOp):
        # Short-circuit like Python, so `has_gpu and gpu_thing > 0` is false (not unknown) on a CPU job.
        is_and = isinstance(node.op, ast.And)
        for value_node in node.values:
            value = bool(_eval(value_node, env))
            if is_and and not value:
                return False
            if not is_and and value:
                return True
        return is_and
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        if node.func.id == "coalesce":
            for arg in node.args:
                try:
                    return _eval(arg, env)
                except Unknown:
                    continue
            raise Unknown("coalesce")
        return _FUNCS[node.func.id](*(_eval(arg, env) for arg in node.args))
    raise Unknown(type(node).__name__)  # unreachable for parsed expressions
