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
    """Walk the YAML event stream (iterative: no recursion, nothing built) and refuse nesting deeper than
    MAX_DEPTH or more than MAX_VALUES values once aliases are expanded. Returns None when it passes;
    raises LimitError naming the line otherwise. A syntax error is left to the parser, which says more."""
    depth, total = 0, 0
    sizes: dict[str, int] = {}  # anchor -> how many values it stands for
    open_collections: list[tuple[Optional[str], int]] = []  # (anchor, total when it opened)
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
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
    except yaml.YAMLError:
        return None
    return None


def check_node_count(nodes: int, candidates: int) -> None:
    if nodes + candidates > MAX_NODES:
        raise LimitError(f"expected at most {MAX_NODES:,} nodes and candidates, found {nodes:,} nodes and "
                         f"{candidates:,} candidates; split the playbook")
