"""`tracemem copy SRC DST`: move history between a DuckDB file and PostgreSQL, either way.

    tracemem copy agent.duckdb postgresql://user@host/db      # promote a prototype into the fleet
    tracemem copy postgresql://user@host/db local.duckdb --since 7 --pipeline support   # analyse locally

Ids and provenance are kept (store/copying.py), so backtracking across runs works in the copy.
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timedelta
from typing import Any

from ..errors import TracememError
from ..times import utc_naive, utc_now
from .common import Commands, is_url, wants_json
from .render import Progress, to_json


def setup_copy(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the store to copy from: a DuckDB file or a postgresql:// URL")
    p.add_argument("destination", help="the store to copy into (created if it does not exist)")
    p.add_argument("--since", help="only runs started since: days (e.g. 7) or an ISO date (UTC)")
    p.add_argument("--pipeline", help="only runs of this pipeline")


def since(text: str) -> datetime:
    """A start in UTC: days back (e.g. 7) or an ISO date (taken as UTC without a zone)."""
    try:
        return utc_now() - timedelta(days=float(text))
    except ValueError:
        try:
            return utc_naive(datetime.fromisoformat(text))  # type: ignore[return-value]
        except ValueError:
            raise TracememError(f"--since takes days (e.g. 7) or an ISO date, got {text!r}") from None


def cmd_copy(args: argparse.Namespace, out: Any) -> None:
    from ..store import Store
    from ..store.copying import copy_history

    if not is_url(args.source) and not os.path.exists(args.source):
        raise TracememError(f"no tracemem store at {args.source}; name a DuckDB file or a postgresql:// URL")
    with Store(args.source, read_only=True, snapshot_if_locked=True) as src:
        if src.snapshot_of:
            print(f"note: {src.snapshot_note}", file=sys.stderr)
        with Store(args.destination) as dst:
            report = copy_history(src, dst, since=since(args.since) if args.since else None,
                                  pipeline=args.pipeline, progress=Progress("copying"))
    if wants_json(args):
        print(to_json({"runs": report.runs, "rows": report.rows, "memories": report.memories,
                       "memory_events": report.memory_events, "skipped_runs": report.skipped_runs,
                       "skipped_memories": report.skipped_memories}), file=out)
    else:
        print(f"{report} from {src.path} to {dst.path}", file=out)


COMMANDS: Commands = {
    "copy": ("copy history between stores (DuckDB file ↔ PostgreSQL), keeping ids", setup_copy, cmd_copy),
}
