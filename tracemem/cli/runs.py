"""`tracemem runs` and `tracemem show RUN`: what ran, and one run in full."""
from __future__ import annotations

import argparse
import json
from typing import Any

from .common import Commands, open_store, positive_int, resolve_run, wants_json
from .details import calls_text, logs_text, prompts_text, run_json, summary_line
from .render import table, to_json

CUT = 200  # characters of each final scope value `show` prints unless --full


def setup_runs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pipeline", help="only runs of this pipeline")
    p.add_argument("--status", help="only runs with this status (ok, failed, paused, interrupted, running)")
    p.add_argument("--subject", help="only runs for this subject")
    p.add_argument("--kind", choices=("run", "fork", "replay", "counterfactual"),
                   help="only runs of this kind (--status paused lists the runs waiting for a person: no "
                        "counterfactuals unless --kind counterfactual)")
    p.add_argument("--limit", type=positive_int, default=20, help="how many runs, newest first (default 20)")


def setup_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("--calls", action="store_true",
                   help="also print every model call: model, tokens, duration, error and the whole reply")
    p.add_argument("--prompts", action="store_true",
                   help="also print every assembled prompt, section by section, each with its source")
    p.add_argument("--logs", action="store_true", help="also print every step's log lines")
    p.add_argument("--full", action="store_true",
                   help=f"all of --calls, --prompts and --logs, and final scope values uncut "
                        f"(otherwise cut at {CUT} characters)")


def cmd_runs(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        rows = store.runs(pipeline=args.pipeline, status=args.status, subject=args.subject, limit=args.limit,
                          kind=args.kind)
    if wants_json(args):
        print(to_json(rows), file=out)
        return
    for r in rows:  # a fork names where it came from
        r["kind"] = r["kind"] if r["kind"] == "run" else f"{r['kind']} of {r['forked_from_run_id'][:8]}@{r['forked_from_step']}"
    cols = ["run_id", "pipeline", "kind", "status", "started_at", "duration_ms", "steps", "subject", "error",
            "degraded"]
    if any(r.get("pending") is not None for r in rows):  # paused runs: what each asks
        cols.append("pending")
    print(table(cols, [[r[c] for c in cols] for r in rows], width=50), file=out)


def cmd_show(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        run = store.run(resolve_run(store, args.run))
        final = run.state_at()
        data = json.loads(final.model_dump_json()) if hasattr(final, "model_dump_json") else final
        requests = store.requests(run) if args.full or args.calls or wants_json(args) else {}
        if wants_json(args):
            print(to_json(run_json(run, json.loads(run.output_json or "null"), data, requests)), file=out)
            return
    duration = (run.ended_at - run.started_at) / 1e6 if run.ended_at else None
    print(f"run {run.run_id}  pipeline {run.pipeline} ({run.pipeline_hash})  status {run.status}", file=out)
    for label, value in (("error", run.error), ("degraded", run.degraded), ("subject", run.subject),
                         ("trace id", run.trace_id), ("parent run", run.parent_run_id),
                         ("continues run", run.continues), ("asks", json.dumps(run.pending) if run.status == "paused" else None),
                         ("forked from", run.forked_from_run_id and
                          f"run {run.forked_from_run_id} after step {run.forked_from_step} (a {run.kind})"),
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
                    width=10**6 if args.full else 90), file=out)
    effects = run.rows.get("effects", [])
    if effects:  # each side effect a step made, and whether it was made here or answered from the record
        stages = {s.step: s.stage for s in run.steps}
        print("\nside effects (live: made by this run; replayed: answered from the record, not made again)", file=out)
        print(table(["step", "stage", "kind", "name", "mode", "made in", "idempotency key"],
                    [[e["step"], stages.get(e["step"]), e["kind"], e["name"], e["mode"],
                      "here" if e.get("source_run_id") == run.run_id else
                      f"{str(e.get('source_run_id'))[:8]}@{e.get('source_step')}", e.get("idempotency_key")]
                     for e in effects]), file=out)
    for flag, title, text in (("calls", "model calls", lambda r: calls_text(r, requests)),
                              ("prompts", "prompts", prompts_text), ("logs", "step logs", logs_text)):
        if args.full or getattr(args, flag):
            print(f"\n{title}", file=out)
            print(text(run), file=out)
    print("\nfinal scope", file=out)
    for key, value in data.items():
        shown = json.dumps(value, default=str)
        if not args.full and len(shown) > CUT:
            shown = f"{shown[:CUT]}… (--full shows all {len(shown)} characters)"
        print(f"  {key}: {shown}", file=out)
    more = summary_line(run)
    if more and not (args.full or args.calls or args.prompts or args.logs):
        print(f"\n{more}", file=out)


COMMANDS: Commands = {
    "runs": ("list runs, newest first", setup_runs, cmd_runs),
    "show": ("one run: steps, decisions, output (--calls, --prompts, --logs, --full for the rest)", setup_show,
             cmd_show),
}
