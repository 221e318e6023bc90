"""`tracemem graph MODULE:ATTR`: the stage graph of a flow, as Mermaid or JSON."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ..errors import TracememError
from .common import Commands, wants_json
from .render import to_json


def setup_graph(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="MODULE:ATTR naming a Pipeline or a built Flow")


def cmd_graph(args: argparse.Namespace, out: Any) -> None:
    from ..flow.pipeline import Flow, Pipeline

    module_name, _, attr = args.target.partition(":")
    if not attr:
        raise TracememError(f"graph takes MODULE:ATTR (e.g. examples.credit:flow), got {args.target!r}")
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
    if isinstance(flow, Pipeline):
        flow = flow.build()
    if not isinstance(flow, Flow):
        raise TracememError(f"{args.target} is a {type(flow).__name__}, not a flow (a Pipeline or a built Flow)")
    if wants_json(args):
        print(to_json(flow.to_spec()), file=out)
    else:
        print(flow.to_mermaid(), file=out)


COMMANDS: Commands = {"graph": ("Mermaid of a flow: MODULE:ATTR", setup_graph, cmd_graph)}
