"""A small safe expression evaluator for `when:` conditions and cross-parameter constraints.

Parsed with `ast` and walked over a whitelist of nodes; nothing is ever passed to eval().
Supports names, numbers, strings, booleans, None, lists/tuples, arithmetic (+ - * / // % **),
comparisons (chained too), `in`/`not in`, and/or/not, conditional expressions and the functions
min, max, abs.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

_BIN: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_CMP: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_CONSTS = {"true": True, "false": False, "True": True, "False": False, "None": None, "null": None}


class ExprError(ValueError):
    """The expression is not in the allowed language, or names an unknown parameter."""


class Expr:
    """A compiled expression. `names` lists the parameters it reads."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._tree = ast.parse(source.strip(), mode="eval").body
        except SyntaxError as exc:
            raise ExprError(f"syntax error in expression {source!r}: {exc.msg}") from None
        self.names: set[str] = set()
        self._check(self._tree)

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if node.id not in _CONSTS and node.id not in _FUNCS:
                self.names.add(node.id)
            return
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS) or node.keywords:
                raise ExprError(f"only min(), max() and abs() may be called, in {self.source!r}")
            for a in node.args:
                self._check(a)
            return
        allowed = (ast.Constant, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp,
                   ast.List, ast.Tuple, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Load,
                   *_BIN, *_CMP)
        if not isinstance(node, allowed):
            raise ExprError(f"{type(node).__name__} is not allowed in expression {self.source!r}")
        for child in ast.iter_child_nodes(node):
            self._check(child)

    def __call__(self, env: Mapping[str, Any]) -> Any:
        return self._eval(self._tree, env)

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in _CONSTS:
                return _CONSTS[node.id]
            raise ExprError(f"unknown name {node.id!r} in expression {self.source!r}")
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                result: Any = True
                for v in node.values:
                    result = self._eval(v, env)
                    if not result:
                        return result
                return result
            result = False
            for v in node.values:
                result = self._eval(v, env)
                if result:
                    return result
            return result
        if isinstance(node, ast.UnaryOp):
            val = self._eval(node.operand, env)
            if isinstance(node.op, ast.Not):
                return not val
            if isinstance(node.op, ast.USub):
                return -val
            return +val
        if isinstance(node, ast.BinOp):
            return _BIN[type(node.op)](self._eval(node.left, env), self._eval(node.right, env))
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comp, env)
                if left is None or right is None:
                    if not isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                        return False
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)
        if isinstance(node, ast.List | ast.Tuple):
            return [self._eval(e, env) for e in node.elts]
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return _FUNCS[node.func.id](*(self._eval(a, env) for a in node.args))
        raise ExprError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"
