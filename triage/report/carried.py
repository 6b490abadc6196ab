"""Figures that came with a report: the SVGs in the report.html beside a report.json, so that `triage
report` re-renders a report from another machine without drawing every figure again (matplotlib's
import and a few dozen plots: seconds).

Each drawn figure carries its figure-cache key (`<svg data-figure="KEY" ...>`, plots.py). Such SVG goes
into the page unescaped, and this one arrived from elsewhere, so a figure is taken only when it is what
triage's drawing writes: matplotlib's few SVG elements and attributes, each attribute's value of the form
matplotlib gives it, style declarations of plain values only (no url(), image-set() or CSS escape),
references by `#id` only, and no entity, comment or CDATA section. Anything else is drawn again, as it
would be without it; this machine's figure cache is never written with it. Every report page also
forbids itself from loading or running anything (its Content-Security-Policy).
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
MAX_FIGURE_CHARS = 2 * 2**20

_SVG = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_ELEMENTS = {f"{_SVG}{name}" for name in ("svg", "defs", "style", "g", "path", "use", "clipPath", "rect", "text")}
_STYLE_ELEMENT = "*{stroke-linejoin: round; stroke-linecap: butt}"  # the one <style> matplotlib writes
_NUMBERS = r"[\d\s.,eE+-]*(px|pt|%)?"
_VALUES = {name: re.compile(pattern) for name, pattern in {  # each attribute's values, whole
    "class": r"[\w -]*", "id": r"[\w.-]*", "role": r"img", "type": r"text/css", "version": r"[\d.]+",
    "viewBox": _NUMBERS, "width": _NUMBERS, "height": _NUMBERS, "x": _NUMBERS, "y": _NUMBERS,
    "d": r"[MLHVCSQTAZmlhvcsqtaz\d\s.,eE+-]*", "transform": r"[a-z\d\s().,eE+-]*",
    "clip-path": r"url\(#[\w.-]+\)", _XLINK_HREF: r"#[\w.-]+", "data-figure": r"[0-9a-f]{64}",
}.items()}
# Inside style="...": these properties only, with plain values (no parenthesis, quote, backslash, slash:
# no url(), image-set() or CSS escape).
_PROPERTIES = {"fill", "fill-opacity", "font-family", "font-size", "font-style", "font-weight", "max-width",
               "opacity", "stroke", "stroke-dasharray", "stroke-dashoffset", "stroke-linecap", "stroke-linejoin",
               "stroke-miterlimit", "stroke-opacity", "stroke-width", "text-anchor"}
_PLAIN_VALUE = re.compile(r"[#\w.,% -]*")
_OPENING = re.compile(r'<svg data-figure="([0-9a-f]{64})"')
_CLOSING = "</svg>"

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
    """`svg` is one <svg> of only the elements, attributes and style values matplotlib writes."""
    if len(svg) > MAX_FIGURE_CHARS or "<!" in svg or "<?" in svg:  # no DOCTYPE, entity, comment, CDATA
        return False
    try:
        root = ET.fromstring(svg)
    except ET.ParseError:
        return False
    for element in root.iter():
        if element.tag not in _ELEMENTS:
            return False
        if element.tag == f"{_SVG}style" and (len(element) or element.text != _STYLE_ELEMENT):
            return False
        for name, value in element.attrib.items():  # no event handler (onload=...) among the names
            if name == "style":
                if not all(_plain_declaration(d) for d in value.split(";") if d.strip()):
                    return False
            elif name not in _VALUES or not _VALUES[name].fullmatch(value):
                return False
    return True


def _plain_declaration(declaration: str) -> bool:
    name, colon, value = declaration.partition(":")
    return bool(colon) and name.strip() in _PROPERTIES and bool(_PLAIN_VALUE.fullmatch(value))


def _read(page: Path) -> dict[str, str]:
    try:
        if not page.is_file() or page.stat().st_size > MAX_PAGE_BYTES:
            return {}
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    figures: dict[str, str] = {}
    closings = [m.end() for m in re.finditer(re.escape(_CLOSING), text)]
    i = 0
    for opening in _OPENING.finditer(text):  # each with the first </svg> after it: one pass over the page
        while i < len(closings) and closings[i] <= opening.start():
            i += 1
        if i == len(closings):
            break
        figures.setdefault(opening.group(1), text[opening.start():closings[i]])
    return figures
