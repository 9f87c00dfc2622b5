"""Restrictions over tuning parameters (the registry's `tune: constraints:`), evaluated safely.

A constraint is a Python-style expression over the parameters, e.g. "BLOCK_M % 16 == 0" or
"BLOCK_M * STAGES <= 192 and not (STAGES == 4 and BLOCK_M > 64)". It is parsed with the ast module and
walked by hand: integers, parameter names, + - * / // %, unary - + not, comparisons and and/or are all
there is. Anything else (calls, attributes, subscripts, **, strings, lambdas...) is rejected when the
constraint is read, before any value is tried, so nothing in a registry can run code.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

from flashcore_cli.core.errors import FlashcoreError

ALLOWED = "integers, parameter names, + - * / // %, comparisons (== != < <= > >=), and/or/not, parentheses"
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}  # fmt: skip


@dataclass(frozen=True)
class Constraint:
    text: str
    tree: ast.Expression

    def holds(self, values: dict[str, int]) -> bool:
        try:
            return bool(_eval(self.tree.body, values))
        except ZeroDivisionError:
            raise FlashcoreError(f"constraint '{self.text}' divides by zero at {values}") from None


def compile_constraint(text: str, names: set[str] | list[str]) -> Constraint:
    """Parse and check a constraint: only the allowed syntax, only the declared parameter names."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise FlashcoreError(f"constraint '{text}' is not a valid expression (write and/or/not, not &&/||/!; allowed: {ALLOWED})") from None
    for node in ast.walk(tree):
        problem = _disallowed(node, set(names))
        if problem:
            raise FlashcoreError(f"constraint '{text}': {problem} (allowed: {ALLOWED})")
    return Constraint(text, tree)


def _disallowed(node: ast.AST, names: set[str]) -> str | None:
    if isinstance(node, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.Compare, ast.Load)):
        return None
    if type(node) in _BINARY or type(node) in _UNARY or type(node) in _COMPARE:  # operator nodes themselves
        return None
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        allowed = _BINARY if isinstance(node, ast.BinOp) else _UNARY
        return None if type(node.op) in allowed else f"the operator {type(node.op).__name__} is not allowed"
    if isinstance(node, ast.Name):
        if node.id not in names:
            return f"'{node.id}' is not a tuning parameter of this variant (declared: {', '.join(sorted(names))})"
        return None
    if isinstance(node, ast.Constant):
        ok = isinstance(node.value, int) and not isinstance(node.value, bool)
        return None if ok else f"the constant {node.value!r} is not an integer"
    return f"{type(node).__name__} is not allowed"


def _eval(node: ast.AST, values: dict[str, int]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, values) for v in node.values)
        return any(_eval(v, values) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise FlashcoreError(f"cannot evaluate {type(node).__name__}")  # unreachable: compile_constraint rejects it
