"""How big a playbook may be, checked before it is parsed into Python objects.

A playbook is small: the default one is about 40 KiB, 90 nodes and 10 levels of YAML nesting. The
limits leave teams two orders of magnitude of room and keep a hostile or broken file from exhausting
the stack (deep nesting), the memory (YAML aliases that expand exponentially) or the time (a graph
of 100,000 nodes) before it is refused with a message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml

MAX_BYTES = 2 * 2**20  # the file
MAX_DEPTH = 64  # nested YAML mappings and sequences
MAX_VALUES = 200_000  # YAML values, counting each alias as the values it repeats
MAX_NODES = 2_000  # nodes of the graph, plus the candidates of its differential nodes


class LimitError(ValueError):
    """The playbook is over one of the limits; the message says which, and by how much."""


def read_text(path: Path) -> str:
    """The playbook's text, refusing a file over MAX_BYTES or one that is not UTF-8."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise LimitError(f"expected a playbook of at most {MAX_BYTES // 2**20} MiB, found a larger file; "
                         "split it, or move data out of it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LimitError(f"expected UTF-8 text, found a byte that is not (at offset {exc.start}); "
                         "save the playbook as UTF-8") from None


def check_yaml(text: str) -> Optional[int]:
    """Refuse nesting deeper than MAX_DEPTH or more than MAX_VALUES values once aliases are expanded, with
    triage's own message naming the line, whatever the YAML library does: libyaml (PyYAML >= 6.0.4) refuses
    flow nesting past 1000 levels itself, as a syntax error. Returns None when it passes; a syntax error is
    left to the parser, which says more."""
    for loader in _LOADERS:
        try:
            _walk_events(text, loader)
            return None
        except yaml.YAMLError:
            continue  # the pure-Python parser next: it has no nesting limit of its own
    depth, line = _flow_depth(text)
    if depth > MAX_DEPTH:
        raise LimitError(f"line {line}: expected YAML nested at most {MAX_DEPTH} levels deep, found deeper; flatten it")
    return None


_LOADERS = tuple(dict.fromkeys((getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader)))


def _walk_events(text: str, loader: type) -> None:
    """Walk the YAML event stream (iterative: no recursion, nothing built), counting depth and values."""
    depth, total = 0, 0
    sizes: dict[str, int] = {}  # anchor -> how many values it stands for
    open_collections: list[tuple[Optional[str], int]] = []  # (anchor, total when it opened)
    for event in yaml.parse(text, Loader=loader):
        line = event.start_mark.line + 1 if event.start_mark else "?"
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise LimitError(f"line {line}: expected YAML nested at most {MAX_DEPTH} levels deep, "
                                 "found deeper; flatten it")
            open_collections.append((event.anchor, total))
            total += 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            anchor, opened_at = open_collections.pop()
            if anchor:
                sizes[anchor] = total - opened_at
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            total += sizes.get(event.anchor, 1)
        if total > MAX_VALUES:
            raise LimitError(f"line {line}: expected at most {MAX_VALUES:,} YAML values (aliases "
                             "expanded), found more; a playbook this large is not a flowchart a person "
                             "can read (or its aliases repeat themselves exponentially)")


def _flow_depth(text: str) -> tuple[int, int]:
    """The deepest nesting of flow brackets ([ and {) outside quotes and comments, and the line where it
    first passes MAX_DEPTH (or where it peaks): a measure that needs no YAML parser."""
    depth = deepest = 0
    line = at = 1
    quote = ""
    comment = False
    previous = "\n"
    for char in text:
        if char == "\n":
            line += 1
            comment = False
        elif comment:
            pass
        elif quote:
            if char == quote and not (quote == '"' and previous == "\\"):
                quote = ""
        elif char in "'\"" and previous in " \t\n[{,:":
            quote = char
        elif char == "#" and previous in " \t\n":
            comment = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest <= MAX_DEPTH + 1:
                    at = line
        elif char in "]}":
            depth = max(0, depth - 1)
        previous = char
    return deepest, at


def check_node_count(nodes: int, candidates: int) -> None:
    if nodes + candidates > MAX_NODES:
        raise LimitError(f"expected at most {MAX_NODES:,} nodes and candidates, found {nodes:,} nodes and "
                         f"{candidates:,} candidates; split the playbook")
