"""Copying history between stores: a DuckDB file and PostgreSQL, either way (`tracemem copy`).

A team analyses a fleet's history in a local DuckDB file, or promotes a prototype's file into
the fleet database. Rows keep their ids, so every link between them — a memory's source run
and step, a snapshot's source run, a thread's previous run, a subflow's parent — still points
at the same thing, and cross-run backtracking works in the copy as in the original.

What is copied: the runs chosen (all, or those since a time and/or of one pipeline) and every
run they reach through those links (so nothing a backtrack walks into is left behind), with
all their rows; the memories those runs used or produced (every memory when nothing is
filtered), with their whole history. Runs and memories the destination already holds are
skipped, so copying again adds only what is new. Memory events get the destination's own
event ids, in the source's order (they are a per-store sequence).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa

from ..errors import UsageError
from ..memory.tables import MEMORY_COLUMNS, META_DIM, META_EMBEDDER_ID
from ..times import utc_naive
from .audit.contents import copy_content
from .tables import RUN_TABLES

__all__ = ["CopyReport", "copy_history"]

_LINKS = """SELECT continues_run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))
        AND continues_run_id IS NOT NULL
    UNION SELECT parent_run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[])) AND parent_run_id IS NOT NULL
    UNION SELECT run_id FROM runs WHERE parent_run_id IN (SELECT unnest(?::VARCHAR[]))
    UNION SELECT source_run_id FROM snapshot_uses WHERE run_id IN (SELECT unnest(?::VARCHAR[]))
    UNION SELECT m.source_run_id FROM memories m JOIN memory_uses u USING (memory_id)
        WHERE u.run_id IN (SELECT unnest(?::VARCHAR[])) AND m.source_run_id IS NOT NULL"""


@dataclass
class CopyReport:
    """What `copy_history` copied (rows per table) and what the destination already had."""

    runs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    memories: int = 0
    memory_events: int = 0
    skipped_runs: int = 0
    skipped_memories: int = 0
    escaped: dict[str, list[str]] = field(default_factory=dict)  # run id -> values the destination could not
    #                                                              hold as they were, escaped (also in runs.notes)

    def __str__(self) -> str:
        detail = ", ".join(f"{n} {t}" for t, n in self.rows.items() if n)
        skipped = f"; skipped {self.skipped_runs} run(s) and {self.skipped_memories} memory(ies) already there" \
            if self.skipped_runs or self.skipped_memories else ""
        escaped = f"; in {len(self.escaped)} run(s) text the destination cannot hold was escaped (see their " \
            f"runs.notes)" if self.escaped else ""
        return (f"copied {self.runs} run(s)" + (f" ({detail})" if detail else "") +
                f", {self.memories} memory(ies) with {self.memory_events} event(s){skipped}{escaped}")


def _ids(store: Any, query: str, params: list[Any]) -> list[str]:
    with store.lock:
        return [r[0] for r in store.backend.con.execute(query, params).fetchall()]


def _chosen(src: Any, since: Optional[datetime], pipeline: Optional[str]) -> list[str]:
    """The runs asked for, and every run they link to (threads, subflows, snapshots, memory sources)."""
    where, params = ["parent_run_id IS NULL"], []
    if since is not None:
        where.append("started_at >= ?")
        params.append(utc_naive(since))
    if pipeline is not None:
        where.append("pipeline = ?")
        params.append(pipeline)
    chosen = set(_ids(src, f"SELECT run_id FROM runs WHERE {' AND '.join(where)}", params))
    todo = sorted(chosen)
    while todo:
        found = set(_ids(src, _LINKS, [todo] * 5)) - chosen
        chosen |= found
        todo = sorted(found)
    return sorted(chosen)


def _columns(store: Any, table: str) -> list[str]:
    with store.lock:
        return [c for (c,) in store.backend.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = "
            + ("current_schema()" if store.backend.kind == "postgres" else "'main'") + " ORDER BY ordinal_position",
            [table]).fetchall()]


def _plain(table: pa.Table) -> pa.Table:
    """Extension columns (DuckDB's JSON) as their storage type, so any backend can take them."""
    cols = [c.cast(c.type.storage_type) if isinstance(c.type, pa.ExtensionType) else c for c in table.columns]
    return pa.Table.from_arrays(cols, names=table.column_names)


def _copy_rows(src: Any, dst: Any, table: str, where: str, ids: list[str], report: CopyReport) -> int:
    # columns both sides have (PostgreSQL's own lease and run_embeddings.seq stay behind; seq is the
    # destination's to number)
    shared = [c for c in _columns(src, table) if c in set(_columns(dst, table))
              and (table, c) not in (("run_embeddings", "seq"), ("runs", "lease"))]
    cols = ", ".join(f'"{c}"' for c in shared)
    copied = 0
    for batch in src.backend.read(f"SELECT {cols} FROM {table} WHERE {where}", [ids]):
        if batch.num_rows:
            for run_id, notes in dst.backend.append(table, _plain(pa.Table.from_batches([batch]))).items():
                report.escaped.setdefault(run_id, []).extend(notes)
            copied += batch.num_rows
    return copied


def _bind_embedder(src: Any, dst: Any) -> None:
    """The destination's memory must use the source's embedder (vectors of two embedders do not compare)."""
    get = src.memory.sql.get_meta
    with src.lock:
        theirs, dim = get(src.backend.con, META_EMBEDDER_ID), get(src.backend.con, META_DIM)
    ours = dst.memory.sql.get_meta(dst.backend.con, META_EMBEDDER_ID)
    if theirs is None:
        return
    if ours is not None and ours != theirs:
        raise UsageError(f"{src.path}'s memories were embedded with {theirs!r} but {dst.path}'s with {ours!r}; "
                         f"vectors of two embedders do not compare: copy into an empty store, or re-embed one "
                         f"side first (store.memory.reembed)")
    dst.memory.sql.set_meta(dst.backend.con, META_EMBEDDER_ID, theirs)
    if dim is not None:
        dst.memory.sql.set_meta(dst.backend.con, META_DIM, dim)


def _copy_memories(src: Any, dst: Any, ids: list[str], everything: bool, report: CopyReport) -> None:
    if everything:
        wanted = _ids(src, "SELECT memory_id FROM memories ORDER BY memory_id", [])
    else:
        wanted = _ids(src, """SELECT memory_id FROM memory_uses WHERE run_id IN (SELECT unnest(?::VARCHAR[]))
            UNION SELECT source_id FROM prompt_sections WHERE source_kind = 'memory'
                AND run_id IN (SELECT unnest(?::VARCHAR[]))
            UNION SELECT memory_id FROM memories WHERE source_run_id IN (SELECT unnest(?::VARCHAR[]))""", [ids] * 3)
    have = set(_ids(dst, "SELECT memory_id FROM memories WHERE memory_id IN (SELECT unnest(?::VARCHAR[]))", [wanted]))
    report.skipped_memories = len(have & set(wanted))
    todo = sorted(set(wanted) - have)
    if not todo:
        return
    _bind_embedder(src, dst)
    with src.lock:
        rows = src.backend.con.execute(f"SELECT {', '.join(MEMORY_COLUMNS)}, embedding FROM memories WHERE "
                                       f"memory_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY created_at, memory_id",
                                       [todo]).fetchall()
        events = src.backend.con.execute('SELECT memory_id, event, old, new, run_id, "at", reason FROM '
                                         'memory_events WHERE memory_id IN (SELECT unnest(?::VARCHAR[])) '
                                         'ORDER BY event_id', [todo]).fetchall()
    ops, con = dst.memory.sql, dst.backend.con
    with dst.lock, ops.transaction(con):
        for has_vector in (True, False):
            part = [r for r in rows if (r[-1] is not None) == has_vector]
            if part:
                vecs = np.asarray([r[-1] for r in part], dtype=np.float32) if has_vector else None
                ops.insert_records(con, [tuple(r[:-1]) for r in part], vecs,
                                   vecs.shape[1] if vecs is not None else None)
        ops.insert_events(con, [(m, e, json.loads(o) if o else None, json.loads(n) if n else None, r, at, why)
                            for m, e, o, n, r, at, why in events])
    report.memories, report.memory_events = len(rows), len(events)
    dst.memory.rebuild_index()


def copy_history(src: Any, dst: Any, *, since: Optional[datetime] = None, pipeline: Optional[str] = None,
                 progress: Optional[Callable[[int, int], None]] = None) -> CopyReport:
    """Copy runs (all, or `since` / of `pipeline`, with every run they link to) and their memories from
    store `src` into store `dst`, keeping ids; see the module docstring."""
    if src.backend.kind == dst.backend.kind and src.path == dst.path:
        raise UsageError(f"copy needs two different stores; both are {src.path}")
    dst.flush()
    report = CopyReport()
    ids = _chosen(src, since, pipeline)
    have = set(_ids(dst, "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [ids]))
    report.skipped_runs = len(have)
    todo = [r for r in ids if r not in have]
    report.runs = len(todo)
    tables = [t for t in RUN_TABLES if t != "step_journal"]
    with dst.backend.write_lock, dst.backend.transaction():  # all of it, or none of it
        for i, table in enumerate(tables):
            if table == "prompt_sections":
                where = "prompt_id IN (SELECT prompt_id FROM prompts WHERE run_id IN (SELECT unnest(?::VARCHAR[])))"
            else:
                where = "run_id IN (SELECT unnest(?::VARCHAR[]))"
            report.rows[table] = _copy_rows(src, dst, table, where, todo, report) if todo else 0
            if progress:
                progress(i + 1, len(tables) + 1)
        if "message_chains" in src.tables() and "message_chains" in dst.tables():  # what the calls name
            report.rows.update(copy_content(src.backend.con, dst.backend.con, todo,
                                            lambda table, where, ids: _copy_rows(src, dst, table, where, ids, report)))
    _copy_memories(src, dst, todo, since is None and pipeline is None, report)
    dst.snapshots.reset()
    if progress:
        progress(len(tables) + 1, len(tables) + 1)
    return report
