"""`tracemem memory flag|forget|supersede|history`: change a memory from the shell, with its trail.

Every change goes through the memory API (`store.memory.flag`, `forget`, `supersede`), so
`memory_events` records what changed, when and why, exactly as when a program does it;
`tracemem sql --write "UPDATE memories …"` would leave no such trail.
"""
from __future__ import annotations

import argparse
from typing import Any

from .common import Commands, common_options, open_store, wants_json
from .render import table, to_json


def setup_memory(p: argparse.ArgumentParser) -> None:
    common = common_options()
    sub = p.add_subparsers(dest="memory_command", required=True, metavar="ACTION")
    flag = sub.add_parser("flag", parents=[common], help="set a memory's review state (stale and contradicted "
                                                         "keep it out of recall), with the reason")
    flag.add_argument("memory_id", help="the memory to flag (an id as `tracemem memories` lists it)")
    # the memory API checks the state (importing tracemem.memory here would slow every command's start)
    flag.add_argument("state", help="the new review state: fresh, reviewed, stale or contradicted")
    flag.add_argument("--reason", required=True, help="why (kept in memory_events; required)")
    forget = sub.add_parser("forget", parents=[common], help="soft-delete a memory: it leaves every search and "
                                                             "listing but stays for audit")
    forget.add_argument("memory_id", help="the memory to forget")
    forget.add_argument("--reason", help="why (kept in memory_events)")
    supersede = sub.add_parser("supersede", parents=[common], help="mark OLD contradicted and linked to NEW, "
                                                                   "which replaces it (both kept)")
    supersede.add_argument("old_id", help="the memory that is out of date")
    supersede.add_argument("new_id", help="the memory that replaces it (same subject)")
    supersede.add_argument("--reason", help="why (kept in memory_events)")
    history = sub.add_parser("history", parents=[common], help="every change to a memory, oldest first")
    history.add_argument("memory_id", help="the memory whose events to list")
    for action in (flag, forget, supersede):
        action.add_argument("--run", metavar="RUN_ID", help="the run this change belongs to, if any "
                                                            "(kept in memory_events.run_id)")


def cmd_memory(args: argparse.Namespace, out: Any) -> None:
    action = args.memory_command
    if action == "history":
        _history(args, out)
        return
    with open_store(args, write=True) as store:
        memory = store.memory
        if action == "flag":
            record = memory.flag(args.memory_id, args.state, args.reason, run_id=args.run)
        elif action == "forget":
            record = memory.forget(args.memory_id, run_id=args.run, reason=args.reason)
        else:
            record = memory.supersede(args.old_id, args.new_id, run_id=args.run, reason=args.reason)
        events = memory.history(record.memory_id)
    if wants_json(args):
        print(to_json({"record": record.audit_view(), "event": events[-1].model_dump()}), file=out)
        return
    state = "forgotten" if record.forgotten else record.review_state
    link = f", superseded by {record.superseded_by}" if record.superseded_by else ""
    print(f"memory {record.memory_id} ({record.subject}) {record.text!r}: {state}{link}", file=out)
    print(f"logged in memory_events as '{events[-1].event}' (event {events[-1].event_id})", file=out)


def _history(args: argparse.Namespace, out: Any) -> None:
    with open_store(args) as store:
        events = store.memory.history(args.memory_id)
    if wants_json(args):
        print(to_json([e.model_dump() for e in events]), file=out)
        return
    print(table(["event_id", "event", "at", "run_id", "reason", "new"],
                [[e.event_id, e.event, e.at, e.run_id, e.reason, e.new] for e in events], width=60), file=out)


COMMANDS: Commands = {
    "memory": ("change a memory with its trail: flag, forget, supersede (and its history)", setup_memory,
               cmd_memory),
}
