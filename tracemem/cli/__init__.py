"""The `tracemem` command: look at a store from the shell.

    tracemem runs | show RUN | backtrack RUN PATH | sql "QUERY" | memories | prune | export DIR
    tracemem graph MODULE:ATTR

The installed `tracemem` command is `stages.cli:main`, which adds `demo` (it is built
from the ready-made stages, which the engine never imports) through `extra=`.
Each group of commands lives in its own module (runs, explain, data, graph), which
lists its commands in `COMMANDS`.

Every command takes `--db PATH` (default ./tracemem.duckdb or $TRACEMEM_DB) and
`--json`. Errors are one line on stderr and a non-zero exit, never a traceback.
"""
from .common import Commands, db_path, resolve_run
from .app import build_parser, main

__all__ = ["Commands", "build_parser", "db_path", "main", "resolve_run"]
