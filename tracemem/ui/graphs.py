"""Graphs drawn on the server as SVG: a layered layout (columns, or rows top down) and its markup.

Why our own: a stage graph and a causal trace are both layered DAGs with a few back edges, and
a column layout with one barycentre pass per sweep draws them legibly in a few milliseconds for
hundreds of nodes. A JavaScript graph library would have to be vendored (the viewer works
offline) and would draw in the browser, where the tests would have to wait for it; SVG from the
server is a page like any other, readable by tests and screenshots as soon as it loads.

Every piece of text is escaped here; the markup is safe to put in a page as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Optional, Sequence

from ..text import clip

__all__ = ["Edge", "Node", "layout", "svg"]

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 210, 44, 48, 12, 14
GAP_ROW, GAP_COL = 34, 14  # vertical layouts


@dataclass
class Node:
    """A box: up to two lines of text, CSS classes, a link and a tooltip."""

    id: str
    layer: int
    title: str
    subtitle: str = ""
    classes: str = ""
    href: Optional[str] = None
    tooltip: str = ""
    expand: Optional[str] = None  # a link drawn as "+" on the box: show what lies behind the node
    x: float = 0.0
    y: float = 0.0


@dataclass
class Edge:
    """An arrow from `src` to `dst`; `kind` becomes its CSS class, `label` sits on it."""

    src: str
    dst: str
    kind: str = ""
    label: str = ""
    count: int = 1


@dataclass
class Layout:
    nodes: dict[str, Node]
    edges: list[Edge]
    width: float
    height: float
    layers: list[list[str]] = field(default_factory=list)
    vertical: bool = False


def layout(nodes: Sequence[Node], edges: Sequence[Edge], sweeps: int = 4, vertical: bool = False) -> Layout:
    """Columns by `node.layer` (rows, top down, when `vertical`); within one, nodes sorted by the mean
    position of their neighbours in the layers beside it (a few sweeps each way), so edges cross less."""
    by_id = {n.id: n for n in nodes}
    edges = [e for e in edges if e.src in by_id and e.dst in by_id]
    count = max((n.layer for n in nodes), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(count)]
    for n in nodes:
        layers[n.layer].append(n.id)
    neighbours: dict[str, list[str]] = {n.id: [] for n in nodes}
    for e in edges:
        neighbours[e.src].append(e.dst)
        neighbours[e.dst].append(e.src)
    pos = {nid: float(i) for layer in layers for i, nid in enumerate(layer)}
    for sweep in range(sweeps):
        order = range(1, count) if sweep % 2 == 0 else range(count - 2, -1, -1)
        for li in order:
            side = li - 1 if sweep % 2 == 0 else li + 1

            def centre(nid: str) -> float:
                near = [pos[m] for m in neighbours[nid] if by_id[m].layer == side]
                return sum(near) / len(near) if near else pos[nid]

            layers[li].sort(key=centre)
            for i, nid in enumerate(layers[li]):
                pos[nid] = float(i)
    tallest = max((len(layer) for layer in layers), default=0)
    along, across = (BOX_H + GAP_ROW, BOX_W + GAP_COL) if vertical else (BOX_W + GAP_X, BOX_H + GAP_Y)
    for li, layer in enumerate(layers):
        offset = (tallest - len(layer)) * across / 2
        for i, nid in enumerate(layer):
            main, side = MARGIN + li * along, MARGIN + offset + i * across
            by_id[nid].x, by_id[nid].y = (side, main) if vertical else (main, side)
    long_side = MARGIN * 2 + max(count, 1) * along - (along - (BOX_H if vertical else BOX_W))
    short_side = MARGIN * 2 + max(tallest, 1) * across - (across - (BOX_W if vertical else BOX_H)) + 40
    width, height = (short_side, long_side) if vertical else (long_side, short_side)
    return Layout(by_id, edges, width, height, layers, vertical)


def _edge_path(a: Node, b: Node, lay: "Layout") -> tuple[str, float, float]:
    """An SVG path from a to b and a point for its label: a curve forwards, an arc aside for back edges."""
    if lay.vertical:
        if b.layer > a.layer:
            x1, y1, x2, y2 = a.x + BOX_W / 2, a.y + BOX_H, b.x + BOX_W / 2, b.y
            mid = (y1 + y2) / 2
            return f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}", (x1 + x2) / 2, mid
        x1, y1, x2, y2 = a.x + BOX_W, a.y + BOX_H / 2, b.x + BOX_W, b.y + BOX_H / 2
        out = min(max(x1, x2) + 30, lay.width - 4)
        return f"M{x1:.1f},{y1:.1f} C{out:.1f},{y1:.1f} {out:.1f},{y2:.1f} {x2:.1f},{y2:.1f}", out, (y1 + y2) / 2
    if b.layer > a.layer:
        x1, y1, x2, y2 = a.x + BOX_W, a.y + BOX_H / 2, b.x, b.y + BOX_H / 2
        mid = (x1 + x2) / 2
        return f"M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}", mid, (y1 + y2) / 2
    x1, y1, x2, y2 = a.x + BOX_W / 2, a.y + BOX_H, b.x + BOX_W / 2, b.y + BOX_H
    low = max(y1, y2) + 18 if abs(x1 - x2) > 1 else y1 + 24
    low = min(low, lay.height - 4)
    return (f"M{x1:.1f},{y1:.1f} C{x1:.1f},{low:.1f} {x2 + (12 if x1 == x2 else 0):.1f},{low:.1f} "
            f"{x2:.1f},{y2:.1f}"), (x1 + x2) / 2, low - 4


def svg(lay: Layout, *, css_class: str = "graph", label: str = "graph") -> str:
    """The layout as an inline SVG element (text escaped; arrowheads per edge kind)."""
    out = [f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" role="img" '
           f'aria-label="{escape(label)}" width="{lay.width:.0f}" height="{lay.height:.0f}" '
           f'viewBox="0 0 {lay.width:.0f} {lay.height:.0f}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>']
    for e in lay.edges:
        a, b = lay.nodes[e.src], lay.nodes[e.dst]
        d, lx, ly = _edge_path(a, b, lay)
        out.append(f'<path class="edge {escape(e.kind)}" d="{d}" marker-end="url(#arrow)">'
                   f'<title>{escape(e.kind)}{": " + escape(e.label) if e.label else ""}</title></path>')
        text = e.label + (f" ×{e.count}" if e.count > 1 else "")
        if text:
            out.append(f'<text class="edge-label" x="{lx:.1f}" y="{ly - 3:.1f}" text-anchor="middle">'
                       f'{escape(clip(text, 28))}</text>')
    for n in lay.nodes.values():
        out.append(_box(n))
    out.append("</svg>")
    return "\n".join(out)


def _box(n: Node) -> str:
    """One node: its box (a link, when it has one) and, when it can be opened, a "+" linking to that."""
    inner = (f'<title>{escape(n.tooltip or n.title)}</title>'
             f'<rect x="{n.x:.1f}" y="{n.y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="6"/>'
             f'<text x="{n.x + 8:.1f}" y="{n.y + 18:.1f}" class="t1">{escape(clip(n.title, 31 if not n.expand else 25))}</text>'
             f'<text x="{n.x + 8:.1f}" y="{n.y + 35:.1f}" class="t2">{escape(clip(n.subtitle, 35))}</text>')
    head = f'<g class="node {escape(n.classes)}" data-node="{escape(n.id)}">'
    if not n.expand:
        box = head + inner + "</g>"
        return f'<a href="{escape(n.href)}">{box}</a>' if n.href else box
    body = f'<a href="{escape(n.href)}">{inner}</a>' if n.href else inner
    cx, cy = n.x + BOX_W - 11, n.y + 11
    return (f'{head}{body}<a class="expand" href="{escape(n.expand)}"><title>show what lies behind it</title>'
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8"/><text x="{cx:.1f}" y="{cy + 4:.1f}" '
            f'text-anchor="middle">+</text></a></g>')
