"""`tracemem backtrack RUN PATH`: why a value is what it is."""
from __future__ import annotations

import argparse
from typing import Any

from .common import Commands, open_store, resolve_run, wants_json
from .render import table, to_json


def setup_backtrack(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("path", help="a scope path, e.g. answer or messages[3].content")
    p.add_argument("--mermaid", action="store_true", help="print the trace as a Mermaid flowchart")
    p.add_argument("--only", help="keep only chains to nodes of this kind (memory, model_call, run, decision)")
    p.add_argument("--influence", action="store_true",
                   help="rank the final prompt's sections by overlap with the answer (correlational)")


def cmd_backtrack(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        trace = store.run(resolve_run(store, args.run)).backtrack(args.path)
        if args.influence:
            ranked = trace.influence()
            if wants_json(args):
                print(to_json(ranked), file=out)
            elif not ranked:
                print(f"{args.path}: no model call with prompt sections on this trace", file=out)
            else:
                print("prompt sections ranked by overlap with the answer (correlational, not causal)", file=out)
                print(table(["score", "lexical", "embedding", "section", "memory", "text"],
                            [[r["score"], r["lexical"], r["embedding"], r["section"], r["memory_id"], r["text"]]
                             for r in ranked], width=60), file=out)
            return
        if args.only and (wants_json(args) or args.mermaid):
            trace = trace.narrowed(only=args.only)
        if wants_json(args):
            print(to_json(trace.to_json()), file=out)
        elif args.mermaid:
            print(trace.to_mermaid(), file=out)
        else:
            print(trace.explain(only=args.only), file=out)


COMMANDS: Commands = {"backtrack": ("why a value is what it is", setup_backtrack, cmd_backtrack)}
