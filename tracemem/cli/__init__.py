"""The `tracemem` command: look at a store from the shell.

    tracemem runs | show RUN | backtrack RUN PATH | sql "QUERY" | memories | prune | export DIR
    tracemem memory flag|forget|supersede|history … | graph MODULE:ATTR [--out FILE]

The installed `tracemem` command is `stages.cli:main`, which adds `demo` (it is built
from the ready-made stages, which the engine never imports) through `extra=`.
Each group of commands lives in its own module (runs, explain, data, memory, graph), which
lists its commands in `COMMANDS`; `details` renders the parts of `show` printed on request and
`picture` draws a stage graph without a browser.

Every command takes `--db PATH` (default ./tracemem.duckdb or $TRACEMEM_DB) and
`--json`. Errors are one line on stderr and a non-zero exit, never a traceback.
"""
from .common import Commands, db_path, resolve_run
from .app import build_parser, main

__all__ = ["Commands", "build_parser", "db_path", "main", "resolve_run"]
