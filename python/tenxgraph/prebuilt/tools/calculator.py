"""``safe_calculator``: arithmetic on numbers with + - * / // % ** and parentheses, parsed with
``ast`` (never ``eval``) under size limits. 10xGraph's name, signature and tool schema.

A bad expression is not an exception: the tool returns ``{"error": ...}`` as its result, which
the model reads and can correct. Pure: no side effect, so it keeps no ledger row
(``side_effects="pure"``) and a replay simply computes it again.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from typing import Any

from tenxgraph.utils.tool_decorator import tool

__all__ = ["safe_calculator"]

_BINARY: dict[type[ast.operator], Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_LENGTH = 500
MAX_ABS_VALUE = 10**12
MAX_POWER_EXPONENT = 12


def _in_range(value: float, what: str) -> None:
    if not math.isfinite(float(value)) or abs(value) > MAX_ABS_VALUE:
        raise ValueError(f"{what} is outside the allowed range")


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        _in_range(node.value, "numeric value")
        return node.value
    if isinstance(node, ast.UnaryOp):
        unary = _UNARY.get(type(node.op))
        if unary is None:
            raise ValueError("unsupported unary operator")
        return unary(_evaluate(node.operand))
    if isinstance(node, ast.BinOp):
        binary = _BINARY.get(type(node.op))
        if binary is None:
            raise ValueError("unsupported binary operator")
        left, right = _evaluate(node.left), _evaluate(node.right)
        # Checked before computing: 9**9**9 must not be evaluated to find it is too big.
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER_EXPONENT:
            raise ValueError("power exponent is outside the allowed range")
        result = binary(left, right)
        _in_range(result, "result")
        return result
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


@tool(
    name="safe_calculator",
    description=("Safely evaluate a basic arithmetic expression. Supports numbers, parentheses, "
                 "and +, -, *, /, //, %, and ** with conservative size limits."),
    tags=["math", "calculator"],
    capabilities=["calculate"],
    side_effects="pure",
)
def safe_calculator(expression: str, precision: int | None = None) -> str:
    """JSON ``{"result": n}``; ``{"error": why}`` for an empty, too long (over 500 characters),
    malformed or out-of-range expression (|value| above 10**12, exponent above 12), or a
    division by zero. ``precision`` (0..12) rounds a float result."""
    if not expression or not expression.strip():
        return json.dumps({"error": "expression is required"})
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return json.dumps({"error": "expression is too long"})
    try:
        result = _evaluate(ast.parse(expression, mode="eval"))
        if precision is not None and isinstance(result, float):
            result = round(result, max(0, min(int(precision), 12)))
        return json.dumps({"result": result})
    except Exception as exc:  # noqa: BLE001 - every failure is an answer the model can read
        return json.dumps({"error": str(exc)})
