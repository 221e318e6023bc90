"""`tracemem sql`, `memories`, `prune` and `export`: the store's data, as tables and files."""
from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime, timedelta
from typing import Any, Optional

import duckdb

from ..errors import TracememError, UsageError
from ..times import utc_naive, utc_now
from .common import Commands, db_path, is_url, open_store, wants_json
from .render import Progress, table, to_json


def setup_sql(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", help="SQL over the store's tables (docs/sql.md lists them and their columns)")
    p.add_argument("--write", action="store_true",
                   help="allow changes and full SQL (default: read-only); warns when the memories table changes, "
                        "since such a change leaves no memory_events trail")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="stop a read-only query that runs longer (default 60)")


def setup_memories(p: argparse.ArgumentParser) -> None:
    p.add_argument("--subject", help="only this subject's records")
    p.add_argument("--all", action="store_true", help="include forgotten records")


def setup_prune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--older-than", help="days (e.g. 30) or an ISO date (UTC, as run times are stored)")
    p.add_argument("--keep-last", metavar="N", help="keep the newest N runs")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    p.add_argument("--compact", action="store_true",
                   help="then rewrite the DuckDB file so it shrinks (DuckDB reuses freed space but never gives it "
                        "back, VACUUM included); needs the file to itself")
    p.add_argument("--force", action="store_true",
                   help="remove runs kept evidence cites too (a memory's source, a snapshot a kept run loaded, "
                        "earlier turns of a kept thread); traces into them then say 'pruned'")


def setup_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="where to write <table>.parquet files")


def _memories_state(store: Any) -> Optional[tuple[Any, ...]]:
    """A fingerprint of the memories table (row count, hash of every row); None when it cannot be read."""
    try:
        return tuple(store.sql("SELECT count(*), bit_xor(hash(m)) FROM memories m").fetchall()[0])
    except TracememError:
        return None


def _changes_data(query: str) -> bool:
    """Whether the SQL holds a statement other than a query (DuckDB's parser says, not a text search)."""
    try:
        return any(s.type.name not in ("SELECT", "EXPLAIN") for s in duckdb.extract_statements(query))
    except duckdb.Error:
        return True


def cmd_sql(args: argparse.Namespace, out: Any) -> None:
    from ..store.read.user_sql import QueryTimeout, ReadOnlySQLError, interrupted

    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout takes a number of seconds > 0 (e.g. 60), got {args.timeout:g}")
    with open_store(args, write=args.write) as store:
        # DuckDB cannot name the tables of an UPDATE or DELETE before running it (get_table_names refuses
        # them), so a write is checked by what it did: the memories table before and after
        before = _memories_state(store) if args.write and _changes_data(args.query) else None
        try:
            rel = store.sql(args.query, timeout=args.timeout)
        except ReadOnlySQLError as err:
            raise TracememError(f"tracemem sql is read-only: {err.refused}. Use --write to change the store "
                                f"or run SQL with full access") from None
        if before is not None and _memories_state(store) != before:
            print("tracemem: warning: this SQL changed the memories table directly, so memory_events has no record "
                  "of the change (what, when, why); to keep the trail use `tracemem memory flag|forget|supersede` "
                  "or store.memory in Python", file=sys.stderr)
        if rel is None:
            print("ok", file=out)
            return
        try:  # DuckDB runs a query lazily: a conversion or runtime error surfaces here
            cols, rows = rel.columns, rel.fetchall()
        except duckdb.Error as err:
            if interrupted(err):
                raise QueryTimeout(args.timeout) from None
            raise TracememError(f"SQL error: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    if wants_json(args):
        print(to_json([dict(zip(cols, r)) for r in rows]), file=out)
    else:
        print(table(cols, rows), file=out)


def cmd_memories(args: argparse.Namespace, out: Any) -> None:
    where = [] if args.all else ["deleted_at IS NULL"]
    params: list[Any] = []
    if args.subject is not None and not args.subject.strip():
        raise TracememError("--subject is empty; name a subject (e.g. --subject ana), or leave --subject out "
                            "to list every subject")
    if args.subject:
        where.append("subject = ?")
        params.append(args.subject)
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    from ..store.read.own_sql import own_rows

    with open_store(args) as store:
        cols, rows = own_rows(store, "SELECT memory_id, subject, text, confidence, review_state, valid_from, "
                              f"valid_until, source_run_id, source_step, source_ref FROM memories {clause} "
                              "ORDER BY created_at", params)
    if wants_json(args):
        print(to_json([dict(zip(cols, r)) for r in rows]), file=out)
    else:
        print(table(cols, rows, width=48), file=out)


def _when(text: str) -> datetime:
    """A cut-off in UTC, as run times are stored (an ISO date without a zone is taken as UTC)."""
    try:
        days = float(text)
    except ValueError:
        days = None
    if days is not None:
        if not math.isfinite(days) or days < 0:
            raise UsageError(f"--older-than takes a finite number of days ≥ 0 (e.g. 30) or an ISO date, got {text!r}")
        try:
            return utc_now() - timedelta(days=days)
        except OverflowError:
            raise UsageError(f"--older-than {text} days reaches before year 1; give fewer days or an ISO date") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise TracememError(f"--older-than takes days (e.g. 30) or an ISO date, got {text!r}") from None
    return utc_naive(when)  # type: ignore[return-value]


def _count(text: str) -> int:
    """--keep-last: a whole number ≥ 0 (negative, fractional or infinite counts are refused)."""
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise UsageError(f"--keep-last takes a whole number ≥ 0 (the newest runs to keep), got {text!r}")
    return count


def cmd_prune(args: argparse.Namespace, out: Any) -> None:
    if args.older_than is None and args.keep_last is None:
        raise TracememError("prune needs --older-than DAYS|DATE and/or --keep-last N")
    if args.compact and is_url(db_path(args)):
        raise TracememError("--compact rewrites a DuckDB file; PostgreSQL reuses the space of pruned rows itself "
                            "(autovacuum), and an administrator's VACUUM FULL gives it back to the system")
    keep_last = None if args.keep_last is None else _count(args.keep_last)
    cutoff = _when(args.older_than) if args.older_than else None
    with open_store(args, write=True) as store:
        report = store.prune(older_than=cutoff, keep_last=keep_last, dry_run=args.dry_run, force=args.force,
                             progress=Progress("pruning"))
    sizes = _compact(args) if args.compact and not args.dry_run else None
    if wants_json(args):
        print(to_json({"runs": report.runs, "rows": report.rows, "kept_cited": report.kept_cited,
                       "kept_why": report.kept_why, "forced": report.forced, "dry_run": report.dry_run,
                       **({"bytes_before": sizes[0], "bytes_after": sizes[1]} if sizes else {})}), file=out)
    else:
        print(report, file=out)
        if sizes:
            print(f"compacted {db_path(args)}: {sizes[0] / 1e6:.1f} MB → {sizes[1] / 1e6:.1f} MB", file=out)


def _compact(args: argparse.Namespace) -> tuple[int, int]:
    from ..store.audit.compact import compact

    return compact(db_path(args))


def cmd_export(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        counts = store.export(args.directory, progress=Progress("exporting"))
    if wants_json(args):
        print(to_json(counts), file=out)
    else:
        print(table(["table", "rows"], sorted(counts.items())), file=out)
        print(f"wrote {len(counts)} Parquet files to {args.directory}", file=out)


COMMANDS: Commands = {
    "sql": ("run SQL over the store (read-only unless --write)", setup_sql, cmd_sql),
    "memories": ("list memory records", setup_memories, cmd_memories),
    "prune": ("delete old runs (never evidence kept runs cite, unless --force)", setup_prune, cmd_prune),
    "export": ("write every table to Parquet", setup_export, cmd_export),
}
