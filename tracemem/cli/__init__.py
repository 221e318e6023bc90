"""The `tracemem` command: look at a store from the shell.

    tracemem runs | show RUN | backtrack RUN PATH | sql "QUERY" | memories | prune | export DIR
    tracemem graph MODULE:ATTR

The installed `tracemem` command is `stages.cli:main`, which adds `demo` (it is built
from the ready-made stages, which the engine never imports) through `extra=`.

Every command takes `--db PATH` (default ./tracemem.duckdb or $TRACEMEM_DB) and
`--json`. Errors are one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

import duckdb

from ..errors import TracememError
from ..times import utc_naive, utc_now
from .render import Progress, Visible, table, to_json, visible

__all__ = ["build_parser", "main"]


def _parent() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="store file (default: $TRACEMEM_DB or ./tracemem.duckdb)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output (JSON; NaN and Infinity, which JSON lacks, become null)")
    return common


Setup = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace, Any], None]
Extra = Mapping[str, tuple[str, Setup, Run]]  # name → (help, add its arguments, run it)


def build_parser(extra: Optional[Extra] = None) -> argparse.ArgumentParser:
    common = _parent()
    ap = argparse.ArgumentParser(prog="tracemem", description=__doc__.splitlines()[0], parents=[common])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("runs", parents=[common], help="list runs, newest first")
    p.add_argument("--pipeline")
    p.add_argument("--status")
    p.add_argument("--subject")
    p.add_argument("--limit", type=int, default=20)
    p = sub.add_parser("show", parents=[common], help="one run: steps, decisions, output")
    p.add_argument("run")
    p = sub.add_parser("backtrack", parents=[common], help="why a value is what it is")
    p.add_argument("run")
    p.add_argument("path")
    p.add_argument("--mermaid", action="store_true")
    p.add_argument("--only", help="keep only chains to nodes of this kind (memory, model_call, run, decision)")
    p.add_argument("--influence", action="store_true",
                   help="rank the final prompt's sections by overlap with the answer (correlational)")
    p = sub.add_parser("sql", parents=[common], help="run SQL over the store (read-only unless --write)")
    p.add_argument("query")
    p.add_argument("--write", action="store_true")
    p = sub.add_parser("memories", parents=[common], help="list memory records")
    p.add_argument("--subject")
    p.add_argument("--all", action="store_true", help="include forgotten records")
    p = sub.add_parser("prune", parents=[common], help="delete old runs (never what memories cite)")
    p.add_argument("--older-than", help="days (e.g. 30) or an ISO date (UTC, as run times are stored)")
    p.add_argument("--keep-last", type=int)
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("export", parents=[common], help="write every table to Parquet")
    p.add_argument("directory")
    p = sub.add_parser("graph", parents=[common], help="Mermaid of a flow: MODULE:ATTR")
    p.add_argument("target")
    for name, (help_text, setup, _) in (extra or {}).items():
        setup(sub.add_parser(name, parents=[common], help=help_text))
    return ap


def db_path(args: argparse.Namespace) -> str:
    """The store file a command works on: --db, else $TRACEMEM_DB, else ./tracemem.duckdb."""
    return getattr(args, "db", None) or os.environ.get("TRACEMEM_DB") or "tracemem.duckdb"


def _open(args: argparse.Namespace, write: bool = False) -> Any:
    from ..store import Store

    path = db_path(args)
    if path != ":memory:" and not os.path.exists(path):  # never create a store from a mistyped --db
        raise TracememError(f"no tracemem store at {path}; run a flow with Store('{path}') first, or pass --db PATH")
    store = Store(path, read_only=not write, snapshot_if_locked=not write)
    if store.snapshot_of:
        print(f"note: {store.snapshot_note}", file=sys.stderr)
    return store


def resolve_run(store: Any, ref: str) -> str:
    """A full run id from a unique prefix (people copy the first 8 characters)."""
    rows = store.sql("SELECT run_id FROM runs WHERE starts_with(run_id, ?) LIMIT 3", [ref]).fetchall()
    if not rows:
        raise TracememError(f"no run '{ref}' in {store.path}; list them with `tracemem runs`")
    if len(rows) > 1:
        raise TracememError(f"run prefix '{ref}' is ambiguous ({', '.join(r[0] for r in rows)}…); give more characters")
    return rows[0][0]


def cmd_runs(args: argparse.Namespace, out: Any) -> None:
    with _open(args) as store:
        rows = store.runs(pipeline=args.pipeline, status=args.status, subject=args.subject, limit=args.limit)
    if _json(args):
        print(to_json(rows), file=out)
        return
    cols = ["run_id", "pipeline", "status", "started_at", "duration_ms", "steps", "subject", "error"]
    print(table(cols, [[r[c] for c in cols] for r in rows], width=50), file=out)


def cmd_show(args: argparse.Namespace, out: Any) -> None:
    with _open(args) as store:
        run = store.run(resolve_run(store, args.run))
        if _json(args):
            print(to_json({
                "run_id": run.run_id, "pipeline": run.pipeline, "status": run.status, "error": run.error,
                "subject": run.subject, "trace_id": run.trace_id, "parent_run_id": run.parent_run_id,
                "continues": run.continues, "steps": [s._asdict() for s in run.steps],
                "decisions": [d._asdict() for d in run.decisions], "output": json.loads(run.output_json or "null"),
                "final_state": run.state_at() if run.schema is None else json.loads(run.output.model_dump_json()),
            }), file=out)
            return
        duration = (run.ended_at - run.started_at) / 1e6 if run.ended_at else None
        print(f"run {run.run_id}  pipeline {run.pipeline} ({run.pipeline_hash})  status {run.status}", file=out)
        for label, value in (("error", run.error), ("subject", run.subject), ("trace id", run.trace_id),
                             ("parent run", run.parent_run_id), ("continues run", run.continues),
                             ("duration", f"{duration:.2f} ms" if duration is not None else None)):
            if value:
                print(f"  {label}: {value}", file=out)
        print("\nsteps", file=out)
        print(table(["step", "stage", "kind", "iter", "status", "ms", "routed_by", "error"],
                    [[s.step, s.stage, s.kind, s.iteration, s.status, round((s.ended_at - s.started_at) / 1e6, 3),
                      s.routed_by, s.error] for s in run.steps]), file=out)
        if run.decisions:
            print("\ndecisions", file=out)
            print(table(["step", "chosen", "evidence"], [[d.step, d.chosen, d.evidence] for d in run.decisions],
                        width=90), file=out)
        print("\nfinal scope", file=out)
        final = run.state_at()
        data = json.loads(final.model_dump_json()) if hasattr(final, "model_dump_json") else final
        for key, value in data.items():
            print(f"  {key}: {json.dumps(value, default=str)[:200]}", file=out)


def cmd_backtrack(args: argparse.Namespace, out: Any) -> None:
    with _open(args) as store:
        trace = store.run(resolve_run(store, args.run)).backtrack(args.path)
        if args.influence:
            ranked = trace.influence()
            if _json(args):
                print(to_json(ranked), file=out)
            elif not ranked:
                print(f"{args.path}: no model call with prompt sections on this trace", file=out)
            else:
                print("prompt sections ranked by overlap with the answer (correlational, not causal)", file=out)
                print(table(["score", "lexical", "embedding", "section", "memory", "text"],
                            [[r["score"], r["lexical"], r["embedding"], r["section"], r["memory_id"], r["text"]]
                             for r in ranked], width=60), file=out)
            return
        if args.only and (_json(args) or args.mermaid):
            trace = trace.narrowed(only=args.only)
        if _json(args):
            print(to_json(trace.to_json()), file=out)
        elif args.mermaid:
            print(trace.to_mermaid(), file=out)
        else:
            print(trace.explain(only=args.only), file=out)


def cmd_sql(args: argparse.Namespace, out: Any) -> None:
    from ..store.user_sql import ReadOnlySQLError

    with _open(args, write=args.write) as store:
        try:
            rel = store.sql(args.query)
        except ReadOnlySQLError as err:
            raise TracememError(f"tracemem sql is read-only: {err.refused}. Use --write to change the store "
                                f"or run SQL with full access") from None
        if rel is None:
            print("ok", file=out)
            return
        cols, rows = rel.columns, rel.fetchall()
    if _json(args):
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
    with _open(args) as store:
        rel = store.sql("SELECT memory_id, subject, text, confidence, review_state, valid_from, valid_until, "
                        f"source_run_id, source_step, source_ref FROM memories {clause} ORDER BY created_at", params)
        cols, rows = rel.columns, rel.fetchall()
    if _json(args):
        print(to_json([dict(zip(cols, r)) for r in rows]), file=out)
    else:
        print(table(cols, rows, width=48), file=out)


def _when(text: str) -> datetime:
    """A cut-off in UTC, as run times are stored (an ISO date without a zone is taken as UTC)."""
    try:
        return utc_now() - timedelta(days=float(text))
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise TracememError(f"--older-than takes days (e.g. 30) or an ISO date, got {text!r}") from None
        return utc_naive(when)  # type: ignore[return-value]


def cmd_prune(args: argparse.Namespace, out: Any) -> None:
    if args.older_than is None and args.keep_last is None:
        raise TracememError("prune needs --older-than DAYS|DATE and/or --keep-last N")
    with _open(args, write=True) as store:
        report = store.prune(older_than=_when(args.older_than) if args.older_than else None,
                             keep_last=args.keep_last, dry_run=args.dry_run, progress=Progress("pruning"))
    if _json(args):
        print(to_json({"runs": report.runs, "rows": report.rows, "kept_cited": report.kept_cited,
                       "dry_run": report.dry_run}), file=out)
    else:
        print(report, file=out)


def cmd_export(args: argparse.Namespace, out: Any) -> None:
    with _open(args) as store:
        counts = store.export(args.directory, progress=Progress("exporting"))
    if _json(args):
        print(to_json(counts), file=out)
    else:
        print(table(["table", "rows"], sorted(counts.items())), file=out)
        print(f"wrote {len(counts)} Parquet files to {args.directory}", file=out)


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
    if _json(args):
        print(to_json(flow.to_spec()), file=out)
    else:
        print(flow.to_mermaid(), file=out)


def _json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


COMMANDS = {"runs": cmd_runs, "show": cmd_show, "backtrack": cmd_backtrack, "sql": cmd_sql,
            "memories": cmd_memories, "prune": cmd_prune, "export": cmd_export, "graph": cmd_graph}


def main(argv: Optional[Sequence[str]] = None, out: Any = None, extra: Optional[Extra] = None) -> int:
    """Run one command; `extra` adds commands defined outside the engine (e.g. `demo`)."""
    args = build_parser(extra).parse_args(argv)
    out = Visible(out or sys.stdout)  # stored text never drives the terminal (render.visible)
    commands = {**COMMANDS, **{name: run for name, (_, _, run) in (extra or {}).items()}}
    try:
        commands[args.command](args, out)
    except (TracememError, duckdb.Error, OSError, ValueError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"tracemem: error: {visible(message)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
