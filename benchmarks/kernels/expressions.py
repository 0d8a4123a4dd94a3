"""Axis expressions and constraints of a SOL-ExecBench definition: a small safe evaluator.

Numbers, names, ``+ - * / // % **``, comparisons and ``and``/``or``: nothing else parses,
so a definition cannot run code through an expression.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

from evolve.types import EvolveError

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}  # fmt: skip


class SpecError(EvolveError):
    """A problem folder that does not follow the SOL-ExecBench layout; the message says where."""


def evaluate_expression(text: str, names: Mapping[str, int | float]) -> Any:
    """Evaluate an axis expression or constraint: numbers, names, + - * / // % **, comparisons, and/or.

    Raises:
        SpecError: on any other syntax or an unknown name.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise SpecError(f"cannot parse expression {text!r}: {exc.msg}") from exc

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise SpecError(f"expression {text!r} names {node.id!r}, which is not a known axis")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            left = walk(node.left)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = walk(right_node)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            values = [walk(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        raise SpecError(
            f"expression {text!r}: {type(node).__name__} is not allowed (use + - * / // % ** and names)"
        )

    return walk(tree)
