"""`tracemem mark`, `affected`, `blame` and `counterfactual`: judge answers, find what wrong answers rest on,
and test one source causally."""
from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from .common import Commands, open_store, positive_int, resolve_run, wants_json
from .loading import load_env, load_flow
from .render import table, to_json


def setup_mark(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("verdict", choices=["wrong", "right", "score"], help="the judgement")
    p.add_argument("--path", default="answer", help="the judged value's scope path (default: answer)")
    p.add_argument("--score", type=float, help="with verdict 'score': a grade from 0 to 1")
    p.add_argument("--note", help="why (kept with the judgement)")
    p.add_argument("--by", help="who judged")


def setup_affected(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a memory id or run id, or kind:id — memory:, run:, section:KIND:ID, model:, "
                                  "stage:STAGE@HASH, tool:, pipeline:HASH")


def setup_blame(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", default="answer", help="rank over judgements of this value (default: answer)")
    p.add_argument("--pipeline", help="only runs of this pipeline")
    p.add_argument("--subject", help="only runs for this subject")
    p.add_argument("--limit", type=positive_int, default=20, help="how many sources to show (default 20)")
    p.add_argument("--verify", type=positive_int, metavar="K", help="also test: re-ask each of the latest 20 wrong "
                   "answers' answering model call without its top K sources (K model calls each, recorded) and rank "
                   "the sources that decided more of them first; needs --env")
    p.add_argument("--env", help="with --verify: MODULE:ATTR of the env holding the model (its 'model' key, or its "
                                 "only model)")


def setup_counterfactual(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("path", help="the value to re-ask, e.g. answer")
    p.add_argument("--without", required=True, help="what to leave out: a memory id, run:ID (a past run loaded as a "
                                                    "snapshot) or section:KIND:ID")
    p.add_argument("--flow", required=True, help="the flow that recorded the run: MODULE:ATTR or FILE.py:ATTR")
    p.add_argument("--env", help="MODULE:ATTR of the env the stages need (a dict, or a function returning one); "
                                 "a changed model call goes to its model")
    p.add_argument("--live-effects", action="store_true", help="make side effects (tool calls, effect stages) "
                   "again for real; by default they are replayed from the record and never repeated")


def cmd_mark(args: argparse.Namespace, out: Any) -> None:
    with open_store(args, write=True) as store:
        item = store.feedback(resolve_run(store, args.run), args.verdict, path=args.path, score=args.score,
                              note=args.note, by=args.by)
    if wants_json(args):
        print(to_json(asdict(item)), file=out)
    else:
        print(f"marked run {item.run_id} {item.path} {item.verdict}"
              + (f" ({item.score:g})" if item.verdict == "score" else ""), file=out)


def cmd_affected(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        report = store.affected(args.source)
    if wants_json(args):
        print(to_json({"source": str(report.source), "runs": [asdict(r) for r in report.runs.values()],
                       "memories": report.memories}), file=out)
    elif not report.runs:
        print(report, file=out)
    else:
        print(f"{len(report.runs)} run(s) depended on {report.source} (from the recorded reads, writes and "
              f"provenance)", file=out)
        print(table(["run_id", "values", "how the source reached it"],
                    [[r.run_id, ", ".join(r.paths), r.via] for r in report.runs.values()], width=60), file=out)
        if report.memories:
            print("memories learned from them: " + ", ".join(report.memories), file=out)


def cmd_blame(args: argparse.Namespace, out: Any) -> None:
    where = {k: v for k, v in (("pipeline", args.pipeline), ("subject", args.subject)) if v}
    verify = {"verify": args.verify, "env": load_env(args.env)} if args.verify else {}
    with open_store(args, write=bool(args.verify)) as store:  # each re-ask is recorded
        report = store.blame(path=args.path, where=where, limit=args.limit, **verify)
    if wants_json(args):
        print(to_json({"wrong": report.wrong, "right": report.right, "basis": report.basis,
                       "ranked": [asdict(b) for b in report.ranked]}), file=out)
        return
    print(f"{report.basis}", file=out)
    print(f"over {report.wrong} run(s) judged wrong and {report.right} judged right", file=out)
    decided = ["decided"] if report.verified else []
    print(table(decided + ["ochiai", "wrong with", "right with", "wrong without", "source"],
                [([b.decided if b.decided is not None else "-"] if report.verified else [])
                 + [b.score, b.wrong_with, b.right_with, b.wrong_without, f"{b.kind}:{b.id}"] for b in report.ranked],
                width=60), file=out)


def cmd_counterfactual(args: argparse.Namespace, out: Any) -> None:
    flow, env = load_flow(args.flow, "--flow"), load_env(args.env)
    with open_store(args, write=True) as store:  # the re-execution is recorded, as a fork
        trace = store.backtrack(resolve_run(store, args.run), args.path)
        result = trace.counterfactual(args.without, flow=flow, env=env, store=store, live_effects=args.live_effects)
    if wants_json(args):
        print(to_json(asdict(result)), file=out)
    else:
        print(result, file=out)


COMMANDS: Commands = {
    "mark": ("judge a run's value: wrong, right or a score", setup_mark, cmd_mark),
    "affected": ("every run and value that depended on a source", setup_affected, cmd_affected),
    "blame": ("rank sources by how strongly they go with wrong answers (statistical)", setup_blame, cmd_blame),
    "counterfactual": ("would a value change without a source? re-executes the run without it (causal)",
                       setup_counterfactual, cmd_counterfactual),
}
