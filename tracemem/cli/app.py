"""`main`: parse the command line and run one command, errors as one line."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

import duckdb

from ..errors import TracememError
from . import copy, data, explain, graph, runs
from .common import Commands
from .render import Visible, visible

ENGINE_COMMANDS: Commands = {**runs.COMMANDS, **explain.COMMANDS, **data.COMMANDS, **graph.COMMANDS,
                              **copy.COMMANDS}


def _parent() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="store: a DuckDB file or a postgresql:// URL (default: $TRACEMEM_DB or ./tracemem.duckdb)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output (JSON; NaN and Infinity, which JSON lacks, become null)")
    return common


def build_parser(extra: Optional[Commands] = None) -> argparse.ArgumentParser:
    """The argument parser of every engine command, plus `extra` ones."""
    common = _parent()
    ap = argparse.ArgumentParser(prog="tracemem", description=(__doc__ or "").splitlines()[0], parents=[common])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, setup, _) in {**ENGINE_COMMANDS, **(extra or {})}.items():
        setup(sub.add_parser(name, parents=[common], help=help_text, description=help_text))
    return ap


def main(argv: Optional[Sequence[str]] = None, out: Any = None, extra: Optional[Commands] = None) -> int:
    """Run one command; `extra` adds commands defined outside the engine (e.g. `demo`)."""
    args = build_parser(extra).parse_args(argv)
    out = Visible(out or sys.stdout)  # stored text never drives the terminal (render.visible)
    commands = {**ENGINE_COMMANDS, **(extra or {})}
    try:
        commands[args.command][2](args, out)
    except (TracememError, duckdb.Error, OSError, ValueError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"tracemem: error: {visible(message)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
