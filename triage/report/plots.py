"""Small SVG plots for the report, from plain lists and dicts (never torch).

Each function returns an `<svg>` element as a string, ready to inline in HTML: no XML header, no
metadata, text kept as <text> (matplotlib escapes it) in the page's own font, deterministic ids
(the same data gives the same bytes, so a re-render from report.json gives the same page). A figure
drawn before is taken from the figure cache (figure_cache.py); only a new one imports matplotlib
(drawing.py), so `triage report` re-renders a page in well under a second.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

from triage import speedups
from triage.report import carried, figure_cache
from triage.report.figures import Mark, Series, number, numbers, shorten


log = logging.getLogger(__name__)

_MAX_LABEL = 40  # a legend or axis label is shortened past this: a 200-character node id still fits
_MAX_SERIES = 24  # lines on one axis; more are left out of the plot (the tables list them all)

F = TypeVar("F", bound=Callable[..., Optional[str]])


def _plot(plot: F) -> F:
    """A plot drawn before comes from the figure cache (else from the page of the report being re-rendered,
    carried.py); a new one is drawn and kept there (neither where triage.speedups turns the cache off). A
    plot that cannot be drawn is left out (None) and logged; it never takes the report down."""

    @functools.wraps(plot)
    def drawn(*args, **kwargs):
        key = figure_cache.key(plot.__name__, args, kwargs)
        cached = speedups.active().figure_cache
        kept = (figure_cache.get(key) or carried.get(key)) if cached else None
        if kept is not None:
            return kept
        try:
            svg = plot(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (a figure is a nicety; the report is not)
            log.warning("plot %s left out: %s: %s", plot.__name__, type(exc).__name__, exc)
            return None
        if svg is not None and key is not None:
            svg = svg.replace("<svg ", f'<svg data-figure="{key}" ', 1)  # found again in the page (carried.py)
            if cached:
                figure_cache.put(key, svg)
        return svg
    return drawn  # type: ignore[return-value]


@_plot
def curves(series: Sequence[Series], title: str, *, xlabel: str = "step", ylabel: str = "",
           log_x: bool = False, log_y: Optional[bool] = None, hline: Optional[tuple[float, str]] = None,
           marks: Sequence[Mark] = (), wide: bool = False) -> Optional[str]:
    """Several series on one axis: a log y axis when `log_y`, or (None) when they span decades; the first
    non-finite step of each marked; `hline` (value, label) across, `marks` upright. A series equal to one
    drawn before it is drawn dashed over it and says so, so neither hides the other. `wide`: full width."""
    drawn = [s for s in series if s.values][:_MAX_SERIES]
    if not drawn:
        return None
    drawn = _tell_apart([dataclasses.replace(s, label=shorten(s.label, _MAX_LABEL)) for s in drawn])
    from triage.report import drawing  # matplotlib: only for a figure the cache does not hold

    return drawing.lines(drawn, title, ylabel, xlabel=xlabel, log_x=log_x, log_y=log_y, hline=hline, marks=marks,
                         size=(10.0, 3.0) if wide else (6.4, 2.7))


def loss_curves(series: Sequence[Series], title: str = "Training loss per step",
                ylabel: str = "loss", wide: bool = False) -> Optional[str]:
    """Several loss curves on one axis; log scale when they span decades; the first non-finite
    step of each marked. `wide`: a full-width figure."""
    return curves(series, title, ylabel=ylabel, wide=wide)


@_plot
def layer_bars(items: Sequence[tuple[str, Any]], title: str, xlabel: str, *, log: bool = False,
               limit: Optional[tuple[float, float]] = None, highlight_above: Optional[float] = None,
               max_rows: int = 60) -> Optional[str]:
    """One horizontal bar per layer (names read down the left), in model order. On a log axis a zero
    (a parameter that got no gradient) is written as a red 0 rather than dropped."""
    rows = [(shorten(str(name), 42), number(value)) for name, value in items]
    if not rows:
        return None
    if len(rows) > max_rows:  # evenly spaced, so depth order still reads top to bottom
        keep = sorted({round(i * (len(rows) - 1) / (max_rows - 1)) for i in range(max_rows)})
        title = f"{title} ({len(keep)} of {len(rows)})"
        rows = [rows[i] for i in keep]
    from triage.report import drawing

    return drawing.layer_bars(rows, title, xlabel, log=log, limit=limit, highlight_above=highlight_above)


@_plot
def index_bars(values: Sequence[Any], highlighted: Iterable[int], title: str, ylabel: str,
               xlabel: str = "item", highlight_above: Optional[float] = None) -> Optional[str]:
    """One bar per item (a snapshot batch, say); the highlighted ones red. A non-finite value has no bar:
    a red x at the top marks it, told apart from the highlighted ones."""
    ys = numbers(values)
    if not ys:
        return None
    flagged = set(highlighted or [])
    if highlight_above is not None:
        flagged |= {i for i, y in enumerate(ys) if math.isfinite(y) and y > highlight_above}
    from triage.report import drawing

    return drawing.index_bars(ys, flagged, title, ylabel, xlabel)


def _tell_apart(series: list[Series]) -> list[Series]:
    """A series that would be drawn over one before it (the same values, or closer than a line's width
    of the plot) is drawn in short dashes and says which it matches, so neither hides the other."""
    finite = [y for s in series for y in numbers(s.values) if math.isfinite(y)]
    span = max(finite) - min(finite) if finite else 0.0
    out: list[Series] = []
    for s in series:
        twin = next((o for o in out if _overlaps(o, s, span)), None)
        if twin is None:
            out.append(s)
            continue
        sign = "=" if list(numbers(s.values)) == list(numbers(twin.values)) else "≈"
        out.append(dataclasses.replace(s, twin_of=twin.label, label=f"{s.label} ({sign} {twin.label})"))
    return out


def _overlaps(a: Series, b: Series, span: float) -> bool:
    ya, yb = numbers(a.values), numbers(b.values)
    if len(ya) != len(yb) or (a.steps is None) != (b.steps is None) or (a.steps and list(a.steps) != list(b.steps)):
        return False
    # Under a pixel of a 300 px tall plot, on a linear axis and on a log one.
    return all((x != x and y != y) or (math.isinf(x) and x == y)
               or abs(x - y) <= min(2e-3 * span, 2e-3 * max(abs(x), abs(y))) for x, y in zip(ya, yb))
