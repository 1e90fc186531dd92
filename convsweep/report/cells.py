"""How the report writes a value in a cell: significant digits, percents, ratios (1.30×), a setting's tunables,
and a dash or nothing for None."""
from __future__ import annotations

from typing import Any

from convsweep.sweep.config import tunables_text


NO_VALUE = "—"


def tunables(params: dict[str, dict]) -> str:
    """A run's tunables: 'BLOCK=64' when every layer has the same, else per layer as config says them."""
    values = list(params.values())
    if values and all(v == values[0] for v in values):
        return ",".join(f"{k}={v}" for k, v in values[0].items()) or "defaults"
    return tunables_text(params)


def _number(value: Any) -> str:
    """Four significant digits, trailing zeros kept so a column reads evenly, never in exponent form."""
    if value is None:
        return ""
    value = float(value)
    return f"{value:.0f}" if abs(value) >= 999.95 else f"{value:#.4g}"


def _percent(fraction: Any) -> str:
    return "" if fraction is None else f"{100 * float(fraction):.1f}"


def _fixed(value: Any, digits: int) -> str:
    return "" if value is None else f"{float(value):.{digits}f}"


def _times(ratio: float | None) -> str:
    """Three significant digits, trailing zeros kept (1.30×, 12.2×, 124×)."""
    if ratio is None:
        return NO_VALUE
    return f"{ratio:.{2 if ratio < 9.995 else 1 if ratio < 99.95 else 0}f}×"


def _pct(name: str, value: Any) -> str | None:
    return None if value is None else f"{name} {float(value):.0f}%"


def _text(value: Any) -> str:
    return "auto" if value is None else str(value)


def _round_percent(fraction: Any) -> float | None:
    return None if fraction is None else round(100 * float(fraction), 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _spread(fraction: Any) -> str | None:
    """A spread as percent with one decimal (text, so every database prints it alike)."""
    return None if fraction is None else f"{100 * float(fraction):.1f}"
