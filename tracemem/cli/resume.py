"""`tracemem resume RUN` and `tracemem fork RUN STEP`: answer a paused run, or try another value from any step.

The store holds a run's record but not its code, so both take the flow with
`--flow MODULE:ATTR` (or `path/to/file.py:ATTR`), and, for stages that need clients
such as a model, `--env MODULE:ATTR` (a dict, or a function returning one).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import ResumeError, TracememError
from ..flow.interrupt import NO_ANSWER
from .common import Commands, db_path, open_store, resolve_run, wants_json
from .loading import load_env, load_flow
from .render import table, to_json


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flow", required=True, help="the flow that recorded the run: MODULE:ATTR or FILE.py:ATTR "
                                                 "(a Pipeline or a built Flow)")
    p.add_argument("--env", help="MODULE:ATTR of the env the stages need (a dict, or a function returning one)")
    p.add_argument("--replay", action="store_true",
                   help="answer model calls and side effects the run recorded from the record (an effect the record "
                        "lacks pauses the run)")
    p.add_argument("--live-effects", action="store_true",
                   help="make side effects (tool calls, effect stages) again for real instead of replaying them")


def setup_resume(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a paused (or interrupted) run id, or a unique prefix of one")
    p.add_argument("--answer", help="the answer, as JSON (e.g. '{\"approved\": true}' or '\"yes\"'); without one, a "
                                   "stage that asked asks again and a pause_before point lets its stage begin")
    p.add_argument("--by", help="who answers (recorded with the answer)")
    _common(p)


def setup_fork(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("step", help="the step to fork after: a number (0: from the start) or a stage id")
    p.add_argument("--set", action="append", default=[], metavar="PATH=JSON",
                   help="an edit applied before the fork continues, e.g. --set 'approved=false' (repeatable)")
    _common(p)


def _flow_and_env(args: argparse.Namespace) -> tuple[Any, Any]:
    return load_flow(args.flow, "--flow"), load_env(args.env)


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise TracememError(f"{what} must be JSON: {text!r} is not (a string needs quotes: '\"yes\"')") from None


def _writable(args: argparse.Namespace, run_ref: str) -> Any:
    """The store opened for writing; when another process holds it, say whether it holds this run."""
    from ..store import Store, StoreLockedError

    try:
        return open_store(args, write=True)
    except StoreLockedError as locked:
        path = db_path(args)
        with Store(path, read_only=True, snapshot_if_locked=True) as snap:
            rows = snap.sql("SELECT run_id, status, pid, host FROM runs WHERE starts_with(run_id, ?)",
                            [run_ref]).fetchall()
        if len(rows) == 1 and rows[0][1] == "running":
            run_id, _, pid, host = rows[0]
            raise ResumeError(f"run {run_id} cannot be resumed twice at once: process {pid} on {host} is running "
                              f"it (resuming it, or on its first go) and holds {path}; wait until it pauses or "
                              f"ends, then resume it again if it asks") from None
        raise locked


def _report(run: Any, out: Any, args: argparse.Namespace, extra: dict[str, Any]) -> None:
    output = json.loads(run.output.model_dump_json()) if hasattr(run.output, "model_dump_json") else run.output
    facts = {"run_id": run.run_id, "status": run.status, "error": run.error, "pending": run.pending, **extra,
             "steps": len(run.steps), "output": output}
    if wants_json(args):
        print(to_json(facts), file=out)
        return
    print(f"run {run.run_id}: {run.status}" + (f" ({run.error})" if run.error else ""), file=out)
    if run.status == "paused" and (run.resume_at or {}).get("kind") == "effect":
        print(f"  stopped before a side effect the record does not hold: {json.dumps(run.pending, default=str)}",
              file=out)
        print(f"  make it for real: tracemem resume {run.run_id} --flow {args.flow} --live-effects", file=out)
    elif run.status == "paused":
        print(f"  asks: {json.dumps(run.pending, default=str)}", file=out)
        print(f"  answer it: tracemem resume {run.run_id} --flow {args.flow} --answer JSON", file=out)
    for label, value in extra.items():
        if label != "changes":
            print(f"  {label}: {value}", file=out)
    if extra.get("changes"):
        print(table(["path", "this run", "original"], [[c["path"], c["ours"], c["theirs"]] for c in extra["changes"]],
                    width=50), file=out)


def cmd_resume(args: argparse.Namespace, out: Any) -> None:
    flow, env = _flow_and_env(args)
    answer = _json_arg(args.answer, "--answer") if args.answer is not None else NO_ANSWER
    with _writable(args, args.run) as store:
        run = flow.resume(resolve_run(store, args.run), answer, store=store, by=args.by, env=env,
                          replay=args.replay, raise_on_error=False, live_effects=args.live_effects)
        _report(run, out, args, {})


def cmd_fork(args: argparse.Namespace, out: Any) -> None:
    flow, env = _flow_and_env(args)
    edits = {}
    for item in args.set:
        path, sep, value = item.partition("=")
        if not sep or not path:
            raise TracememError(f"--set takes PATH=JSON (e.g. --set 'approved=false'), got {item!r}")
        edits[path.strip()] = _json_arg(value, f"--set {path}")
    step: Any = int(args.step) if args.step.lstrip("-").isdigit() else args.step
    with _writable(args, args.run) as store:
        source = store.run(resolve_run(store, args.run))
        run = flow.fork(source, step, edits=edits, store=store, env=env, replay=args.replay, raise_on_error=False,
                        live_effects=args.live_effects)
        changes = [{"path": c.path, "ours": c.ours, "theirs": c.theirs} for c in run.diff(source)]
        _report(run, out, args, {"forked from": f"run {source.run_id} after step {run.forked_from_step}",
                                 "changes": changes})


COMMANDS: Commands = {
    "resume": ("answer a paused run (or continue an interrupted one): RUN --flow F --answer JSON",
               setup_resume, cmd_resume),
    "fork": ("start a new run from a recorded step, with edits: RUN STEP --flow F --set PATH=JSON",
             setup_fork, cmd_fork),
}
