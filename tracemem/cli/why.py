"""`tracemem why RUN [PATH]`: the sources a value rests on, ranked, one line each; `--verify K` tests the top K.

The answer `tracemem backtrack` gives is the whole graph; this one names the causes (see
`tracemem.trace.ranked`). Verifying re-asks the answering model call, so it needs the model:
`--env MODULE:ATTR` names the env (its 'model' key, or its only model), as for `counterfactual`.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..trace.ranked import why
from .common import Commands, open_store, positive_int, resolve_run, wants_json
from .loading import load_env
from .render import to_json


def setup_why(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("path", nargs="?", default="answer", help="a scope path (default: answer)")
    p.add_argument("--limit", type=positive_int, default=8, metavar="N", help="show the top N sources (default 8)")
    p.add_argument("--verify", type=positive_int, default=0, metavar="K",
                   help="re-ask the answering model call without each of the top K sources (K model calls, each "
                        "recorded as a run of 'tracemem.why') and mark each decisive or not; needs --env")
    p.add_argument("--env", help="MODULE:ATTR of the env holding the model to re-ask (its 'model' key, or its only "
                                 "model): a dict, or a function returning one")


def cmd_why(args: argparse.Namespace, out: Any) -> None:
    env = load_env(args.env) if args.verify else None
    with open_store(args, write=bool(args.verify)) as store:  # each re-ask is recorded
        run_id = resolve_run(store, args.run)
        answer = why(store.run(run_id), args.path, limit=args.limit, verify=args.verify, env=env, store=store)
        answer.hint = f"--limit N; the whole graph: tracemem backtrack {run_id[:8]} {args.path}"
        if wants_json(args):
            print(to_json(answer.to_json()), file=out)
        else:
            print(answer, file=out)


COMMANDS: Commands = {"why": ("why a value is what it is: its sources, ranked (and verified with --verify K)",
                              setup_why, cmd_why)}
