"""`tracemem ui`: the local web viewer (needs the `ui` extra: pip install 'tracemem-agents[ui]')."""
from __future__ import annotations

import argparse
import importlib.util
import math
from typing import Any

from ..errors import TracememError, UsageError
from .common import Commands, db_path


def setup_ui(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765; 0 picks a free one)")
    p.add_argument("--allow-edit", action="store_true",
                   help="offer flag and forget on memory pages (each opens the store for writing, briefly)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="stop any query of a page (and SQL typed in the console) that runs longer (default 10)")


def cmd_ui(args: argparse.Namespace, out: Any) -> None:
    missing = [m for m in ("starlette", "uvicorn", "jinja2") if importlib.util.find_spec(m) is None]
    if missing:
        raise TracememError(f"tracemem ui needs {', '.join(missing)}: pip install 'tracemem-agents[ui]'")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout takes a number of seconds > 0 (e.g. 10), got {args.timeout:g}")
    from ..ui import serve

    def announce(line: str) -> None:
        print(line, file=out, flush=True)

    serve(db_path(args), host=args.host, port=args.port, allow_edit=args.allow_edit, timeout=args.timeout,
          announce=announce)


COMMANDS: Commands = {"ui": ("a local web viewer: runs, traces, memory, SQL", setup_ui, cmd_ui)}
