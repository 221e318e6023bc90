"""`tracemem graph MODULE:ATTR`: the stage graph of a flow, as Mermaid, JSON or a picture."""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from typing import Any

from ..errors import TracememError
from .common import Commands, wants_json
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


def load_flow(target: str) -> Any:
    """The Flow `MODULE:ATTR` names: a Flow, a Pipeline (built here), or a factory returning either."""
    from ..flow.pipeline import Flow, Pipeline

    module_name, _, attr = target.partition(":")
    if not attr:
        raise TracememError(f"graph takes MODULE:ATTR (e.g. examples.credit:flow), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise TracememError(f"cannot import {module_name}: {err}") from None
    except Exception as err:  # the module itself failed (syntax error, an exception at import)
        raise TracememError(f"cannot import {module_name}: {type(err).__name__}: {err}") from None
    flow = getattr(module, attr, None)
    if flow is None:
        raise TracememError(f"{module_name} has no attribute '{attr}'")
    if callable(flow) and not isinstance(flow, (Flow, Pipeline, type)):
        required = [p.name for p in inspect.signature(flow).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            raise TracememError(f"{target} takes arguments ({', '.join(required)}); graph calls a factory with "
                                f"none: name a function that builds the flow on its own")
        try:
            flow = flow()
        except Exception as err:
            raise TracememError(f"{target}() failed: {type(err).__name__}: {err}") from None
    if isinstance(flow, Pipeline):
        flow = flow.build()
    if not isinstance(flow, Flow):
        raise TracememError(f"{target} is (or returned) a {type(flow).__name__}, not a flow: name a Pipeline, "
                            f"a built Flow or a function returning one")
    return flow


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
