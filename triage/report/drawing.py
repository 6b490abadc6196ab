"""Drawing the report's plots with matplotlib: the only module that imports it.

plots.py prepares the data (figures.py: colours, lines, marks) and asks for a drawing only when the figure cache (figure_cache.py) does not
already hold it, so re-rendering a report whose figures were drawn before never imports matplotlib (1.2 s
on a small machine). Text stays <text> (matplotlib escapes it) in the page's own font; ids are
deterministic (the same data gives the same bytes).
"""

from __future__ import annotations

import io
import math
import re
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
from matplotlib import ticker  # noqa: E402  (after the backend is chosen)
from matplotlib.figure import Figure  # noqa: E402  (no pyplot: no global figure state, nothing to close)

from triage.report.figures import ACCENT, BAD, INTERVENTION, Mark, Series, numbers, shorten  # noqa: E402

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


def lines(drawn: Sequence[Series], title: str, ylabel: str, *, xlabel: str, log_x: bool, log_y: Optional[bool],
          hline: Optional[tuple[float, str]], marks: Sequence[Mark], size: tuple[float, float]) -> str:
    """Series (already shortened and told apart by plots.py) on one axis."""
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
            ax.axvline(mark.x, color=mark.color, linestyle="--", linewidth=1.2, label=shorten(mark.label, 60))
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


def layer_bars(rows: Sequence[tuple[str, float]], title: str, xlabel: str, *, log: bool,
               limit: Optional[tuple[float, float]], highlight_above: Optional[float]) -> str:
    """One horizontal bar per (already shortened) name, first at the top."""
    names = [name for name, _ in rows]
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
        for yi, v in enumerate(values):
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


def index_bars(ys: Sequence[float], flagged: set[int], title: str, ylabel: str, xlabel: str) -> str:
    """One bar per item, the flagged ones red; a non-finite value a red x at the top instead of a bar."""
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
