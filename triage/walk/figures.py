"""Figures as a decision shows them beside its node."""

from __future__ import annotations

import math
from typing import Any


def shown(value: Any) -> Any:
    """A figure small enough to show beside a node: numbers rounded, long lists summarised."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else str(value)
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} items]"
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
