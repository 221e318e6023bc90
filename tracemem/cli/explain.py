"""`tracemem backtrack RUN PATH`: why a value is what it is."""
from __future__ import annotations

import argparse
from typing import Any

from ..trace.trace import KINDS
from .common import Commands, open_store, positive_int, resolve_run, wants_json
from .render import table, to_json

MORE = "raise --max-lines, or narrow with --only KIND or --focus NODE"


def setup_backtrack(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id or a unique prefix of one")
    p.add_argument("path", help="a scope path, e.g. answer or messages[3].content")
    p.add_argument("--mermaid", action="store_true", help="print the trace as a Mermaid flowchart")
    p.add_argument("--only", metavar="KIND",
                   help=f"keep only the chains to nodes of this kind ({', '.join(KINDS)})")
    p.add_argument("--focus", metavar="NODE",
                   help="keep only the chains to one node: its short id as the trace prints it (e.g. n7), "
                        "a memory id (m_…) or a node id from --json")
    p.add_argument("--beyond", type=int, default=3, metavar="N",
                   help="with --only or --focus: also show N levels behind the nodes kept (default 3)")
    p.add_argument("--depth", type=positive_int, metavar="N", help="show at most N levels below the value")
    p.add_argument("--max-lines", type=positive_int, default=60, metavar="N",
                   help="print at most N lines of the trace (default 60)")
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
        narrow = args.only is not None or args.focus is not None
        if narrow and (wants_json(args) or args.mermaid):
            trace = trace.narrowed(only=args.only, focus=args.focus, beyond=args.beyond)
        if wants_json(args):
            print(to_json(trace.to_json()), file=out)
        elif args.mermaid:
            print(trace.to_mermaid(), file=out)
        else:
            print(trace.explain(max_lines=args.max_lines, only=args.only, focus=args.focus, beyond=args.beyond,
                                depth=args.depth, hint=MORE), file=out)


COMMANDS: Commands = {"backtrack": ("why a value is what it is", setup_backtrack, cmd_backtrack)}
