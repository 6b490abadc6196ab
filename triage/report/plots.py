"""Small SVG plots for the report, from plain lists and dicts (never torch).

Each function returns an `<svg>` element as a string, ready to inline in HTML: no XML header, no
metadata, text kept as <text> (matplotlib escapes it) in the page's own font, deterministic ids
(the same data gives the same bytes, so a re-render from report.json gives the same page).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

import matplotlib

matplotlib.use("Agg")
from matplotlib import ticker  # noqa: E402  (after the backend is chosen)
from matplotlib.figure import Figure  # noqa: E402  (no pyplot: no global figure state, nothing to close)

BASELINE = "#6b7280"
INTERVENTION = "#2563eb"
GOOD = "#059669"
BAD = "#dc2626"
ACCENT = "#d97706"
PALETTE = ["#2563eb", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9333ea"]

log = logging.getLogger(__name__)

_MAX_POINTS = 600  # a line longer than this is reduced to a min/max envelope: spikes stay visible
_STYLE = {
    "svg.fonttype": "none",  # text stays text: small, selectable, in the page's font
    "text.parse_math": False,  # a module name with '$' is a name, not TeX
    "text.usetex": False,
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # matplotlib's bundled font: metrics only, the page's font draws
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9ca3af",
    "axes.labelcolor": "#374151",
    "axes.titlesize": 9.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.grid": True,
    "grid.color": "#e5e7eb",
    "grid.linewidth": 0.6,
    "xtick.color": "#4b5563",
    "ytick.color": "#4b5563",
    "legend.frameon": False,
    "legend.fontsize": 8.5,
    "lines.linewidth": 1.5,
}


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


_MAX_LABEL = 40  # a legend or axis label is shortened past this: a 200-character node id still fits
_MAX_SERIES = 24  # lines on one axis; more are left out of the plot (the tables list them all)

F = TypeVar("F", bound=Callable[..., Optional[str]])


def _never_raises(plot: F) -> F:
    """A plot that cannot be drawn is left out (None) and logged; it never takes the report down."""

    @functools.wraps(plot)
    def drawn(*args, **kwargs):
        try:
            return plot(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (a figure is a nicety; the report is not)
            log.warning("plot %s left out: %s: %s", plot.__name__, type(exc).__name__, exc)
            return None
    return drawn  # type: ignore[return-value]


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


@_never_raises
def curves(series: Sequence[Series], title: str, *, xlabel: str = "step", ylabel: str = "",
           log_x: bool = False, log_y: Optional[bool] = None, hline: Optional[tuple[float, str]] = None,
           marks: Sequence[Mark] = (), wide: bool = False) -> Optional[str]:
    """Several series on one axis: a log y axis when `log_y`, or (None) when they span decades; the first
    non-finite step of each marked; `hline` (value, label) across, `marks` upright. A series equal to one
    drawn before it is drawn dashed over it and says so, so neither hides the other. `wide`: full width."""
    return _lines(series, title, ylabel, xlabel=xlabel, log_x=log_x, log_y=log_y, hline=hline, marks=marks,
                  size=(10.0, 3.0) if wide else (6.4, 2.7))


def loss_curves(series: Sequence[Series], title: str = "Training loss per step",
                ylabel: str = "loss", wide: bool = False) -> Optional[str]:
    """Several loss curves on one axis; log scale when they span decades; the first non-finite
    step of each marked. `wide`: a full-width figure."""
    return curves(series, title, ylabel=ylabel, wide=wide)


@_never_raises
def layer_bars(items: Sequence[tuple[str, Any]], title: str, xlabel: str, *, log: bool = False,
               limit: Optional[tuple[float, float]] = None, highlight_above: Optional[float] = None,
               max_rows: int = 60) -> Optional[str]:
    """One horizontal bar per layer (names read down the left), in model order. On a log axis a zero
    (a parameter that got no gradient) is written as a red 0 rather than dropped."""
    rows = [(str(name), number(value)) for name, value in items]
    if not rows:
        return None
    if len(rows) > max_rows:  # evenly spaced, so depth order still reads top to bottom
        keep = sorted({round(i * (len(rows) - 1) / (max_rows - 1)) for i in range(max_rows)})
        title = f"{title} ({len(keep)} of {len(rows)})"
        rows = [rows[i] for i in keep]
    names = [_shorten(n, 42) for n, _ in rows]
    values = [v if math.isfinite(v) else math.nan for _, v in rows]
    positive = [v for v in values if v == v and v > 0]
    use_log = log and bool(positive) and max(positive) / min(positive) > 10
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(6.4, 0.75 + 0.2 * len(rows)))
        ax = fig.subplots()
        colors = [BAD if highlight_above is not None and v == v and v > highlight_above else INTERVENTION
                  for v in values]
        y = list(range(len(rows)))
        base = min(positive) / 3 if use_log else 0.0
        drawn = [v - base if v == v and (v > 0 or not use_log) else 0.0 for v in values]
        ax.barh(y, drawn, left=base, color=colors, height=0.65)
        for yi, (v, (_, raw)) in enumerate(zip(values, rows)):
            if v != v or (log and v <= 0):  # `log`: a gradient norm, where 0 means none at all
                ax.annotate("NaN" if v != v else "0", xy=(0, yi), xycoords=("axes fraction", "data"),
                            xytext=(3, 0), textcoords="offset points", va="center", color=BAD, fontsize=8)
        ax.set_yticks(y, names)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # first layer at the top
        ax.grid(axis="y", visible=False)
        if use_log:
            _log(ax, "x")
        if limit:
            ax.set_xlim(*limit)
        ax.set_xlabel(xlabel)
        _title(ax, title)
        _margins(fig, left_pt=14 + 5.2 * max(len(n) for n in names), right_pt=14, bottom_pt=32, top_pt=20)
        return _svg(fig, f"bars-{title}")


@_never_raises
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
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(6.4, 2.5))
        ax = fig.subplots()
        finite = [y if math.isfinite(y) else 0.0 for y in ys]
        ax.bar(range(len(ys)), finite, color=[BAD if i in flagged else INTERVENTION for i in range(len(ys))],
               width=0.75)
        for i, y in enumerate(ys):
            if not math.isfinite(y):
                ax.plot([i], [1], marker="x", color=BAD, markersize=7, mew=2, transform=ax.get_xaxis_transform(),
                        clip_on=False)
        positive = [y for y in finite if y > 0]
        if positive and len(positive) == len(finite) and max(positive) / min(positive) > 30:
            _log(ax, "y")
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _title(ax, title)
        _margins(fig, left_pt=58, right_pt=10)
        return _svg(fig, f"bars-index-{title}")


def _lines(series: Sequence[Series], title: str, ylabel: str, *, xlabel: str = "step", log_x: bool = False,
           log_y: Optional[bool] = None, hline: Optional[tuple[float, str]] = None, marks: Sequence[Mark] = (),
           size: tuple[float, float] = (6.4, 2.7)) -> Optional[str]:
    drawn = [s for s in series if s.values][:_MAX_SERIES]
    if not drawn:
        return None
    drawn = _tell_apart([dataclasses.replace(s, label=_shorten(s.label, _MAX_LABEL)) for s in drawn])
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=size)
        ax = fig.subplots()
        everything: list[float] = []
        for s in drawn:
            ys = numbers(s.values)
            xs = numbers(s.steps) if s.steps is not None and len(s.steps) == len(ys) else list(range(len(ys)))
            xs, ys = _envelope(xs, ys)
            shown = [y if math.isfinite(y) else math.nan for y in ys]
            everything += [y for y in shown if y == y]
            # A twin is drawn in short dashes over the line it equals, whose colour shows through the gaps.
            ax.plot(xs, shown, color=s.color, label=s.label,
                    linestyle=(0, (2, 3)) if s.twin_of else (0, (4, 3)) if s.dashed else "-",
                    linewidth=1.8 if s.emphasis else 1.2, alpha=1.0 if s.emphasis else 0.85,
                    marker="o" if len(xs) <= 3 else None, markersize=3)
            if s.first_nonfinite is not None:
                ax.axvline(s.first_nonfinite, color=s.color, linestyle=":", linewidth=1.2)
                ax.annotate(f"non-finite at step {s.first_nonfinite}", xy=(s.first_nonfinite, 1),
                            xycoords=("data", "axes fraction"), xytext=(-4, -10), textcoords="offset points",
                            ha="right", color=BAD, fontsize=8.5)
                ax.plot([s.first_nonfinite], [1], marker="x", color=BAD, markersize=7, mew=2,
                        transform=ax.get_xaxis_transform(), clip_on=False)
        shown_marks = [m for m in marks if math.isfinite(m.x) and (not log_x or m.x > 0)]
        for mark in shown_marks:
            ax.axvline(mark.x, color=mark.color, linestyle="--", linewidth=1.2, label=_shorten(mark.label, 60))
        if hline is not None:
            ax.axhline(hline[0], color=ACCENT, linestyle="--", linewidth=1, label=hline[1])
        labels = [s.label for s in drawn] + [m.label for m in shown_marks] + ([hline[1]] if hline else [])
        legend_pt = 0.0
        if len(labels) > 1:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
            legend_pt = 34 + 5.0 * max(len(label) for label in labels)
        _margins(fig, left_pt=58, right_pt=10 + legend_pt)
        positive = [y for y in everything if y > 0]
        spans = bool(positive) and len(positive) == len(everything) and max(positive) / min(positive) > 30.0
        if log_y or (log_y is None and spans):
            _log(ax, "y")
        if log_x:
            _log(ax, "x")
        else:
            ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=xlabel == "step"))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _title(ax, title)
        return _svg(fig, f"lines-{title}-{'|'.join(s.label for s in drawn)}")


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


def _margins(fig, left_pt: float, right_pt: float, bottom_pt: float = 30, top_pt: float = 18) -> None:
    """Fixed margins in points (tight_layout would draw the figure a second time: twice the cost).
    Margins wider than 60% of the figure are scaled down so the axes always keep 40% of it (long names
    are shortened before they get here; this keeps any other size from inverting the axes)."""
    width, height = fig.get_figwidth() * 72, fig.get_figheight() * 72
    if left_pt + right_pt > 0.6 * width:
        scale = 0.6 * width / (left_pt + right_pt)
        left_pt, right_pt = left_pt * scale, right_pt * scale
    if bottom_pt + top_pt > 0.6 * height:
        scale = 0.6 * height / (bottom_pt + top_pt)
        bottom_pt, top_pt = bottom_pt * scale, top_pt * scale
    fig.subplots_adjust(left=left_pt / width, right=1 - right_pt / width, bottom=bottom_pt / height,
                        top=1 - top_pt / height)


def _title(ax, title: str) -> None:
    """The title at a fixed height: left to itself matplotlib measures every tick label to place it, which
    was half the cost of a plot."""
    ax.set_title(title, y=1.0, pad=4)


def _log(ax, which: str) -> None:
    """A log axis with plain tick labels (1000, 0.01): matplotlib's default ones are TeX, kept off here."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(ticker.NullLocator())  # minor ticks cost as much as the rest of the plot


def _envelope(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """Keep at most _MAX_POINTS points: each bucket's min and max, so a one-step spike survives."""
    if len(ys) <= _MAX_POINTS:
        return xs, ys
    size = math.ceil(len(ys) / (_MAX_POINTS // 2))
    out_x, out_y = [], []
    for i in range(0, len(ys), size):
        bucket = list(range(i, min(i + size, len(ys))))
        finite = [j for j in bucket if math.isfinite(ys[j])]
        if not finite:
            out_x.append(xs[bucket[0]])
            out_y.append(math.nan)
            continue
        lo, hi = min(finite, key=ys.__getitem__), max(finite, key=ys.__getitem__)
        for j in sorted({lo, hi}):
            out_x.append(xs[j])
            out_y.append(ys[j])
    return out_x, out_y


def _value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> Optional[float]:
    pairs = [(abs(a - x), b) for a, b in zip(xs, ys) if math.isfinite(b)]
    if not pairs:
        return None
    distance, value = min(pairs, key=lambda p: p[0])
    return value if distance <= 1 else None


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())  # no newlines or tabs inside a label
    return text if len(text) <= width else "…" + text[-(width - 1):]


_HEADER = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
_SIZE = re.compile(r'(<svg[^>]*?) width="[\d.]+pt" height="[\d.]+pt"')
_FONT = re.compile(r"font-family: [^;\"]+")
_PATH_DATA = re.compile(r'(\sd=")([^"]*)(")')
_LONG_DECIMAL = re.compile(r"(\d+\.\d{2})\d+")


def _svg(fig, key: str) -> str:
    """The figure as an inline <svg>: it scales to its container's width."""
    buffer = io.StringIO()
    # A salt per figure keeps ids (clip paths, markers) unique across the page yet stable across renders.
    with matplotlib.rc_context({"svg.hashsalt": f"triage-{key}"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = _HEADER.sub("", buffer.getvalue(), count=1)
    text = _METADATA.sub("", text, count=1)
    # No fixed size: it scales to its container, up to its natural width (pt to CSS px).
    natural = round(fig.get_figwidth() * 96)
    text = _SIZE.sub(rf'\1 class="plot" role="img" style="max-width: {natural}px"', text, count=1)
    text = _FONT.sub("font-family: inherit", text)
    # Path coordinates to 0.01 pt: a third of the bytes, no visible difference.
    text = _PATH_DATA.sub(lambda m: m.group(1) + _LONG_DECIMAL.sub(r"\1", m.group(2)) + m.group(3), text)
    return text.strip()
