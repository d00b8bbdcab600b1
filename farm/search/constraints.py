"""Safe evaluation of the constraint expressions in search spaces.

A constraint is a Python expression over config parameters, shape dimensions and
`dtype_bytes`, e.g. ``rows % block_rows == 0 and block_rows * cols <= 2**20``. Only
arithmetic, comparisons, boolean logic and min/max/abs are allowed: no attribute access,
no other calls, nothing that reaches outside the expression.

Evaluation is bounded, so no expression can hang the loader or a sweep, whatever the values
it meets: an expression is at most MAX_SOURCE characters and MAX_NODES syntax nodes; every
integer it computes stays within MAX_INT_BITS bits (a power or product that would exceed it is
refused before it is computed: `(block_rows + 1) ** (2 ** 40)` fails at once, for any config),
and every string or tuple within MAX_SEQUENCE items. A breach raises ConstraintEvalError, as
does any arithmetic or type error; a sweep records such a config as invalid, and loading a space
refuses it.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

from farm.errors import shorten

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}
_FUNCTIONS = {"min": min, "max": max, "abs": abs}
MAX_SOURCE = 1000
MAX_NODES = 300
MAX_INT_BITS = 4096
MAX_SEQUENCE = 10_000


class ConstraintSyntaxError(ValueError):
    """The expression uses something outside the allowed subset."""


class ConstraintEvalError(ArithmeticError):
    """The expression cannot be evaluated for these values (too large, a type or arithmetic error)."""


class Constraint:
    """A parsed constraint; `names` are the variables it reads."""

    def __init__(self, source: str) -> None:
        self.source = source
        if len(source) > MAX_SOURCE:
            raise ConstraintSyntaxError(f"an expression of at most {MAX_SOURCE} characters, not {len(source)}")
        try:
            self._tree = ast.parse(source, mode="eval")
        except SyntaxError as err:
            raise ConstraintSyntaxError(f"not a valid expression ({err.msg})") from None
        except (RecursionError, MemoryError, ValueError):  # nesting too deep for the parser; NUL bytes
            raise ConstraintSyntaxError("an expression nested less deeply") from None
        nodes = sum(1 for _ in ast.walk(self._tree))
        if nodes > MAX_NODES:
            raise ConstraintSyntaxError(f"an expression of at most {MAX_NODES} syntax nodes, not {nodes}")
        self.names = frozenset(self._check(self._tree.body))

    def _check(self, node: ast.AST) -> set[str]:
        names: set[str] = set()
        for child in ast.walk(node):
            if isinstance(child, ast.Name):
                if child.id not in _FUNCTIONS:
                    names.add(child.id)
            elif isinstance(child, ast.Call):
                if not (isinstance(child.func, ast.Name) and child.func.id in _FUNCTIONS) or child.keywords:
                    raise ConstraintSyntaxError(f"only {sorted(_FUNCTIONS)} may be called")
            elif isinstance(child, ast.Constant):
                if not isinstance(child.value, (int, float, str, bool)):
                    raise ConstraintSyntaxError(f"constant {child.value!r} is not allowed")
            elif not isinstance(child, (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp,
                                        ast.Tuple, ast.List, ast.Load, ast.And, ast.Or,
                                        *_BINARY, *_UNARY, *_COMPARE)):
                raise ConstraintSyntaxError(f"{type(child).__name__} is not allowed")
        return names

    def __call__(self, env: Mapping[str, Any]) -> bool:
        """Whether the constraint holds for the values in `env`; ConstraintEvalError when it cannot
        be evaluated (a value over the bounds, a division by zero, a type error, a missing name)."""
        try:
            return bool(_bounded(_eval(self._tree.body, env)))
        except ConstraintEvalError:
            raise
        except (ArithmeticError, TypeError, ValueError, KeyError, RecursionError, MemoryError) as err:
            raise ConstraintEvalError(f"{type(err).__name__}: {shorten(str(err), 120)}") from None

    def __repr__(self) -> str:
        return f"Constraint({self.source!r})"


def _bounded(value: Any) -> Any:
    """`value`, or ConstraintEvalError when it is an integer or sequence over the bounds."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ConstraintEvalError(f"an integer of more than {MAX_INT_BITS} bits")
    if isinstance(value, (str, tuple)) and len(value) > MAX_SEQUENCE:
        raise ConstraintEvalError(f"a string or tuple of more than {MAX_SEQUENCE} items")
    return value


def _length(value: Any) -> int:
    """How many items repeating `value` multiplies: len of a string or tuple, else 0."""
    return len(value) if isinstance(value, (str, tuple, list)) else 0


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    """One arithmetic operation, refused before it runs when its result would exceed the bounds."""
    if isinstance(op, ast.Mod) and isinstance(left, (str, bytes)):
        # printf-style formatting: '%04000000000d' % rows would build a 4 GB string first
        raise ConstraintEvalError("string formatting (%) is not allowed; expected arithmetic on numbers")
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0 \
            and abs(left) > 1 and (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
        raise ConstraintEvalError(f"a power of more than {MAX_INT_BITS} bits")
    if isinstance(op, ast.Mult):
        if isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise ConstraintEvalError(f"a product of more than {MAX_INT_BITS} bits")
        for sequence, count in ((left, right), (right, left)):
            if _length(sequence) and isinstance(count, int) and _length(sequence) * count > MAX_SEQUENCE:
                raise ConstraintEvalError(f"a repeated string or tuple of more than {MAX_SEQUENCE} items")
    return _bounded(_BINARY[type(op)](left, right))


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _binary(node.op, _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.Call):
        return _FUNCTIONS[node.func.id](*(_eval(a, env) for a in node.args))  # type: ignore[attr-defined]
    raise ConstraintSyntaxError(f"{type(node).__name__} is not allowed")
