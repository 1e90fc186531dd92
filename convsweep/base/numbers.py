"""The two small rules every number convsweep reports follows: medians skip what was not
measured, and what JSON cannot hold (NaN, Inf) is stored as null."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def median(values: Iterable[float | None] | None) -> float | None:
    """The median of the measured values (None entries skipped); None when there are none."""
    present = [v for v in values or () if v is not None]
    return statistics.median(present) if present else None


def finite(value: Any) -> float | None:
    """A number as JSON can hold it: unmeasurable or non-finite values become null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
