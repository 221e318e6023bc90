"""Thread states: what `resume=<run id>` starts from.

A conversation served over HTTP continues each turn by run id. The store keeps the runs it
recorded last (store/write/listener.py `Recent`), whose final state is at hand; any other
run's state is replayed from the file once (its thread read in one go). Either way a new
run gets a copy it may change (`handout`).
"""
from __future__ import annotations

import copy
from typing import Any, NamedTuple, Optional

from ...dbmeta import first_row
from ...errors import RunNotFoundError, TracememError
from ...scope.known import known_scopes
from ...scope.replay import replay_thread
from .load import thread
from ..audit.retention import pruned_at


class Known(NamedTuple):
    """A run's final state, as replay gives it (JSON data; never changed once made)."""

    pipeline: str
    thread_id: Optional[str]
    schema: Any
    data: dict[str, Any]


def handout(known: Known) -> Any:
    """The state as a new run starts from it: the scope model (or data, when the model is unknown), sharing
    nothing mutable with the kept state that validation would pass through."""
    schema = known.schema
    if schema is None:
        return copy.deepcopy(known.data)
    data = {k: v if k not in schema.field_set or schema.rebuilt(k) else copy.deepcopy(v)
            for k, v in known.data.items()}
    return schema.rebuild(data)


def replayed(con: Any, run_id: str, path: str) -> Known:
    """A run's final state replayed from the file (its thread read in one go)."""
    head = first_row(con.execute("SELECT pipeline, pipeline_hash, thread_id FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise RunNotFoundError(f"no run '{run_id}' in {path}; list runs with `tracemem runs` or store.runs()")
    runs = thread(con, run_id)
    if not runs[0].first:
        raise TracememError(broken_thread(con, run_id, runs[0].run_id))
    schema = known_scopes.find(head[1], head[0])
    return Known(head[0], head[2], schema, replay_thread(runs, schema.default if schema else (lambda name: None)))


def broken_thread(con: Any, run_id: str, oldest: str) -> str:
    """Why a thread's state cannot be rebuilt: its oldest run here continues one that is gone."""
    row = first_row(con.execute("SELECT continues_run_id FROM runs WHERE run_id = ?", [oldest]))
    gone = row[0] if row else "?"
    when = pruned_at(con, gone)
    why = f"was pruned on {when:%Y-%m-%d %H:%M:%S} (prune(force=True))" if when else "is not in the store"
    return (f"run {run_id} cannot be replayed: its thread continues run {gone}, which {why}; the turns "
            f"before it are gone, so the thread's state is unknown")
