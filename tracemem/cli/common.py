"""What every command shares: which store file, opening it for reading, run ids by prefix, output mode."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Mapping

from ..errors import TracememError

Setup = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace, Any], None]
Command = tuple[str, Setup, Handler]  # (help, add its arguments, run it)
Commands = Mapping[str, Command]


def common_options() -> argparse.ArgumentParser:
    """The options every command (and sub-command) takes, as an argparse parent."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="store: a DuckDB file or a postgresql:// URL (default: $TRACEMEM_DB or "
                             "./tracemem.duckdb)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output (JSON; NaN and Infinity, which JSON lacks, become null; "
                             "times are ISO 8601 UTC strings)")
    return common


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (`--limit 0` or `-1` is refused, not taken as "none")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a number of at least 1, got {value}")
    return value


def db_path(args: argparse.Namespace) -> str:
    """The store a command works on: --db (a file or a postgresql:// URL), else $TRACEMEM_DB, else
    ./tracemem.duckdb."""
    return getattr(args, "db", None) or os.environ.get("TRACEMEM_DB") or "tracemem.duckdb"


def is_url(path: str) -> bool:
    """Whether --db names a PostgreSQL database rather than a file."""
    return path.startswith(("postgresql://", "postgres://"))


def open_store(args: argparse.Namespace, write: bool = False) -> Any:
    """The store, read-only (a snapshot copy if another process writes it) unless `write`."""
    from ..store import Store

    path = db_path(args)
    if path != ":memory:" and not is_url(path) and not os.path.exists(path):  # never create one from a typo
        raise TracememError(f"no tracemem store at {path}; run a flow with Store('{path}') first, or pass --db PATH")
    store = Store(path, read_only=not write, snapshot_if_locked=not write)
    if store.snapshot_of:
        print(f"note: {store.snapshot_note}", file=sys.stderr)
    return store


def resolve_run(store: Any, ref: str) -> str:
    """A full run id from a unique prefix (people copy the first 8 characters)."""
    return store.resolve_run_id(ref)


def wants_json(args: argparse.Namespace) -> bool:
    """Whether `--json` was given."""
    return bool(getattr(args, "json", False))
