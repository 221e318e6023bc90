"""`main`: parse the command line and run one command, errors as one line."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional, Sequence

import duckdb

from ..errors import TracememError
from ..store.registry import open_stores
from . import accountability, copy, data, explain, graph, memory, resume, runs, ui, why
from .signals import install_sigterm_flush
from .common import Commands, common_options
from .render import Visible, visible

ENGINE_COMMANDS: Commands = {**runs.COMMANDS, **why.COMMANDS, **explain.COMMANDS, **accountability.COMMANDS, **data.COMMANDS,
                              **memory.COMMANDS, **graph.COMMANDS, **resume.COMMANDS, **ui.COMMANDS,
                              **copy.COMMANDS}


def build_parser(extra: Optional[Commands] = None) -> argparse.ArgumentParser:
    """The argument parser of every engine command, plus `extra` ones."""
    common = common_options()
    ap = argparse.ArgumentParser(prog="tracemem", parents=[common], description=(
        "Look into a tracemem store: the runs recorded in it, why a value is what it is, its memories, "
        "plain SQL. `tracemem COMMAND --help` explains each command."))
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, setup, _) in {**ENGINE_COMMANDS, **(extra or {})}.items():
        setup(sub.add_parser(name, parents=[common], help=help_text, description=help_text))
    return ap


def main(argv: Optional[Sequence[str]] = None, out: Any = None, extra: Optional[Commands] = None) -> int:
    """Run one command; `extra` adds commands defined outside the engine (e.g. `demo`)."""
    args = build_parser(extra).parse_args(argv)
    if argv is None:  # the `tracemem` command itself (not a call from Python): SIGTERM writes queued runs first
        install_sigterm_flush(open_stores.flush_all)
    out = Visible(out or sys.stdout)  # stored text never drives the terminal (render.visible)
    commands = {**ENGINE_COMMANDS, **(extra or {})}
    try:
        commands[args.command][2](args, out)
        out.flush()  # here, not at exit, so a reader that went away is noticed below
    except BrokenPipeError:  # `tracemem runs | head`: the reader has all it wanted
        _stdout_to_devnull()
        return 0
    except (TracememError, duckdb.Error, OSError, ValueError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, duckdb.Error) and not message.startswith("SQL error"):
            message = f"SQL error: {message}"
        print(f"tracemem: error: {visible(message)}", file=sys.stderr)
        return 1
    return 0


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit meets no closed pipe either
    (else Python prints "Exception ignored … BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (e.g. captured): nothing will flush into a pipe
        pass


if __name__ == "__main__":
    sys.exit(main())
