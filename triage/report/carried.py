"""Figures that came with a report: the SVGs in the report.html beside a report.json, so that `triage
report` re-renders a report from another machine without drawing every figure again (4 s of matplotlib).

Each drawn figure carries its figure-cache key (`<svg data-figure="KEY" ...>`, plots.py). Such SVG goes
into the page unescaped, and this one arrived from elsewhere, so a figure is taken only when it is what
triage's drawing writes: matplotlib's few SVG elements and attributes, references inside the figure only
(`#id`), no script, event handler, external resource, entity, comment or CDATA section. Anything else is
drawn again, as it would be without it; this machine's figure cache is never written with it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator, Optional

log = logging.getLogger(__name__)

MAX_PAGE_BYTES = 64 * 2**20
MAX_FIGURE_BYTES = 2 * 2**20

_SVG = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_ELEMENTS = {f"{_SVG}{name}" for name in ("svg", "defs", "style", "g", "path", "use", "clipPath", "rect",
                                          "text", "tspan", "title")}
_ATTRIBUTES = {"class", "clip-path", "d", "height", "id", "role", "style", "transform", "type", "version",
               "viewBox", "width", "x", "y", "data-figure", _XLINK_HREF}
_FIGURE = re.compile(r'<svg data-figure="([0-9a-f]{64})"[^<>]*>.*?</svg>', re.S)
_URL = re.compile(r"url\(\s*([^)]*)\)", re.I)
_STYLE_TEXT = re.compile(r"[\w\s*{}:;#.,%()'-]*")

_carried: dict[str, str] = {}


@contextlib.contextmanager
def figures_from(page: Path) -> Iterator[None]:
    """While inside: the figures of `page` (a report.html) are offered to plots.py; none if it is
    missing, unreadable or too large."""
    global _carried
    _carried = _read(page)
    try:
        yield
    finally:
        _carried = {}


def get(key: Optional[str]) -> Optional[str]:
    """The carried figure of `key`, if there is one and it passes the check."""
    svg = _carried.get(key) if key else None
    if svg is None:
        return None
    if not is_plain_figure(svg):
        log.warning("a figure in the report's page is not one triage draws; it is drawn again")
        return None
    return svg


def is_plain_figure(svg: str) -> bool:
    """`svg` is one <svg> of the elements and attributes matplotlib writes, referring only within itself."""
    if len(svg) > MAX_FIGURE_BYTES or "<!" in svg or "<?" in svg:
        return False
    try:
        root = ET.fromstring(svg)
    except ET.ParseError:
        return False
    for element in root.iter():
        if element.tag not in _ELEMENTS:
            return False
        for name, value in element.attrib.items():
            if name not in _ATTRIBUTES:  # no event handler (onload=...) among them
                return False
            if name == _XLINK_HREF and not value.startswith("#"):
                return False
            if any(not target.strip("'\" ").startswith("#") for target in _URL.findall(value)):
                return False
        if element.tag == f"{_SVG}style" and (len(element) or not _STYLE_TEXT.fullmatch(element.text or "")
                                                or "url" in (element.text or "").lower()):
            return False
    return True


def _read(page: Path) -> dict[str, str]:
    try:
        if not page.is_file() or page.stat().st_size > MAX_PAGE_BYTES:
            return {}
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    return {m.group(1): m.group(0) for m in _FIGURE.finditer(text)}
