"""One memory written by many processes: keeping the in-process index in step, and the last check.

On DuckDB one process writes the file, so the index it keeps is the truth. On PostgreSQL any
number of processes remember, flag, forget and purge in the same tables, so:

- before each search, `catch_up` reads the `memory_events` rows after the last one this
  process has seen (the store's SQL object guarantees ids become visible in order) and, for
  every memory they name, replaces what the index holds with the stored record as it is now,
  or drops it when it is forgotten or purged. A memory remembered by another process is
  therefore found by this one's very next search;
- after ranking, `stale` re-reads the state of every record recall is about to inject, in
  SQL, and names those that another process flagged, forgot, purged, or otherwise took out
  of recall since the catch-up, so a stale index can never inject one.

Both run under the memory's lock and are no-ops for a store whose SQL is not SHARED.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

import numpy as np

from .index import VectorIndex
from .records import FLAGGED_STATES
from .search import Exclusion, SearchResult
from .tables import MEMORY_COLUMNS

__all__ = ["catch_up", "stale", "without"]

_DELETED = MEMORY_COLUMNS.index("deleted_at")
_SUBJECT = MEMORY_COLUMNS.index("subject")
_TAGS = MEMORY_COLUMNS.index("tags")


def catch_up(index: VectorIndex, ops: Any, con: Any, seen: int) -> int:
    """Apply every memory change after event `seen` to `index`; returns the newest event id applied."""
    newest, ids = ops.events_after(con, seen)
    if not ids:
        return seen
    current = ops.current(con, ids)
    for memory_id in ids:
        found = current.get(memory_id)
        if found is not None and _holds(index, found[0]):
            continue  # this process made the change itself: the index has it already
        for shard in index.shards.values():
            shard.retire(memory_id)
        if found is None:
            continue  # purged
        rec, vec = found
        if rec[_DELETED] is not None:
            continue  # forgotten
        vecs = None
        if index.dim is not None and vec is not None and len(vec) == index.dim:
            vecs = np.asarray(vec, dtype=np.float32).reshape(1, -1)
        elif index.dim is not None:
            vecs = np.zeros((1, index.dim), dtype=np.float32)  # stored without a vector: literal match only
        index.add_many([rec], vecs)
    return newest


def _holds(index: VectorIndex, rec: tuple[Any, ...]) -> bool:
    """Whether the index holds exactly this stored record (tags compared as tuples)."""
    shard = index.shards.get(rec[_SUBJECT])
    row = shard.row_of.get(rec[0]) if shard is not None else None
    held = shard.rows[row] if shard is not None and row is not None else None
    if held is None:
        return False
    return all((tuple(a) if i == _TAGS else a) == (tuple(b) if i == _TAGS else b)
               for i, (a, b) in enumerate(zip(held, rec)))


def stale(ops: Any, con: Any, ids: Sequence[str], now: datetime, floor: float) -> dict[str, str]:
    """Of the records recall would inject, those that may not be injected now, and why."""
    if not ids:
        return {}
    states = ops.states(con, ids)
    out: dict[str, str] = {}
    for memory_id in ids:
        state = states.get(memory_id)
        if state is None:
            out[memory_id] = "purged"
            continue
        review, confidence, valid_from, valid_until, deleted_at = state
        if deleted_at is not None:
            out[memory_id] = "forgotten"
        elif review in FLAGGED_STATES:
            out[memory_id] = "flagged"
        elif confidence < floor:
            out[memory_id] = "below_floor"
        elif (valid_from is not None and valid_from > now) or (valid_until is not None and valid_until <= now):
            out[memory_id] = "out_of_window"
    return out


def without(result: SearchResult, gone: dict[str, str]) -> SearchResult:
    """`result` less the records `stale` named: flagged, under the floor or out of window are counted as
    recall's exclusions; forgotten and purged ones are simply gone."""
    counts = {"flagged": result.excluded_flagged, "below_floor": result.excluded_below_floor,
              "out_of_window": result.excluded_out_of_window}
    excluded = list(result.excluded)
    for memory_id, why in gone.items():
        if why in counts:
            counts[why] += 1
            excluded.append(Exclusion(memory_id=memory_id, reason=why,  # type: ignore[arg-type]
                                      detail=f"{why} by another process just now (checked in SQL before injecting)"))
    return result.model_copy(update=dict(
        records=[r for r in result.records if r.memory_id not in gone], excluded=excluded,
        excluded_flagged=counts["flagged"], excluded_below_floor=counts["below_floor"],
        excluded_out_of_window=counts["out_of_window"]))
