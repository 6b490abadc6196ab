"""Drawn figures kept by what they show, so a report re-rendered from report.json need not draw them again.

A figure's key is a hash of the plot function, its arguments and the drawing code itself (plots.py,
drawing.py and matplotlib's version): the same key is the same bytes, and changing how a plot is drawn
retires every key drawn the old way. Kept in the user's own cache (`$TRIAGE_CACHE/figures`, see
triage/user_cache.py), never in a report folder: the SVG goes into the page unescaped, so only figures
this user's triage drew are kept here, never ones that arrived with somebody's report (those are checked
each time they are used, carried.py). A cache that cannot be read or written is passed over: a figure is
then drawn, as if never kept.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

from triage import atomic, user_cache

log = logging.getLogger(__name__)

MAX_BYTES = 64 * 2**20  # past this the least recently used figures go, down to three quarters of it


def key(plot: str, args: tuple, kwargs: dict[str, Any]) -> Optional[str]:
    """The figure's key, or None where an argument has no stable text form (then it is not kept)."""
    try:
        text = json.dumps([plot, _drawing_version(), args, kwargs], default=_plain, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def get(figure_key: Optional[str]) -> Optional[str]:
    if figure_key is None:
        return None
    path = _folder() / f"{figure_key}.svg"
    try:
        svg = path.read_text(encoding="utf-8")
        os.utime(path)  # recently used: kept longest when the cache is trimmed
    except OSError:
        return None
    return svg if svg.startswith("<svg") and svg.endswith("</svg>") else None


def put(figure_key: Optional[str], svg: str) -> None:
    if figure_key is None:
        return
    try:
        folder = _folder()
        folder.mkdir(parents=True, exist_ok=True)
        atomic.write_text(folder / f"{figure_key}.svg", svg)
        _trim_once(folder)
    except OSError as exc:
        log.debug("figure not kept in the cache: %s", exc)


def _folder() -> Path:
    return user_cache.root() / "figures"


@functools.cache
def _drawing_version() -> str:
    here = Path(__file__).parent
    code = b"".join((here / name).read_bytes() for name in ("figures.py", "plots.py", "drawing.py"))
    try:
        matplotlib = importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:
        matplotlib = "?"
    return f"{hashlib.sha256(code).hexdigest()[:16]}-matplotlib-{matplotlib}"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} has no stable text form")


@functools.cache  # once per process: a walk or a re-render puts at most a few dozen figures
def _trim_once(folder: Path) -> None:
    kept = sorted(((stat.st_mtime, stat.st_size, path) for path in folder.glob("*.svg")
                   for stat in [path.stat()]), reverse=True)
    total = sum(size for _, size, _ in kept)
    if total <= MAX_BYTES:
        return
    while kept and total > MAX_BYTES * 3 // 4:
        _, size, oldest = kept.pop()  # the least recently used
        oldest.unlink(missing_ok=True)
        total -= size
