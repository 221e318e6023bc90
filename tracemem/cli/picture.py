"""Pictures of a stage graph for `tracemem graph --out FILE`, made without a network or a browser.

Mermaid's own renderer (the `mmdc` command of @mermaid-js/mermaid-cli) needs Node and a headless
browser; when it is on PATH it draws the .svg or .png. Otherwise tracemem draws the graph itself:
an SVG laid out in layers from the start node (networkx computes the positions), and an .html page
holding that SVG and the Mermaid source, self-contained (no script, nothing fetched).
"""
from __future__ import annotations

import html
import os
import shutil
import subprocess
import tempfile
from typing import Any, Optional

import networkx as nx

__all__ = ["html_page", "mmdc", "render_mmdc", "svg"]

_ROW, _PAD, _CHAR, _HEIGHT = 90, 40, 7.2, 34
_FILL = {"start": "#e8f5e9", "end": "#e8f5e9", "decider": "#fff3e0", "fork": "#e3f2fd", "subflow": "#f3e5f5",
         "loop": "#fce4ec"}


def mmdc() -> Optional[str]:
    """The Mermaid CLI on PATH, if any."""
    return shutil.which("mmdc")


def render_mmdc(mermaid: str, out: str, timeout: float = 120) -> None:
    """Draw Mermaid source into `out` (.svg or .png) with the Mermaid CLI."""
    command = mmdc()
    if command is None:
        raise FileNotFoundError("the Mermaid CLI (mmdc) is not on PATH")
    with tempfile.TemporaryDirectory(prefix="tracemem-graph-") as folder:
        source = os.path.join(folder, "graph.mmd")
        with open(source, "w", encoding="utf-8") as f:
            f.write(mermaid)
        done = subprocess.run([command, "-i", source, "-o", out], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not os.path.exists(out):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise OSError(f"mmdc could not draw {out}: {tail[0]}")


def _layers(graph: nx.DiGraph) -> dict[Any, int]:
    """Each node's row: its distance from the start node (jumps back keep the earlier row); the end last."""
    start = next((n for n, d in graph.nodes(data=True) if d.get("kind") == "start"), None)
    rows = dict(nx.single_source_shortest_path_length(graph, start)) if start is not None else {}
    ends = [n for n, d in graph.nodes(data=True) if d.get("kind") == "end"]
    last = max((r for n, r in rows.items() if n not in ends), default=-1)
    for n in graph.nodes:
        if n not in rows and n not in ends:
            rows[n] = last + 1
    for n in ends:
        rows[n] = max((r for m, r in rows.items() if m not in ends), default=-1) + 1
    return rows


def _places(graph: nx.DiGraph, rows: dict[Any, int], widths: dict[Any, float]) -> dict[Any, tuple[float, float]]:
    """Box centres: rows top to bottom; within a row, networkx's multipartite order, boxes side by side,
    each row centred."""
    layered = nx.DiGraph()
    layered.add_nodes_from((n, {"row": rows[n]}) for n in graph.nodes)
    order = nx.multipartite_layout(layered, subset_key="row", align="horizontal")
    per_row: dict[int, list[Any]] = {}
    for n in sorted(graph.nodes, key=lambda n: order[n][0]):
        per_row.setdefault(rows[n], []).append(n)
    row_width = {r: sum(widths[n] for n in ns) + _PAD * (len(ns) - 1) for r, ns in per_row.items()}
    widest = max(row_width.values())
    places = {}
    for r, ns in per_row.items():
        x = _PAD + (widest - row_width[r]) / 2
        for n in ns:
            places[n] = (x + widths[n] / 2, _PAD + 30 + r * _ROW)
            x += widths[n] + _PAD
    return places


def svg(graph: nx.DiGraph, title: str = "") -> str:
    """The stage graph as a standalone SVG: boxes in rows from start to end, edges with their labels."""
    rows = _layers(graph)
    labels = {n: str(d.get("name") or n) for n, d in graph.nodes(data=True)}
    widths = {n: max(60.0, len(text) * _CHAR + 24) for n, text in labels.items()}
    place = _places(graph, rows, widths)
    width = max(x + widths[n] / 2 for n, (x, _) in place.items()) + _PAD + 60  # room for loop curves
    height = max(y for _, y in place.values()) + _HEIGHT + _PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
           f'<text x="{_PAD}" y="24" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    for a, b, d in graph.edges(data=True):
        (x1, y1), (x2, y2) = place[a], place[b]
        if rows[b] > rows[a]:
            path = f"M {x1:.1f} {y1 + _HEIGHT:.1f} L {x2:.1f} {y2:.1f}"
            mid = ((x1 + x2) / 2, (y1 + _HEIGHT + y2) / 2)
        else:  # a jump back (a loop): around the right-hand side
            bend = max(x1 + widths[a] / 2, x2 + widths[b] / 2) + 40
            path = (f"M {x1 + widths[a] / 2:.1f} {y1 + _HEIGHT / 2:.1f} C {bend:.1f} {y1:.1f} {bend:.1f} "
                    f"{y2 + _HEIGHT:.1f} {x2 + widths[b] / 2:.1f} {y2 + _HEIGHT / 2:.1f}")
            mid = (bend - 20, (y1 + y2 + _HEIGHT) / 2)
        out.append(f'<path d="{path}" fill="none" stroke="#555" marker-end="url(#arrow)"/>')
        if d.get("label"):
            out.append(f'<text x="{mid[0] + 4:.1f}" y="{mid[1]:.1f}" fill="#333">{html.escape(str(d["label"]))}</text>')
    for n, d in graph.nodes(data=True):
        x, y = place[n]
        w, kind = widths[n], d.get("kind", "stage")
        radius = 17 if kind in ("start", "end", "loop") else 4
        out.append(f'<rect x="{x - w / 2:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_HEIGHT}" rx="{radius}" '
                   f'fill="{_FILL.get(kind, "#ffffff")}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{y + _HEIGHT / 2 + 4:.1f}" text-anchor="middle">'
                   f'{html.escape(labels[n])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(title: str, picture: str, mermaid: str) -> str:
    """A self-contained page: the drawn graph, and its Mermaid source to paste into any Mermaid renderer."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body {{ font-family: sans-serif; margin: 2em; }} pre {{ background: #f6f6f6; padding: 1em; }}</style>
</head><body>
<h1>{html.escape(title)}</h1>
{picture}
<h2>Mermaid source</h2>
<p>Drawn above by tracemem from the stage graph; paste this into any Mermaid renderer for Mermaid's own layout.</p>
<pre>{html.escape(mermaid)}</pre>
</body></html>
"""
