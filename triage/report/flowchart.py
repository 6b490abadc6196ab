"""A layered layout of the playbook's flowchart, with the walked path marked.

This module only computes geometry (plain dataclasses); `templates/flowchart.svg.j2` draws it,
so every name from the playbook goes through jinja's autoescape. Layout: layers by longest path
from the entry (networkx topological generations), long edges routed through invisible dummy
points, crossings reduced by barycenter sweeps, x positions pulled toward neighbours.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional

import networkx as nx

from triage.report.model import Report
from triage.report import labels

NODE_W = 184  # a walked node: room for its figures
OTHER_W = 144  # a node the walk did not visit: its name only
LEAF_W = 168  # diagnosis ids run to 23 characters
DUMMY_W = 6
GAP_X = 16
DUMMY_GAP = 6
RUN_H = 40
LEAF_H = 32
FIGURE_LINE = 13
LABEL_LINE = 12
LABEL_CHARS = 34
MARGIN = 12
# The whole chart fits the page's width, but never shrinks below this scale (it scrolls instead): a wide
# playbook squeezed to a page drew its 11-unit text at under 2 px, unreadable, and the browser's rounding
# of glyphs that small pushed labels out of their boxes.
LEAST_SCALE = 0.6


@dataclass
class Box:
    id: str
    kind: str  # "run" | "leaf" | "dummy"
    label: str = ""
    title: Optional[str] = None
    walked: bool = False
    reached: bool = False  # the leaf the walk ended on
    step: Optional[int] = None  # 1-based position on the path
    anchor: Optional[str] = None  # where in the page its evidence is
    figures: list[str] = field(default_factory=list)
    x: float = 0.0  # centre
    y: float = 0.0  # top
    w: float = NODE_W
    h: float = RUN_H

    @property
    def left(self) -> float:
        return self.x - self.w / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h


@dataclass
class Edge:
    source: str
    target: str
    labels: list[str]
    taken: bool
    taken_label: list[str]  # wrapped lines of the condition that held ("otherwise" when none did)
    d: str = ""  # SVG path data
    label_x: float = 0.0
    label_y: float = 0.0
    label_w: float = 0.0


@dataclass
class Layout:
    width: float
    height: float
    boxes: list[Box]
    edges: list[Edge]

    @property
    def nodes(self) -> list[Box]:
        return [b for b in self.boxes if b.kind != "dummy"]

    @property
    def least_width(self) -> float:
        """The narrowest the whole chart is drawn, in page pixels (LEAST_SCALE of its own width)."""
        return LEAST_SCALE * self.width

    @property
    def focus(self) -> tuple[float, float, float]:
        """(left, width, height) of the part of the chart that holds the walked nodes, with room for their
        edges' labels: what is drawn again at full size."""
        walked = [b for b in self.nodes if b.walked] or self.nodes
        left = max(0.0, min(b.left for b in walked) - 4 * MARGIN)
        right = min(self.width, max(b.left + b.w for b in walked) + 4 * MARGIN)
        bottom = min(self.height, max(b.bottom for b in walked) + 2 * MARGIN)
        return round(left, 1), round(right - left, 1), round(bottom, 1)


def layout(report: Report, anchors: Optional[dict[str, str]] = None) -> Layout:
    """The flowchart of `report` placed for drawing; `anchors` maps node ids to page anchors."""
    anchors = anchors or {}
    graph = nx.DiGraph()
    for node in report.flowchart.nodes:
        graph.add_node(node.id)
    for edge in report.flowchart.edges:
        graph.add_edge(edge.source, edge.target)
    walked_edges = {(d.node, d.goto): d for d in report.decisions}
    boxes = _boxes(report, anchors)
    layers = _layers(graph, report.path[0] if report.path else None)
    chain = _route(graph, layers, boxes)
    _order(chain, layers, report)
    edges = [Edge(source=e.source, target=e.target, labels=list(e.labels),
                  taken=(e.source, e.target) in walked_edges,
                  taken_label=_wrap(walked_edges[(e.source, e.target)].when or "otherwise")
                  if (e.source, e.target) in walked_edges else [])
             for e in report.flowchart.edges]
    gaps = _layer_gaps(layers, edges, boxes)
    width, height = _place(layers, chain, boxes, gaps)
    for edge in edges:
        _draw_edge(edge, chain[(edge.source, edge.target)], boxes)
    # Taken edges last, so they draw over the grey ones.
    edges.sort(key=lambda e: e.taken)
    return Layout(width=width, height=height, boxes=[b for layer in layers for b in (boxes[i] for i in layer)],
                  edges=edges)


def _boxes(report: Report, anchors: dict[str, str]) -> dict[str, Box]:
    position = {node: i + 1 for i, node in enumerate(report.path)}
    figures = {d.node: d.figures for d in report.decisions}
    boxes = {}
    for node in report.flowchart.nodes:
        walked = node.id in position
        box = Box(id=node.id, kind=node.kind, label=node.label, title=node.title, walked=walked,
                  reached=walked and node.kind == "leaf", step=position.get(node.id),
                  anchor=anchors.get(node.id), figures=_figure_lines(node.id, figures.get(node.id, {})))
        box.h = (LEAF_H if node.kind == "leaf" else RUN_H) + FIGURE_LINE * len(box.figures)
        box.w = _fitted_width(box, NODE_W if walked else LEAF_W if node.kind == "leaf" else OTHER_W)
        boxes[node.id] = box
    return boxes


def _fitted_width(box: Box, least: float) -> float:
    """Wide enough for every line of the box whole (px per character of each line's font): no label is cut."""
    id_px = 6.4 if box.kind == "leaf" else 7.2
    return max(least, 24 + len(box.id) * id_px, 24 + len(box.label) * 6.4,
               *(24 + len(line) * FIGURE_PX for line in box.figures))


FIGURE_PX = 6.4  # a character of a figure line (monospace, 10.5 px)
FIGURE_CHARS = 36  # a figure line wraps past this


def _figure_lines(node: str, figures: dict[str, Any], limit: int = 5) -> list[str]:
    entries = [f"{labels.words(key, node)} = {labels.value(key, value)}" for key, value in figures.items()]
    if len(entries) > limit:
        entries = entries[:limit - 1] + [f"… {len(entries) - limit + 1} more"]
    return [line for entry in entries
            for line in textwrap.wrap(entry, FIGURE_CHARS, subsequent_indent="  ", break_on_hyphens=False) or [entry]]


def _layers(graph: nx.DiGraph, entry: Optional[str]) -> list[list[str]]:
    """Longest-path layers; a graph with a cycle (not a valid playbook) falls back to BFS depth."""
    if nx.is_directed_acyclic_graph(graph):
        return [sorted(g, key=list(graph.nodes).index) for g in nx.topological_generations(graph)]
    depth = nx.single_source_shortest_path_length(graph, entry) if entry in graph else {}
    deepest = max(depth.values(), default=0)
    layers: list[list[str]] = [[] for _ in range(deepest + 2)]
    for node in graph.nodes:
        layers[depth.get(node, deepest + 1)].append(node)
    return [layer for layer in layers if layer]


def _route(graph: nx.DiGraph, layers: list[list[str]], boxes: dict[str, Box]) -> dict[tuple[str, str], list[str]]:
    """Each edge as a chain of box ids through every layer it crosses (dummies in between)."""
    level = {node: i for i, layer in enumerate(layers) for node in layer}
    chains = {}
    for u, v in graph.edges:
        chain = [u]
        step = 1 if level[v] > level[u] else -1
        for k in range(level[u] + step, level[v], step):
            dummy = f"\0{u}\0{v}\0{k}"
            boxes[dummy] = Box(id=dummy, kind="dummy", w=DUMMY_W, h=0)
            layers[k].append(dummy)
            chain.append(dummy)
        chain.append(v)
        chains[(u, v)] = chain
    return chains


def _order(chains: dict[tuple[str, str], list[str]], layers: list[list[str]], report: Report) -> None:
    """Barycenter sweeps (down, up) to reduce crossings; ties keep the playbook's branch order."""
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for chain in chains.values():
        for a, b in zip(chain, chain[1:]):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
    for _ in range(4):
        for neighbours, sweep in ((up, range(1, len(layers))), (down, range(len(layers) - 2, -1, -1))):
            for k in sweep:
                ref = {n: i for i, n in enumerate(layers[k - 1 if neighbours is up else k + 1])}
                current = {n: i for i, n in enumerate(layers[k])}

                def barycenter(n: str) -> float:
                    linked = [ref[m] for m in neighbours.get(n, []) if m in ref]
                    return sum(linked) / len(linked) if linked else current[n]

                layers[k].sort(key=lambda n: (barycenter(n), current[n]))


def _layer_gaps(layers: list[list[str]], edges: list[Edge], boxes: dict[str, Box]) -> list[float]:
    """Vertical room below each layer: more where a taken edge's condition is written."""
    level = {node: i for i, layer in enumerate(layers) for node in layer}
    gaps = [34.0] * len(layers)
    for edge in edges:
        if edge.taken:
            k = level[edge.source]
            gaps[k] = max(gaps[k], 26.0 + LABEL_LINE * len(edge.taken_label))
    return gaps


def _place(layers: list[list[str]], chains, boxes: dict[str, Box], gaps: list[float]) -> tuple[float, float]:
    neighbours: dict[str, list[str]] = {}
    for chain in chains.values():
        for a, b in zip(chain, chain[1:]):
            neighbours.setdefault(a, []).append(b)
            neighbours.setdefault(b, []).append(a)
    for layer in layers:  # start packed from the left
        _pack(layer, boxes, [0.0] * len(layer))
    for _ in range(6):  # pull each box toward the mean of its neighbours, keeping order and gaps
        for layer in layers[1:] + layers[::-1]:
            wanted = []
            for n in layer:
                xs = [boxes[m].x for m in neighbours.get(n, [])]
                wanted.append(sum(xs) / len(xs) if xs else boxes[n].x)
            _pack(layer, boxes, wanted)
    lowest = min(boxes[n].left for layer in layers for n in layer)
    y = MARGIN
    for layer, gap in zip(layers, gaps):
        tallest = max(boxes[n].h for n in layer)
        for n in layer:
            boxes[n].x += MARGIN - lowest
            boxes[n].y = y + (tallest - boxes[n].h) / 2 if boxes[n].kind == "dummy" else y
            if boxes[n].kind == "dummy":
                boxes[n].h = tallest  # a dummy is a straight run through the whole layer
                boxes[n].y = y
        y += tallest + gap
    width = max(boxes[n].left + boxes[n].w for layer in layers for n in layer) + MARGIN
    return width, y - gaps[-1] + MARGIN


def _pack(layer: list[str], boxes: dict[str, Box], wanted: list[float]) -> None:
    """Centres as close to `wanted` as order and spacing allow (left-to-right push, then re-centred)."""
    xs: list[float] = []
    for i, n in enumerate(layer):
        x = wanted[i]
        if i:
            prev = boxes[layer[i - 1]]
            gap = DUMMY_GAP if "dummy" in (prev.kind, boxes[n].kind) else GAP_X
            x = max(x, xs[-1] + (prev.w + boxes[n].w) / 2 + gap)
        xs.append(x)
    shift = (sum(wanted) - sum(xs)) / len(xs) if xs else 0.0
    for n, x in zip(layer, xs):
        boxes[n].x = x + shift


def _draw_edge(edge: Edge, chain: list[str], boxes: dict[str, Box]) -> None:
    source, target = boxes[chain[0]], boxes[chain[-1]]
    points = [(source.x, source.bottom)]
    for dummy in chain[1:-1]:
        points += [(boxes[dummy].x, boxes[dummy].y), (boxes[dummy].x, boxes[dummy].bottom)]
    points.append((target.x, target.y))
    parts = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 == x1:
            parts.append(f"L{x1:.1f},{y1:.1f}")
        else:
            mid = (y0 + y1) / 2
            parts.append(f"C{x0:.1f},{mid:.1f} {x1:.1f},{mid:.1f} {x1:.1f},{y1:.1f}")
    edge.d = " ".join(parts)
    if edge.taken_label:
        # The condition sits in the gap under the source, on the first leg of the edge.
        (x0, y0), (x1, y1) = points[0], points[1]
        edge.label_w = 7 + 6.1 * max(len(line) for line in edge.taken_label)
        edge.label_y = y0 + 8
        edge.label_x = x0 + (x1 - x0) * 0.35


def _wrap(text: str) -> list[str]:
    """An edge's condition, whole, in lines of LABEL_CHARS at most (a word longer than that gets its own line)."""
    return textwrap.wrap(text, LABEL_CHARS, break_on_hyphens=False, break_long_words=False) or [text]

