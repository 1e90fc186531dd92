"""A tiny, safe arithmetic language for the registry: launch geometry, restrictions, constraints.

Kernel Tuner keeps launch geometry and restrictions as expressions over the tunable
parameters; we do the same in kernels/variants.yaml, without handing YAML to eval(). Python's
integers have no size limit, so `9**9**9**9` would compute for ever: every value an expression
makes must stay within MAX_MAGNITUDE, a power is refused before it is computed when its result
could not, and the text and its nesting are bounded too.
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

MAX_MAGNITUDE = 2**63  # the registry computes sizes, counts and bytes: 64-bit integers hold them all
MAX_CHARS = 500  # the longest registry expression is ~60 characters
MAX_DEPTH = 32  # operators and calls nested in one another
_SHOWN_CHARS = 60


def evaluate(expression: str | int | float, names: dict, where: str = "expression"):
    """Evaluate an arithmetic/comparison expression over `names`; anything else, or a value beyond
    MAX_MAGNITUDE, is a ConfigError line naming `where` and the expression."""
    if isinstance(expression, (int, float)):
        return expression
    text = str(expression)
    if len(text) > MAX_CHARS:
        raise ConfigError(f"{where}: '{_shown(text)}' is {len(text):,} characters long; at most {MAX_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # ValueError: a literal of over 4300 digits
        raise ConfigError(f"{where}: cannot parse '{_shown(text)}'") from None
    try:
        return _eval(tree.body, names, where, text, 0)
    except OverflowError:  # a float beyond 1.8e308
        raise ConfigError(f"{where}: '{_shown(text)}' computes a number beyond 2**63") from None
    except (ArithmeticError, TypeError) as e:  # 1 / 0, min() of nothing
        raise ConfigError(f"{where}: '{_shown(text)}': {e}") from None


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _number(value, where, text):
    """`value` if it is a number within MAX_MAGNITUDE (an arithmetic operand or result); else one line."""
    if isinstance(value, str) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: '{_shown(text)}' does arithmetic on {value!r:.30}, which is not a number")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_MAGNITUDE:
        raise ConfigError(f"{where}: '{_shown(text)}' computes a number beyond 2**63")
    return value


def _power(base, exponent, where, text):
    """base ** exponent, refused before it is computed when an integer result would pass MAX_MAGNITUDE
    (its bit length is about the exponent times the base's)."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1 \
            and exponent * (abs(base).bit_length() - 1) > MAX_MAGNITUDE.bit_length():
        raise ConfigError(f"{where}: '{_shown(text)}' computes a number beyond 2**63")
    result = base ** exponent
    if isinstance(result, complex):  # a negative base to a fractional power
        raise ConfigError(f"{where}: '{_shown(text)}' computes a complex number")
    return result


def _eval(node, names, where, text, depth):
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: '{_shown(text)}' nests more than {MAX_DEPTH} operations")
    depth += 1
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return _number(node.value, where, text)
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ConfigError(f"{where}: unknown name '{node.id}' in '{_shown(text)}'")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _number(_eval(node.left, names, where, text, depth), where, text)
        right = _number(_eval(node.right, names, where, text, depth), where, text)
        if isinstance(node.op, ast.Pow):
            return _number(_power(left, right, where, text), where, text)
        return _number(_BINARY[type(node.op)](left, right), where, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_number(_eval(node.operand, names, where, text, depth), where, text)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, names, where, text, depth) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names, where, text, depth)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, names, where, text, depth)
            if type(op) not in _COMPARE or not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        args = [_number(_eval(a, names, where, text, depth), where, text) for a in node.args]
        return _number(_FUNCTIONS[node.func.id](*args), where, text)
    raise ConfigError(f"{where}: '{_shown(text)}' uses something other than arithmetic, comparisons, "
                      "ceil/floor/min/max")
