"""A tiny, safe arithmetic language for the registry: launch geometry, restrictions, constraints.

Kernel Tuner keeps launch geometry and restrictions as expressions over the tunable
parameters; we do the same in kernels/variants.yaml, without handing YAML to eval().
"""
from __future__ import annotations

import ast
import math
import operator

from .errors import ConfigError

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_FUNCTIONS = {"ceil": math.ceil, "floor": math.floor, "min": min, "max": max}


def evaluate(expression: str | int | float, names: dict, where: str = "expression"):
    """Evaluate an arithmetic/comparison expression over `names`; anything else is a ConfigError."""
    if isinstance(expression, (int, float)):
        return expression
    try:
        tree = ast.parse(str(expression), mode="eval")
    except SyntaxError:
        raise ConfigError(f"{where}: cannot parse '{expression}'") from None
    return _eval(tree.body, names, where, expression)


def _eval(node, names, where, text):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ConfigError(f"{where}: unknown name '{node.id}' in '{text}'")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, names, where, text), _eval(node.right, names, where, text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, names, where, text)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, names, where, text) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names, where, text)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, names, where, text)
            if type(op) not in _COMPARE or not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        return _FUNCTIONS[node.func.id](*(_eval(a, names, where, text) for a in node.args))
    raise ConfigError(f"{where}: '{text}' uses something other than arithmetic, comparisons, ceil/floor/min/max")
