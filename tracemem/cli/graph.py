"""`tracemem graph MODULE:ATTR`: the stage graph of a flow, as Mermaid, JSON or a picture."""
from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import TracememError
from .common import Commands, wants_json
from .loading import load_flow
from .picture import html_page, mmdc, render_mmdc, svg
from .render import to_json


def setup_graph(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="MODULE:ATTR naming a Pipeline, a built Flow, or a function taking no arguments "
                                  "that returns one (e.g. stages.demo:build_flow)")
    p.add_argument("--out", metavar="FILE",
                   help="write a picture instead of printing Mermaid: FILE.svg or FILE.png are drawn by the "
                        "Mermaid CLI (mmdc) when it is on PATH; without it, FILE.svg is drawn by tracemem itself "
                        "(rows from the start node, networkx layout) and FILE.png is refused; FILE.html is a "
                        "self-contained page (no script, nothing fetched) with tracemem's drawing and the "
                        "Mermaid source; FILE.mmd is the Mermaid source")


def write_picture(flow: Any, path: str) -> str:
    """Write the picture `path`'s suffix asks for; returns how it was made."""
    suffix = os.path.splitext(path)[1].lower()
    mermaid, title = flow.to_mermaid(), f"{flow.name} ({flow.hash})"
    if suffix == ".mmd":
        text, how = mermaid + "\n", "Mermaid source"
    elif suffix in (".svg", ".png") and mmdc():
        render_mmdc(mermaid, path)
        return "drawn by the Mermaid CLI (mmdc)"
    elif suffix == ".svg":
        text, how = svg(flow.graph, title), "drawn by tracemem (mmdc is not on PATH)"
    elif suffix == ".html":
        text, how = html_page(title, svg(flow.graph), mermaid), "a self-contained page: tracemem's " \
                                                                        "drawing and the Mermaid source"
    elif suffix == ".png":
        raise TracememError(f"writing {path} needs the Mermaid CLI (mmdc) on PATH "
                            f"(npm install -g @mermaid-js/mermaid-cli); or write .svg or .html, which need nothing")
    else:
        raise TracememError(f"--out {path}: the file name must end in .svg, .png, .html or .mmd")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return how


def cmd_graph(args: argparse.Namespace, out: Any) -> None:
    flow = load_flow(args.target)
    if args.out:
        how = write_picture(flow, args.out)
        print(f"wrote {args.out}: {how}", file=out)
    elif wants_json(args):
        print(to_json(flow.to_spec()), file=out)
    else:
        print(flow.to_mermaid(), file=out)


COMMANDS: Commands = {"graph": ("the stage graph of a flow: Mermaid, JSON (--json) or a picture (--out FILE)",
                                setup_graph, cmd_graph)}
