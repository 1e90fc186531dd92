"""What the report writes in a cell beyond a number (numbers are written by convsweep.base.numbers, as everywhere):
a setting's tunables, a named percent, `auto` for an axis left to its default, a spread, a dash for nothing."""
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


def named_percent(name: str, value: Any) -> str | None:
    return None if value is None else f"{name} {float(value):.0f}%"


def auto_text(value: Any) -> str:
    return "auto" if value is None else str(value)


def spread(fraction: Any) -> str | None:
    """A spread as percent with one decimal (text, so every database prints it alike)."""
    return None if fraction is None else f"{100 * float(fraction):.1f}"
