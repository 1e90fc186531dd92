"""How convsweep computes and writes a number: medians skip what was not measured, what JSON cannot hold (NaN,
Inf) is stored as null, and every table (the report's, `query`'s, `compare`'s) writes its numbers with the
formatters below, so one value reads the same wherever it is printed."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def median(values: Iterable[float | None] | None) -> float | None:
    """The median of the measured values (None entries skipped); None when there are none."""
    present = [v for v in values or () if v is not None]
    return statistics.median(present) if present else None


def middle(values: Iterable[float]) -> float:
    """The median of values that are all measured and at least one (ValueError otherwise): where a caller
    knows it has samples, a number, not a maybe."""
    present = list(values)
    if not present:
        raise ValueError("the median of no values")
    return statistics.median(present)


def finite(value: Any) -> float | None:
    """A number as JSON can hold it: unmeasurable or non-finite values become null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- written: each returns "" for None, except where a dash or None is the table's convention ----------------

def significant(value: Any) -> str:
    """Four significant digits, trailing zeros kept so a column reads evenly, never in exponent form
    (the report's times: 0.2032, 12.50, 1234)."""
    if value is None:
        return ""
    value = float(value)
    return f"{value:.0f}" if abs(value) >= 999.95 else f"{value:#.4g}"


def short(value: float, digits: int = 4) -> str:
    """A float to `digits` significant digits, positional where that stays short, else in exponent form
    (`query`'s cells: 0.2032, 1.235e+07); zero and non-finite values as Python writes them."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if -4 <= magnitude < 6:
        return f"{value:.{max(0, digits - 1 - magnitude)}f}"
    return f"{value:.{digits - 1}e}"


def fixed(value: Any, digits: int) -> str:
    """A number with `digits` decimals (accuracy: 0.9932)."""
    return "" if value is None else f"{float(value):.{digits}f}"


def percent(fraction: Any) -> str:
    """A fraction as a percent with one decimal, no sign (12.5)."""
    return "" if fraction is None else f"{100 * float(fraction):.1f}"


def signed_percent(ratio: float | None) -> str:
    """A ratio of B over A as the change it is, with its sign (1.052 -> +5.2%)."""
    return "" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def times(ratio: float | None, missing: str = "—") -> str:
    """A speedup to three significant digits, trailing zeros kept (1.30×, 12.2×, 124×)."""
    if ratio is None:
        return missing
    return f"{ratio:.{2 if ratio < 9.995 else 1 if ratio < 99.95 else 0}f}×"


def rounded_percent(fraction: Any) -> float | None:
    """A fraction as a percent rounded to one decimal, as a number (CSV tables)."""
    return None if fraction is None else round(100 * float(fraction), 1)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
