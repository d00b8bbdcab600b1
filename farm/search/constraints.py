"""Safe evaluation of the constraint expressions in search spaces.

A constraint is a Python expression over config parameters, shape dimensions and
`dtype_bytes`, e.g. ``rows % block_rows == 0 and block_rows * cols <= 2**20``. Only
arithmetic, comparisons, boolean logic and min/max/abs are allowed: no attribute access,
no other calls, nothing that reaches outside the expression.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}
_FUNCTIONS = {"min": min, "max": max, "abs": abs}


class ConstraintSyntaxError(ValueError):
    """The expression uses something outside the allowed subset."""


class Constraint:
    """A parsed constraint; `names` are the variables it reads."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._tree = ast.parse(source, mode="eval")
        except SyntaxError as err:
            raise ConstraintSyntaxError(f"not a valid expression ({err.msg})") from None
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
        """Whether the constraint holds for the values in `env`."""
        return bool(_eval(self._tree.body, env))

    def __repr__(self) -> str:
        return f"Constraint({self.source!r})"


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, env), _eval(node.right, env))
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
