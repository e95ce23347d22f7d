"""A small safe expression evaluator for `when:` conditions and cross-parameter constraints.

Parsed with `ast` and walked over a whitelist of nodes; nothing is ever passed to eval().
Supports names, numbers, strings, booleans, None, lists/tuples, arithmetic (+ - * / // % **),
comparisons (chained too), `in`/`not in`, and/or/not, conditional expressions and the functions
min, max, abs.

Bounded in size and in work, so no expression can hang or exhaust memory: the source (characters, nodes,
depth); every value an operation makes (integers' bits, floats' magnitude, and the total elements of a
string or list counted through every nesting level, so `[[1]*1000]*1000` is a million elements, not a
thousand); and the work of one evaluation (`MAX_WORK` units: one per node evaluated, plus the total elements
every comparison, `in`, min and max walks), counted across the whole evaluation, never per step.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

MAX_SOURCE_CHARS = 2000
MAX_NODES = 400
MAX_DEPTH = 40
MAX_INT_BITS = 256  # integers beyond 2**256 (and floats beyond 1e77) are refused, not computed
MAX_SEQ_LEN = 1000  # total elements (characters of strings included) of a value an expression builds
MAX_WORK = 100_000  # units of work of one evaluation: nodes evaluated plus elements compared or searched
_MAX_MAGNITUDE = 2.0**MAX_INT_BITS


class _Budget:
    """The work one evaluation may still do; charged by every node and by every walk over a container."""

    def __init__(self, units: int = MAX_WORK) -> None:
        self.left = units

    def charge(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise ArithmeticError(f"the evaluation needs over {MAX_WORK} units of work (the work limit)")


def _weight(value: Any, limit: int = MAX_SEQ_LEN) -> int:
    """The elements of `value` counted through every nesting level (a string counts its characters), walked
    without recursion and stopping as soon as the count passes `limit` (so it costs at most `limit` steps,
    however many times a list repeats itself): `limit + 1` then."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, list | tuple | set | frozenset | dict):
            total += len(v)
            if total <= limit:
                stack.extend(v)
        if total > limit:
            return limit + 1
    return total


def _checked(value: Any) -> Any:
    """A value an operation produced, refused if it grew past the bounds."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise ArithmeticError(f"an integer over {MAX_INT_BITS} bits")
    elif isinstance(value, float):
        if math.isnan(value) or abs(value) > _MAX_MAGNITUDE:
            raise ArithmeticError(f"a number that is not finite or over 2**{MAX_INT_BITS}")
    elif isinstance(value, complex):
        raise TypeError("a complex number")
    elif isinstance(value, str | list | tuple) and _weight(value) > MAX_SEQ_LEN:
        raise ArithmeticError(f"a string or list over {MAX_SEQ_LEN} items in all (nested lists counted "
                              "through every level; the size limit)")
    return value


def _number(v: Any) -> bool:
    return isinstance(v, int | float)


def _pow(a: Any, b: Any) -> Any:
    if not (_number(a) and _number(b)):
        raise TypeError(f"** takes numbers, not {type(a).__name__} and {type(b).__name__}")
    if a not in (0, 1, -1) and abs(b) > 1 and (abs(b) * math.log2(max(abs(a), 1 / abs(a))) > MAX_INT_BITS):
        raise ArithmeticError(f"{a!r} ** {b!r} is over 2**{MAX_INT_BITS}")
    return a**b


def _mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, str | list | tuple) and isinstance(n, int) and n * _weight(seq) > MAX_SEQ_LEN:
            raise ArithmeticError(f"a string or list over {MAX_SEQ_LEN} items in all (nested lists counted "
                                  "through every level; the size limit)")
    return a * b


def _mod(a: Any, b: Any) -> Any:
    if not (_number(a) and _number(b)):  # no %-formatting of strings
        raise TypeError(f"% takes numbers, not {type(a).__name__} and {type(b).__name__}")
    return a % b


_BIN: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: _mod, ast.Pow: _pow,
}
_CMP: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_CONSTS = {"true": True, "false": False, "True": True, "False": False, "None": None, "null": None}
# what an operation on values of the wrong kind, or out of range, raises: each becomes an ExprError
_EVAL_ERRORS = (ArithmeticError, TypeError, ValueError, MemoryError, RecursionError)


class ExprError(ValueError):
    """The expression is not in the allowed language, names an unknown parameter, or cannot be evaluated.
    `expr` is the expression (None when it could not be compiled)."""

    def __init__(self, message: str, expr: Expr | None = None) -> None:
        super().__init__(message)
        self.expr = expr


class Expr:
    """A compiled expression. `names` lists the parameters it reads."""

    def __init__(self, source: str) -> None:
        self.source = source
        if not isinstance(source, str):
            raise ExprError(f"an expression must be a string, not {type(source).__name__}")
        if len(source) > MAX_SOURCE_CHARS:
            raise ExprError(f"expression is {len(source)} characters long, over the limit of {MAX_SOURCE_CHARS}")
        try:
            self._tree = ast.parse(source.strip(), mode="eval").body
        except SyntaxError as exc:
            raise ExprError(f"syntax error in expression {self._short()}: {exc.msg}") from None
        except (RecursionError, MemoryError):
            raise ExprError(f"expression {self._short()} is nested too deeply") from None
        except ValueError as exc:
            raise ExprError(f"cannot parse expression {self._short()}: {exc}") from None
        self._check_size()
        self.names: set[str] = set()
        self._check(self._tree)

    def _short(self) -> str:
        text = repr(self.source)
        return text if len(text) <= 80 else text[:77] + "..."

    def _check_size(self) -> None:
        """At most MAX_NODES nodes, at most MAX_DEPTH deep (walked without recursion)."""
        stack: list[tuple[ast.AST, int]] = [(self._tree, 1)]
        nodes = 0
        while stack:
            node, depth = stack.pop()
            nodes += 1
            if nodes > MAX_NODES:
                raise ExprError(f"expression {self._short()} has over {MAX_NODES} terms")
            if depth > MAX_DEPTH:
                raise ExprError(f"expression {self._short()} is nested over {MAX_DEPTH} levels deep")
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if node.id not in _CONSTS and node.id not in _FUNCS:
                self.names.add(node.id)
            return
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS) or node.keywords:
                raise ExprError(f"only min(), max() and abs() may be called, in {self._short()}")
            for a in node.args:
                self._check(a)
            return
        allowed = (ast.Constant, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp,
                   ast.List, ast.Tuple, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Load,
                   *_BIN, *_CMP)
        if not isinstance(node, allowed):
            raise ExprError(f"{type(node).__name__} is not allowed in expression {self._short()}")
        for child in ast.iter_child_nodes(node):
            self._check(child)

    def __call__(self, env: Mapping[str, Any]) -> Any:
        """Evaluate; every failure (an unknown name, a division by zero, values of the wrong kind, a result
        past the bounds) is an ExprError naming the expression."""
        try:
            return self._eval(self._tree, env, _Budget())
        except ExprError as exc:
            exc.expr = self
            raise
        except _EVAL_ERRORS as exc:
            what = "division by zero" if isinstance(exc, ZeroDivisionError) else str(exc) or type(exc).__name__
            raise ExprError(f"cannot evaluate expression {self._short()}: {what}", self) from None

    def _eval(self, node: ast.AST, env: Mapping[str, Any], budget: _Budget) -> Any:
        budget.charge(1)
        if isinstance(node, ast.Constant):
            return _checked(node.value)
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in _CONSTS:
                return _CONSTS[node.id]
            raise ExprError(f"unknown name {node.id!r} in expression {self._short()}")
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                result: Any = True
                for v in node.values:
                    result = self._eval(v, env, budget)
                    if not result:
                        return result
                return result
            result = False
            for v in node.values:
                result = self._eval(v, env, budget)
                if result:
                    return result
            return result
        if isinstance(node, ast.UnaryOp):
            val = self._eval(node.operand, env, budget)
            if isinstance(node.op, ast.Not):
                return not val
            if isinstance(node.op, ast.USub):
                return _checked(-val)
            return _checked(+val)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env, budget), self._eval(node.right, env, budget)
            return _checked(_BIN[type(node.op)](left, right))
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env, budget)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comp, env, budget)
                budget.charge(_weight(left, budget.left) + _weight(right, budget.left))  # what comparing walks
                if left is None or right is None:
                    if not isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                        return False
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env, budget) else node.orelse, env, budget)
        if isinstance(node, ast.List | ast.Tuple):
            return _checked([self._eval(e, env, budget) for e in node.elts])
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            args = [self._eval(a, env, budget) for a in node.args]
            budget.charge(sum(_weight(a, budget.left) for a in args))  # what min and max walk
            return _checked(_FUNCS[node.func.id](*args))
        raise ExprError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"
