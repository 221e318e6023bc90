"""The content-keyed tables (`messages`, `message_chains`, `tool_sets`): which rows the recorded calls still name.

Their rows are shared: a message recorded by a thread's first turn is named by every later turn's
calls (tracemem/exchange.py). So they are not deleted with a run, as run tables are: after a prune
removes runs, `sweep` removes the content no remaining model call reaches (through its chains, its
reply, its tools), and `copy` brings along exactly the content the copied calls reach. Reaching is
a walk over every link in Python, one pass over the table: chains are as deep as threads are long,
which a recursive query would walk one join per message.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["TABLES", "Reached", "reached", "sweep", "missing_in", "copy_content"]

TABLES = (("message_chains", "chain_id"), ("messages", "message_id"), ("tool_sets", "tools_id"))


class Reached:
    """The content ids some calls reach: chains, messages, tool sets."""

    def __init__(self) -> None:
        self.ids: dict[str, set[str]] = {table: set() for table, _ in TABLES}


def reached(con: Any, calls_where: str, params: list[Any]) -> Reached:
    """The content the `model_calls` rows matching `calls_where` reach."""
    out = Reached()
    heads = con.execute(f"SELECT system_id, input_id, output_id, tools_id FROM model_calls WHERE {calls_where}",
                        params).fetchall()
    if not heads:
        return out
    links = {chain: (parent, message) for chain, parent, message in
             con.execute("SELECT chain_id, parent_id, message_id FROM message_chains").fetchall()}
    chains, messages = out.ids["message_chains"], out.ids["messages"]
    for system_id, input_id, output_id, tools_id in heads:
        for at in (system_id, input_id):
            while at is not None and at not in chains and at in links:
                chains.add(at)
                parent, message = links[at]
                messages.add(message)
                at = parent
        if output_id:
            messages.add(output_id)
        if tools_id:
            out.ids["tool_sets"].add(tools_id)
    return out


def sweep(con: Any, kept_calls_where: str, params: list[Any], dry_run: bool) -> dict[str, int]:
    """Remove (or, `dry_run`, count) the content rows no kept call reaches; rows per table."""
    keep = reached(con, kept_calls_where, params)
    counts: dict[str, int] = {}
    for table, key in TABLES:
        have = [r[0] for r in con.execute(f"SELECT DISTINCT {key} FROM {table}").fetchall()]
        dead = [k for k in have if k not in keep.ids[table]]
        counts[table] = len(dead)
        if dead and not dry_run:
            con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT unnest(?::VARCHAR[]))", [dead])
    return counts


def missing_in(con: Any, wanted: Reached) -> Reached:
    """Of `wanted`, the ids `con`'s store does not hold yet (what a copy must bring)."""
    out = Reached()
    for table, key in TABLES:
        ids = sorted(wanted.ids[table])
        if not ids:
            continue
        have = {r[0] for r in con.execute(f"SELECT {key} FROM {table} WHERE {key} IN (SELECT unnest(?::VARCHAR[]))",
                                          [ids]).fetchall()}
        out.ids[table] = set(ids) - have
    return out


def copy_content(src_con: Any, dst_con: Any, run_ids: list[str], copy_rows: Callable[[str, str, list[str]], int],
         progress: Optional[Callable[[], None]] = None) -> dict[str, int]:
    """Copy the content the calls of `run_ids` reach from one store to another (what it lacks); rows per table.
    `copy_rows(table, where, ids)` copies the rows of `table` matching `where` for the given ids."""
    if not run_ids:
        return {table: 0 for table, _ in TABLES}
    todo = missing_in(dst_con, reached(src_con, "run_id IN (SELECT unnest(?::VARCHAR[]))", [run_ids]))
    counts = {}
    for table, key in TABLES:
        ids = sorted(todo.ids[table])
        counts[table] = copy_rows(table, f"{key} IN (SELECT unnest(?::VARCHAR[]))", ids) if ids else 0
        if progress:
            progress()
    return counts
