"""What a figure is made of, shared by plots.py (which prepares it) and drawing.py (which draws it with
matplotlib): the report's colours, a line (`Series`), a vertical mark (`Mark`), numbers as report.json
carries them, and labels shortened to fit. No matplotlib here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

BASELINE = "#6b7280"
INTERVENTION = "#2563eb"
GOOD = "#059669"
BAD = "#dc2626"
ACCENT = "#d97706"
PALETTE = ["#2563eb", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9333ea"]


@dataclass(frozen=True)
class Mark:
    """A vertical line at x (the checkpoint's step, a learning rate), named in the legend."""

    x: float
    label: str
    color: str = BASELINE


@dataclass(frozen=True)
class Series:
    """One line: a label, y values per step (NaN/inf allowed), and how to draw it."""

    label: str
    values: Sequence[Any]
    steps: Optional[Sequence[Any]] = None
    color: str = INTERVENTION
    first_nonfinite: Optional[int] = None
    dashed: bool = False
    emphasis: bool = True
    twin_of: Optional[str] = None  # set by the plot: the label of an earlier series with the same values


def number(value: Any) -> float:
    """A float from a value as report.json carries it: NaN and inf arrive as strings."""
    if isinstance(value, bool) or value is None:
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("nan", "inf", "+inf", "infinity", "+infinity", "-inf", "-infinity"):
            return float(text.replace("infinity", "inf"))
        try:
            return float(text)
        except ValueError:
            return math.nan
    return math.nan


def numbers(values: Iterable[Any]) -> list[float]:
    return [number(v) for v in values or []]


def shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())  # no newlines or tabs inside a label
    return text if len(text) <= width else "…" + text[-(width - 1):]
